//! The reference's start-up validation of the controller flags (`MCMServer.Validate` of machine-controller-manager
//! and `MCServer.Validate` of the provider's machine-controller), with its messages, so that a deployment the
//! reference refuses is refused here the same way: every problem found, one message for one, `[a, b]` for several
//! (as `utilerrors.NewAggregate` prints them), and exit code 1. Values clap cannot parse (a negative duration, a word
//! for a number) are refused by clap before this, naming the flag, with exit code 2, as pflag does.

use std::fmt;

use crate::run::ControllerFlags;

/// What `--target-kubeconfig` says when there is no target cluster.
const TARGET_NONE: &str = "none";

/// The value of `--kube-api-qps`: requests per second, or `unlimited` (ours: the reference has no way to turn the
/// client-side limit off, and refuses 0 and below).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Qps {
    /// At most this many requests per second on average.
    PerSecond(f32),
    /// No client-side limit (benchmarks; an embedded server that limits nothing either).
    Unlimited,
}

impl fmt::Display for Qps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PerSecond(qps) => write!(f, "{qps}"),
            Self::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// Parses `--kube-api-qps`: a number, or `unlimited`.
pub(crate) fn parse_qps(text: &str) -> Result<Qps, String> {
    if text == "unlimited" {
        return Ok(Qps::Unlimited);
    }
    text.parse::<f32>()
        .map(Qps::PerSecond)
        .map_err(|_| format!("{text:?} is neither a number of requests per second nor `unlimited`"))
}

/// Go's `mime.ParseMediaType` on the media type part (`type/subtype`, parameters after `;` not checked): the
/// error it gives, if any.
fn media_type_error(text: &str) -> Option<&'static str> {
    let media = text.split(';').next().unwrap_or_default().trim();
    let is_token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?=".contains(&b))
    };
    let Some((kind, subtype)) = media.split_once('/') else {
        return Some(if media.is_empty() {
            "mime: no media type"
        } else {
            "mime: expected slash after first token"
        });
    };
    if !is_token(kind) {
        return Some("mime: no media type");
    }
    (!is_token(subtype)).then_some("mime: expected token after slash")
}

/// Every problem the reference's validation finds in `flags` (and, for `mcm run`, in the kubeconfig flags).
pub(crate) fn problems(
    flags: &ControllerFlags,
    kubeconfigs: Option<(Option<&str>, Option<&str>)>,
) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(syncs) = flags.concurrent_syncs
        && syncs <= 0
    {
        found.push(format!(
            "concurrent syncs should be greater than zero: got: {syncs}"
        ));
    }
    if !flags.profiling && flags.contention_profiling {
        found.push("contention-profiling cannot be enabled without enabling profiling".into());
    }
    if let Some(error) = media_type_error(&flags.kube_api_content_type) {
        found.push(format!("kube api content type cannot be parsed: {error}"));
    }
    if let Qps::PerSecond(qps) = flags.kube_api_qps
        && (qps.is_nan() || qps <= 0.0)
    {
        found.push(format!("kube api qps should be greater than zero: got: {qps:.6}"));
    }
    if flags.kube_api_burst < 0 {
        found.push(format!(
            "kube api burst should not be a negative value: got: {}",
            flags.kube_api_burst
        ));
    }
    if flags.safety_up < 0 {
        found.push(format!(
            "safety up should be a non negative value: got: {}",
            flags.safety_up
        ));
    }
    if flags.safety_down < 0 {
        found.push(format!(
            "safety down should be a non negative value: got: {}",
            flags.safety_down
        ));
    }
    if flags.machine_max_evict_retries < 0 {
        found.push(format!(
            "max evict retries should not be a negative value: got {}",
            flags.machine_max_evict_retries
        ));
    }
    if flags.machine_safety_apiserver_statuscheck_period < flags.machine_safety_apiserver_statuscheck_timeout
    {
        found.push(
            "machine safety APIServer status check period should not be less than APIServer status check timeout"
                .into(),
        );
    }
    if let Some((control, target)) = kubeconfigs
        && control.unwrap_or_default().is_empty()
        && target == Some(TARGET_NONE)
    {
        found.push(format!(
            "--control-kubeconfig cannot be empty if --target-kubeconfig={TARGET_NONE} is specified"
        ));
    }
    found
}

/// The problems as the reference prints them (`utilerrors.NewAggregate`): `Ok` when there are none.
pub(crate) fn check(
    flags: &ControllerFlags,
    kubeconfigs: Option<(Option<&str>, Option<&str>)>,
) -> anyhow::Result<()> {
    match problems(flags, kubeconfigs).as_slice() {
        [] => Ok(()),
        [one] => anyhow::bail!("{one}"),
        many => anyhow::bail!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        flags: ControllerFlags,
    }

    fn flags(args: &[&str]) -> ControllerFlags {
        Flags::try_parse_from(std::iter::once("mcm").chain(args.iter().copied()))
            .expect("the flags parse")
            .flags
    }

    #[test]
    fn the_defaults_pass() {
        assert_eq!(
            problems(&flags(&[]), Some((Some("k"), None))),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_reference_check_gives_the_reference_message() {
        let cases: [(&[&str], &str); 9] = [
            (
                &["--concurrent-syncs=0"],
                "concurrent syncs should be greater than zero: got: 0",
            ),
            (
                &["--contention-profiling"],
                "contention-profiling cannot be enabled without enabling profiling",
            ),
            (
                &["--kube-api-content-type="],
                "kube api content type cannot be parsed: mime: no media type",
            ),
            (
                &["--kube-api-content-type=json"],
                "kube api content type cannot be parsed: mime: expected slash after first token",
            ),
            (
                &["--kube-api-qps=0"],
                "kube api qps should be greater than zero: got: 0.000000",
            ),
            (
                &["--kube-api-burst=-1"],
                "kube api burst should not be a negative value: got: -1",
            ),
            (
                &["--safety-up=-2"],
                "safety up should be a non negative value: got: -2",
            ),
            (
                &["--machine-max-evict-retries=-1"],
                "max evict retries should not be a negative value: got -1",
            ),
            (
                &[
                    "--machine-safety-apiserver-statuscheck-period=10s",
                    "--machine-safety-apiserver-statuscheck-timeout=30s",
                ],
                "machine safety APIServer status check period should not be less than APIServer status check timeout",
            ),
        ];
        for (args, message) in cases {
            assert_eq!(problems(&flags(args), None), [message], "{args:?}");
        }
        assert!(problems(&flags(&["--profiling", "--contention-profiling"]), None).is_empty());
        assert!(problems(&flags(&["--kube-api-qps=unlimited"]), None).is_empty());
        assert!(
            problems(
                &flags(&["--kube-api-content-type=application/json; charset=utf-8"]),
                None
            )
            .is_empty()
        );
    }

    #[test]
    fn no_target_needs_a_control_kubeconfig_and_several_problems_print_as_a_list() {
        assert_eq!(
            problems(&flags(&[]), Some((None, Some("none")))),
            ["--control-kubeconfig cannot be empty if --target-kubeconfig=none is specified"]
        );
        let error = check(&flags(&["--concurrent-syncs=0", "--safety-down=-1"]), None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "[concurrent syncs should be greater than zero: got: 0, safety down should be a non negative value: got: -1]"
        );
    }

    #[test]
    fn qps_is_a_number_or_unlimited() {
        assert_eq!(parse_qps("2.5"), Ok(Qps::PerSecond(2.5)));
        assert_eq!(parse_qps("unlimited"), Ok(Qps::Unlimited));
        assert!(parse_qps("fast").unwrap_err().contains("unlimited"));
    }
}
