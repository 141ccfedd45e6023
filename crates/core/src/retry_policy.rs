//! What to do after a provider call failed, by method and machine code (the spec's "Auto Retry Required" column).
//!
//! - Codes marked **Y** for the method are transient: the call is retried with per-machine exponential back-off with
//!   jitter ([`backoff`]).
//! - Codes marked **N**, and codes the method's table does not list, need a change by someone (provider spec,
//!   credentials, quota): the error is recorded and the machine waits for a change of itself, its class or its
//!   secret, with only a slow safety resync ([`RetryDecision::AwaitChange`]).
//!
//! The reference retries on fixed periods instead (5s for a short list of codes, 10m for `ResourceExhausted`, 3m for
//! everything else; reference §2, issue #483). The tables themselves are `mcm_driver::retry`'s.
//!
//! The functions are pure: the attempt count is kept by the caller (per machine), and jitter comes from a random
//! number the caller draws.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{DriverMethod, MachineCode, retry};

use crate::timeouts;

/// Settings of the retry policy.
#[derive(Clone, Debug, PartialEq)]
pub struct RetrySettings {
    /// Delay before the first retry of a transient failure (5s, the reference's ShortRetry).
    pub backoff_base: Duration,
    /// The delay never exceeds this (5m).
    pub backoff_cap: Duration,
    /// Share of the delay taken off at random, in `[0, 0.5]` (0.5: the delay lies in `[d/2, d]`). Values outside
    /// are clamped; 0.5 at most keeps the delays of successive attempts from overlapping.
    pub jitter: f64,
    /// Safety resync while waiting for a change after a non-retryable failure (10m, the reference's LongRetry).
    pub await_change_resync: Duration,
    /// The same for `ResourceExhausted` (quota, capacity), which often clears without a change of ours:
    /// `--resource-exhausted-retry` (10m, as the reference).
    pub resource_exhausted_retry: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            backoff_base: Duration::from_secs(5),
            backoff_cap: Duration::from_mins(5),
            jitter: 0.5,
            await_change_resync: Duration::from_mins(10),
            resource_exhausted_retry: Duration::from_mins(10),
        }
    }
}

/// The retry class of a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryClass {
    /// "Auto Retry Required" Y: transient, retried with back-off.
    Auto,
    /// "Auto Retry Required" N, or not listed: retried when the machine, its class or its secret changes.
    AwaitChange,
}

/// The class of `code` returned by `method`, from the spec's tables.
///
/// One addition to the tables: `InitializeMachine` errors its table does not list (`Unavailable`,
/// `DeadlineExceeded`, `Unknown`: what our own gRPC client reports when the provider is unreachable or a call hits
/// `--provider-call-timeout`, and any other code) are retried with back-off, as the reference retries every
/// initialization error. Waiting for a change would leave a machine whose VM runs uninitialized for the safety
/// resync, and the creation timeout would then replace a healthy machine after a short provider outage.
pub fn retry_class(method: DriverMethod, code: MachineCode) -> RetryClass {
    let unlisted_initialization_error =
        method == DriverMethod::InitializeMachine && retry::rule_for(method, code).is_none();
    if retry::auto_retry(method, code) || unlisted_initialization_error {
        RetryClass::Auto
    } else {
        RetryClass::AwaitChange
    }
}

/// What the controller does after a failed provider call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum RetryDecision {
    /// Transient: call again after this delay.
    Retry {
        /// The back-off delay.
        after: Duration,
    },
    /// Not transient: do not call again until the machine, its class or its secret changes; look again after
    /// `resync_after` anyway, in case a change was missed.
    AwaitChange {
        /// The safety resync.
        resync_after: Duration,
    },
}

impl RetryDecision {
    /// When the machine is to be looked at again at the latest.
    pub fn requeue_after(&self) -> Duration {
        match *self {
            Self::Retry { after } => after,
            Self::AwaitChange { resync_after } => resync_after,
        }
    }
}

