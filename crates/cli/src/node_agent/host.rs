//! What the agent reports of its host: memory, architecture and OS as Go names them, kernel, OS image and boot id.

/// The host's memory from /proc/meminfo (`MemTotal: <n> kB`), as `<n>Ki`.
pub(super) fn host_memory() -> Option<String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(format!("{kib}Ki"))
}

/// `std::env::consts::ARCH` as Go (and so Kubernetes: `kubernetes.io/arch`, `nodeInfo.architecture`) names it.
pub(super) fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        other => other,
    }
}

/// `std::env::consts::OS` as Go names it.
pub(super) fn go_os() -> &'static str {
    match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    }
}

pub(super) fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `PRETTY_NAME` of /etc/os-release.
pub(super) fn os_image() -> String {
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    release
        .lines()
        .find_map(|line| line.strip_prefix("PRETTY_NAME="))
        .map_or_else(
            || "Linux".to_owned(),
            |value| value.trim().trim_matches('"').to_owned(),
        )
}
