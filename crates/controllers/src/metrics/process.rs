//! The `process_*` families every Prometheus-instrumented process has (client_golang's process collector, under its
//! names and help texts), read from `/proc` at each scrape with the `procfs` crate. Off Linux, or when `/proc`
//! cannot be read, a family is left out of that scrape rather than reported wrong.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// Reads the process's figures at scrape time.
#[derive(Debug, Default)]
pub(super) struct ProcessCollector;

/// One figure: its name (without `_total`, which the encoder appends to counters), help, and value.
enum Figure {
    Counter(&'static str, &'static str, f64),
    Gauge(&'static str, &'static str, f64),
}

#[allow(clippy::cast_precision_loss)] // byte and tick counts far below 2^53
fn figures() -> Vec<Figure> {
    let mut figures = Vec::with_capacity(9);
    let Ok(me) = procfs::process::Process::myself() else {
        return figures;
    };
    if let Ok(stat) = me.stat() {
        let ticks = procfs::ticks_per_second() as f64;
        figures.push(Figure::Counter(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            (stat.utime + stat.stime) as f64 / ticks,
        ));
        figures.push(Figure::Gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            stat.vsize as f64,
        ));
        figures.push(Figure::Gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            (stat.rss * procfs::page_size()) as f64,
        ));
        if let Ok(boot) = procfs::boot_time_secs() {
            figures.push(Figure::Gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                boot as f64 + stat.starttime as f64 / ticks,
            ));
        }
    }
    if let Ok(open) = me.fd_count() {
        figures.push(Figure::Gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            open as f64,
        ));
    }
    if let Ok(limits) = me.limits() {
        // Unlimited reads as the largest value, as client_golang reports it.
        let value = |limit: procfs::process::LimitValue| match limit {
            procfs::process::LimitValue::Value(v) => v as f64,
            procfs::process::LimitValue::Unlimited => u64::MAX as f64,
        };
        figures.push(Figure::Gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            value(limits.max_open_files.soft_limit),
        ));
        figures.push(Figure::Gauge(
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            value(limits.max_address_space.soft_limit),
        ));
    }
    if let Some((received, sent)) = network_octets() {
        figures.push(Figure::Counter(
            "process_network_receive_bytes",
            "Number of bytes received by the process over the network.",
            received,
        ));
        figures.push(Figure::Counter(
            "process_network_transmit_bytes",
            "Number of bytes sent by the process over the network.",
            sent,
        ));
    }
    figures
}

/// `IpExt` `InOctets` and `OutOctets` of `/proc/self/net/netstat` (the network namespace's, as client_golang reads
/// them).
#[allow(clippy::cast_precision_loss)]
fn network_octets() -> Option<(f64, f64)> {
    let text = std::fs::read_to_string("/proc/self/net/netstat").ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("IpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let value_of = |wanted: &str| {
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(name, _)| *name == wanted)
            .and_then(|(_, value)| value.parse::<u64>().ok())
    };
    Some((value_of("InOctets")? as f64, value_of("OutOctets")? as f64))
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for figure in figures() {
            match figure {
                Figure::Counter(name, help, value) => {
                    let counter = ConstCounter::new(value);
                    let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
                    counter.encode(metric)?;
                }
                Figure::Gauge(name, help, value) => {
                    let gauge = ConstGauge::new(value);
                    let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
                    gauge.encode(metric)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_figures_are_read_from_proc() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(super::ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let value = |name: &str| -> f64 {
            let prefix = format!("{name} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("{name}\n{text}"))
                .parse()
                .unwrap()
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // This test process: started before now, with stdin/stdout/stderr open, some memory, a limit on files.
        let started = value("process_start_time_seconds");
        assert!(started > 1.0e9 && started <= now + 1.0, "{text}");
        assert!(value("process_open_fds") >= 3.0, "{text}");
        assert!(value("process_max_fds") >= value("process_open_fds"), "{text}");
        assert!(value("process_resident_memory_bytes") > 0.0, "{text}");
        assert!(
            value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"),
            "{text}"
        );
        assert!(value("process_virtual_memory_max_bytes") > 0.0, "{text}");
        assert!(value("process_cpu_seconds_total") >= 0.0, "{text}");
        assert!(value("process_network_receive_bytes_total") >= 0.0, "{text}");
        assert!(text.contains("# TYPE process_cpu_seconds counter"), "{text}");
    }
}