/// Decides the retry of a failed call.
///
/// `failures` counts the consecutive failures of this machine's calls including this one (the first failure is 1;
/// 0 is read as 1); the caller resets it on success or on a change of the machine, class or secret. `random` is a
/// number in `[0, 1)` the caller draws per decision (anything else is clamped into that range).
pub fn decide(
    method: DriverMethod,
    code: MachineCode,
    failures: u32,
    random: f64,
    settings: &RetrySettings,
) -> RetryDecision {
    match retry_class(method, code) {
        RetryClass::Auto => RetryDecision::Retry {
            after: backoff(failures, random, settings),
        },
        RetryClass::AwaitChange if code == MachineCode::ResourceExhausted => RetryDecision::AwaitChange {
            resync_after: settings.resource_exhausted_retry,
        },
        RetryClass::AwaitChange => RetryDecision::AwaitChange {
            resync_after: settings.await_change_resync,
        },
    }
}

/// The back-off delay after `failures` consecutive failures: `base · 2^(failures−1)`, capped at `backoff_cap`, minus
/// a random share of at most `jitter` of it.
///
/// Properties (tested): never above the cap; at least `(1 − jitter)` of the un-jittered delay; for the same random
/// number, never shorter than after fewer failures; and, while the doubled delay stays below the cap, never shorter
/// than after fewer failures whatever the random numbers.
pub fn backoff(failures: u32, random: f64, settings: &RetrySettings) -> Duration {
    let exponent = failures.saturating_sub(1).min(63);
    let factor = 1u64 << exponent;
    let full = u32::try_from(factor)
        .ok()
        .and_then(|factor| settings.backoff_base.checked_mul(factor))
        .map_or(settings.backoff_cap, |d| d.min(settings.backoff_cap));
    let jitter = if settings.jitter.is_nan() {
        0.0
    } else {
        settings.jitter.clamp(0.0, 0.5)
    };
    let random = if random.is_nan() {
        0.0
    } else {
        random.clamp(0.0, 1.0)
    };
    // share ∈ [0, 0.5], so the product is finite and never above `full`.
    let share = jitter * random;
    let taken = Duration::try_from_secs_f64(full.as_secs_f64() * share)
        .unwrap_or(Duration::ZERO)
        // Exact bound against float rounding: the delay never drops below half the un-jittered delay.
        .min(full / 2);
    full.saturating_sub(taken)
}

/// When the controller may call the provider again for a machine after a failure (kept per machine in memory).
///
/// Reconciles happen for many reasons (the controller's own status write among them); the gate keeps them from
/// calling the provider before the back-off is over, or, after a non-retryable failure, before the machine, its
/// class or its secret changed ([`fingerprint`]) or the safety resync is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryGate {
    /// No call before this instant (unless the fingerprint changed).
    pub not_before: Timestamp,
    /// The fingerprint of the machine, class and secret when the call failed.
    pub fingerprint: String,
}

impl RetryGate {
    /// The gate after `decision`, taken at `now` with the inputs' `fingerprint`.
    pub fn new(decision: RetryDecision, now: Timestamp, fingerprint: impl Into<String>) -> Self {
        Self {
            not_before: timeouts::add(now, decision.requeue_after()),
            fingerprint: fingerprint.into(),
        }
    }

    /// Whether a provider call may be made now: the delay is over, or the inputs changed.
    pub fn is_open(&self, now: Timestamp, fingerprint: &str) -> bool {
        now >= self.not_before || fingerprint != self.fingerprint
    }
}

