//! The logging flags of the reference that have no meaning here: component-base's `logs.AddFlags` gives the
//! reference's binaries `--vmodule` and `--log-flush-frequency` beside `--v` (which works here: [`crate::level_of`]).
//! Deployments pass them, so they are accepted, checked as the reference checks them, and warned about when set.

use std::time::Duration;

use clap::Args;

/// klog's flags accepted for compatibility.
#[derive(Clone, Debug, Default, Args)]
pub(crate) struct KlogFlags {
    /// klog's per-file verbosity (`pattern=N,...`), accepted for compatibility with the reference; no effect: use
    /// RUST_LOG with module paths instead (e.g. `RUST_LOG=info,mcm_controllers::machine=debug`).
    #[arg(long, global = true, value_name = "PATTERN=N,...", value_parser = parse_vmodule)]
    vmodule: Option<String>,
    /// The longest time between log flushes (the reference's default 5s), accepted for compatibility; no effect:
    /// every line is written at once.
    #[arg(long, global = true, value_name = "DURATION", value_parser = crate::parse_duration)]
    log_flush_frequency: Option<Duration>,
}

/// klog's check of `--vmodule`: a comma-separated list of `pattern=N`, N a non-negative integer.
fn parse_vmodule(text: &str) -> Result<String, String> {
    let syntax = "syntax error: expect comma-separated list of filename=N";
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (pattern, level) = part.split_once('=').ok_or(syntax)?;
        if pattern.is_empty() || level.parse::<u32>().is_err() {
            return Err(syntax.into());
        }
    }
    Ok(text.to_owned())
}

impl KlogFlags {
    /// The flags set, each with why it has no effect.
    pub(crate) fn ignored(&self) -> Vec<(&'static str, &'static str)> {
        let mut ignored = Vec::new();
        if self.vmodule.as_deref().is_some_and(|v| !v.is_empty()) {
            ignored.push((
                "--vmodule",
                "Go source files have no counterpart here; RUST_LOG takes module paths (RUST_LOG=info,mcm_controllers=debug)",
            ));
        }
        if self.log_flush_frequency.is_some() {
            ignored.push((
                "--log-flush-frequency",
                "every log line is written at once, unbuffered",
            ));
        }
        ignored
    }

    /// Warns about [`Self::ignored`] flags once logging is up.
    pub(crate) fn warn_ignored(&self) {
        crate::run::warn_without_effect(&self.ignored());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmodule_takes_klogs_syntax_and_both_flags_are_reported_as_without_effect() {
        assert!(parse_vmodule("machine*=4,safety=2").is_ok());
        assert!(parse_vmodule("").is_ok());
        for bad in ["machine", "=3", "machine=high"] {
            assert_eq!(
                parse_vmodule(bad).unwrap_err(),
                "syntax error: expect comma-separated list of filename=N",
                "{bad}"
            );
        }
        let flags = KlogFlags {
            vmodule: Some("machine*=4".into()),
            log_flush_frequency: Some(Duration::from_secs(5)),
        };
        let names: Vec<&str> = flags.ignored().into_iter().map(|(flag, _)| flag).collect();
        assert_eq!(names, ["--vmodule", "--log-flush-frequency"]);
        assert!(KlogFlags::default().ignored().is_empty());
    }
}
