//! Flag names as the reference reads them: its flag set (component-base's `flag.InitFlags`, which installs
//! `WordSepNormalizeFunc`) treats `_` in a flag's name as `-`, so deployments written for it may say
//! `--machine_drain_timeout=5m`. The command line is rewritten before clap parses it.

use std::ffi::OsString;

/// `--a_b` and `--a_b=value` become `--a-b` and `--a-b=value`. Values, short flags, positional arguments and
/// everything after a bare `--` stay as they are.
pub(crate) fn normalize(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut after_separator = false;
    args.into_iter()
        .map(|arg| {
            if after_separator {
                return arg;
            }
            let Some(text) = arg.to_str() else {
                return arg;
            };
            if text == "--" {
                after_separator = true;
                return arg;
            }
            let Some(flag) = text.strip_prefix("--") else {
                return arg;
            };
            let (name, value) = flag.split_once('=').map_or((flag, None), |(n, v)| (n, Some(v)));
            if !name.contains('_') {
                return arg;
            }
            let name = name.replace('_', "-");
            OsString::from(match value {
                Some(value) => format!("--{name}={value}"),
                None => format!("--{name}"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalized(args: &[&str]) -> Vec<String> {
        normalize(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn underscores_in_flag_names_become_dashes_and_nothing_else_changes() {
        assert_eq!(
            normalized(&[
                "mcm",
                "run",
                "--machine_drain_timeout=5m",
                "--safety_up",
                "2",
                "--namespace=shoot_ns",
                "--node-conditions=Ready_X",
                "-v",
                "file_name",
                "--",
                "--not_a_flag",
            ]),
            [
                "mcm",
                "run",
                "--machine-drain-timeout=5m",
                "--safety-up",
                "2",
                "--namespace=shoot_ns",
                "--node-conditions=Ready_X",
                "-v",
                "file_name",
                "--",
                "--not_a_flag",
            ]
        );
    }

    #[test]
    fn the_normalized_spelling_parses_as_the_dashed_one() {
        use clap::Parser as _;
        let dashed = crate::Cli::try_parse_from(normalize(
            ["mcm", "run", "--provider", "sim", "--machine-drain-timeout=7m"].map(OsString::from),
        ))
        .unwrap();
        let underscored = crate::Cli::try_parse_from(normalize(
            ["mcm", "run", "--provider", "sim", "--machine_drain_timeout=7m"].map(OsString::from),
        ))
        .unwrap();
        assert_eq!(format!("{dashed:?}"), format!("{underscored:?}"));
        assert!(format!("{underscored:?}").contains("420s"), "{underscored:?}");
    }
}