/// What identifies a version of a machine's inputs: the machine's generation (its spec; status writes do not
/// count), and the resource versions of its class and secrets.
pub fn fingerprint(machine: &Machine, class: Option<&MachineClass>, secrets: &[&Secret]) -> String {
    let mut out = format!(
        "machine={};class={}",
        machine.metadata.generation.unwrap_or_default(),
        class
            .and_then(|c| c.metadata.resource_version.as_deref())
            .unwrap_or("-")
    );
    for secret in secrets {
        out.push_str(";secret=");
        out.push_str(secret.metadata.resource_version.as_deref().unwrap_or("-"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn transient_codes_back_off_and_configuration_codes_wait_for_a_change() {
        let settings = RetrySettings::default();
        assert_eq!(
            decide(
                DriverMethod::CreateMachine,
                MachineCode::Unavailable,
                1,
                0.0,
                &settings
            ),
            RetryDecision::Retry {
                after: Duration::from_secs(5)
            }
        );
        assert_eq!(
            decide(
                DriverMethod::CreateMachine,
                MachineCode::Unavailable,
                3,
                0.0,
                &settings
            ),
            RetryDecision::Retry {
                after: Duration::from_secs(20)
            }
        );
        for code in [
            MachineCode::InvalidArgument,
            MachineCode::ResourceExhausted,
            MachineCode::Unauthenticated,
            MachineCode::PermissionDenied,
        ] {
            assert_eq!(
                decide(DriverMethod::CreateMachine, code, 1, 0.3, &settings),
                RetryDecision::AwaitChange {
                    resync_after: Duration::from_mins(10)
                },
                "{code}"
            );
        }
    }

    #[test]
    fn resource_exhausted_is_looked_at_again_after_the_resource_exhausted_retry() {
        let settings = RetrySettings {
            resource_exhausted_retry: Duration::from_secs(30),
            ..RetrySettings::default()
        };
        assert_eq!(
            decide(
                DriverMethod::CreateMachine,
                MachineCode::ResourceExhausted,
                1,
                0.3,
                &settings
            ),
            RetryDecision::AwaitChange {
                resync_after: Duration::from_secs(30)
            }
        );
        assert_eq!(
            decide(
                DriverMethod::CreateMachine,
                MachineCode::InvalidArgument,
                1,
                0.3,
                &settings
            ),
            RetryDecision::AwaitChange {
                resync_after: Duration::from_mins(10)
            },
            "other codes keep the safety resync"
        );
    }

    #[test]
    fn codes_a_table_does_not_list_wait_for_a_change() {
        let decision = decide(
            DriverMethod::CreateMachine,
            MachineCode::DataLoss,
            1,
            0.0,
            &RetrySettings::default(),
        );
        assert!(matches!(decision, RetryDecision::AwaitChange { .. }));
    }

    #[test]
    fn initialize_retries_uninitialized_and_internal() {
        for code in [MachineCode::Uninitialized, MachineCode::Internal] {
            assert_eq!(
                retry_class(DriverMethod::InitializeMachine, code),
                RetryClass::Auto
            );
        }
        assert_eq!(
            retry_class(DriverMethod::CreateMachine, MachineCode::Internal),
            RetryClass::AwaitChange
        );
    }

    /// Issue: a provider unreachable for longer than a call (our client's Unavailable, DeadlineExceeded, Unknown)
    /// left a machine waiting 10 minutes for a change, then the creation timeout replaced it. Every initialization
    /// error the table does not list backs off and retries; the table's own N rows (skip initialization) stay.
    #[test]
    fn initialization_transport_errors_back_off_and_retry() {
        for code in [
            MachineCode::Unavailable,
            MachineCode::DeadlineExceeded,
            MachineCode::Unknown,
            MachineCode::ResourceExhausted,
        ] {
            let decision = decide(
                DriverMethod::InitializeMachine,
                code,
                1,
                0.0,
                &RetrySettings::default(),
            );
            assert_eq!(
                decision,
                RetryDecision::Retry {
                    after: Duration::from_secs(5)
                },
                "{code:?}"
            );
        }
        for code in [MachineCode::NotFound, MachineCode::Unimplemented] {
            assert_eq!(
                retry_class(DriverMethod::InitializeMachine, code),
                RetryClass::AwaitChange,
                "{code:?} skips initialization, it is never retried"
            );
        }
    }

    #[test]
    fn the_safety_resync_is_configurable() {
        let settings = RetrySettings {
            await_change_resync: Duration::from_secs(30),
            ..RetrySettings::default()
        };
        let decision = decide(
            DriverMethod::GetMachineStatus,
            MachineCode::Unauthenticated,
            9,
            0.9,
            &settings,
        );
        assert_eq!(decision.requeue_after(), Duration::from_secs(30));
    }

    #[test]
    fn backoff_reaches_the_cap_and_stays_there() {
        let settings = RetrySettings::default();
        assert_eq!(backoff(100, 0.0, &settings), Duration::from_mins(5));
        assert_eq!(backoff(u32::MAX, 0.0, &settings), Duration::from_mins(5));
        assert_eq!(backoff(0, 0.0, &settings), Duration::from_secs(5));
        // With full jitter drawn, the delay halves at most.
        assert_eq!(backoff(100, 0.999_999, &settings).as_secs(), 150);
    }

    #[test]
    fn the_gate_opens_after_the_delay_or_on_a_change() {
        let now = Timestamp::from_second(1_000).unwrap();
        let mut machine = Machine::default();
        machine.metadata.generation = Some(1);
        let before = fingerprint(&machine, None, &[]);
        let gate = RetryGate::new(
            RetryDecision::AwaitChange {
                resync_after: Duration::from_mins(10),
            },
            now,
            before.clone(),
        );
        assert!(!gate.is_open(now, &before));
        assert!(gate.is_open(Timestamp::from_second(1_600).unwrap(), &before));
        machine.metadata.generation = Some(2);
        let after = fingerprint(&machine, None, &[]);
        assert!(gate.is_open(now, &after));
        let mut secret = Secret::default();
        secret.metadata.resource_version = Some("5".into());
        assert_ne!(fingerprint(&machine, None, &[&secret]), after);
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        let odd = RetrySettings {
            backoff_base: Duration::MAX,
            backoff_cap: Duration::MAX,
            jitter: f64::NAN,
            await_change_resync: Duration::ZERO,
            resource_exhausted_retry: Duration::ZERO,
        };
        for random in [f64::NAN, -1.0, 2.0, f64::INFINITY, 0.5] {
            let _ = backoff(7, random, &odd);
            let _ = backoff(0, random, &RetrySettings::default());
        }
        let inverted = RetrySettings {
            backoff_base: Duration::from_mins(1),
            backoff_cap: Duration::from_secs(1),
            ..RetrySettings::default()
        };
        assert!(backoff(1, 0.0, &inverted) <= Duration::from_secs(1));
    }

    fn settings_strategy() -> impl Strategy<Value = RetrySettings> {
        (1u64..120_000, 1u64..10_000_000, 0.0f64..=0.5).prop_map(|(base_ms, cap_ms, jitter)| RetrySettings {
            backoff_base: Duration::from_millis(base_ms),
            backoff_cap: Duration::from_millis(cap_ms),
            jitter,
            ..RetrySettings::default()
        })
    }

    proptest! {
        #[test]
        fn backoff_stays_within_its_jitter_bounds(
            settings in settings_strategy(),
            failures in 0u32..80,
            random in 0.0f64..1.0,
        ) {
            let delay = backoff(failures, random, &settings);
            let full = backoff(failures, 0.0, &settings);
            prop_assert!(delay <= settings.backoff_cap);
            prop_assert!(delay <= full);
            // At least (1 - jitter) of the un-jittered delay (1ms slack for float rounding).
            let floor = full.as_secs_f64() * (1.0 - settings.jitter);
            prop_assert!(delay.as_secs_f64() + 0.001 >= floor, "{delay:?} < {floor}");
        }

        #[test]
        fn backoff_is_monotone_in_failures(
            settings in settings_strategy(),
            failures in 0u32..80,
            random in 0.0f64..1.0,
            other_random in 0.0f64..1.0,
        ) {
            // Same random number: never shorter after more failures, cap included.
            prop_assert!(backoff(failures + 1, random, &settings) >= backoff(failures, random, &settings));
            // Any random numbers: never shorter while the doubled delay stays below the cap.
            // (From the first failure on: 0 failures read as 1.)
            let doubled = settings.backoff_base.checked_mul(1u32 << failures.min(31));
            if (1..31).contains(&failures) && doubled.is_some_and(|d| d <= settings.backoff_cap) {
                prop_assert!(
                    backoff(failures + 1, other_random, &settings) >= backoff(failures, random, &settings)
                );
            }
        }
    }
}
