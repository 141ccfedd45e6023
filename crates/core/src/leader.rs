//! Leader election on a `coordination.k8s.io/v1` Lease, decided purely, as client-go's `leaderelection` package
//! decides it (reference §8.1: `--leader-elect-lease-duration` 15s, `--leader-elect-renew-deadline` 10s,
//! `--leader-elect-retry-period` 2s; locks `machine-controller-manager` and `machine-controller`). The acting part
//! (GET, CREATE, UPDATE with a resourceVersion precondition, the retry and renew loops) is
//! `mcm_controllers::leader`.
//!
//! An [`Election`] remembers the last Lease record it observed and, **locally**, when that record last changed.
//! From it, the elector's identity and `now`, [`Election::decide`] says whether to create the Lease, take it over
//! (missing or empty holder, or expired), renew it (this elector holds it), or stand by (another holder's lease is
//! still fresh), and gives the spec to write.
//!
//! **Clock skew.** A lease is expired when the record has not changed for `leaseDurationSeconds` *as measured by
//! this elector's own clock* since it first saw the current version; the holder's `renewTime` is never compared with
//! the local clock. Two machines' clocks may differ by minutes: comparing a remote `renewTime` with the local `now`
//! would let a standby whose clock runs ahead take over a lease that is being renewed (two leaders), or make one
//! whose clock runs behind wait forever. Observing changes locally only needs both clocks to run at about the same
//! *rate*. The price, as in client-go: a newly started elector waits one full lease duration before it takes over a
//! lease that has long expired, because it cannot know for how long the record had not changed before it looked.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use crate::timeouts;

/// client-go's `JitterFactor`: the renew deadline must exceed the retry period by this factor, and acquisition
/// attempts come every retry period stretched by up to this factor.
pub const JITTER_FACTOR: f64 = 1.2;

/// The reference's lock name of the machine-controller-manager (MachineSet, MachineDeployment, safety).
pub const MCM_LOCK_NAME: &str = "machine-controller-manager";

/// The reference's lock name of the machine controller.
pub const MC_LOCK_NAME: &str = "machine-controller";

/// The three durations of leader election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderElectionSettings {
    /// `--leader-elect-lease-duration` (15s): how long standbys wait after the last observed change of the record
    /// before they take over. Written to the Lease as whole seconds, rounded up.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline` (10s): how long the leader keeps retrying a renewal before it gives up
    /// leadership.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period` (2s): the period of acquisition attempts and renewals.
    pub retry_period: Duration,
}

impl Default for LeaderElectionSettings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaderElectionSettings {
    /// client-go's rules (`NewLeaderElector`): every duration is positive, the lease duration is longer than the
    /// renew deadline (a leader gives up before a standby may take over), and the renew deadline is longer than
    /// the retry period times [`JITTER_FACTOR`] (a leader gets more than one try). The message names the flags.
    pub fn validate(&self) -> Result<(), String> {
        for (flag, value) in [
            ("--leader-elect-lease-duration", self.lease_duration),
            ("--leader-elect-renew-deadline", self.renew_deadline),
            ("--leader-elect-retry-period", self.retry_period),
        ] {
            if value.is_zero() {
                return Err(format!("{flag} must be greater than zero"));
            }
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be greater than --leader-elect-renew-deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        let jittered = self.retry_period.mul_f64(JITTER_FACTOR);
        if self.renew_deadline <= jittered {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be greater than --leader-elect-retry-period ({:?}) \
                 times {JITTER_FACTOR} ({jittered:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }

    /// The lease duration as the Lease records it: whole seconds, rounded up (at least 1), so that standbys never
    /// wait less than the holder assumes.
    pub fn lease_duration_seconds(&self) -> i32 {
        let seconds = self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(seconds.max(1)).unwrap_or(i32::MAX)
    }

    /// The wait before the next acquisition attempt: the retry period stretched by `random` (in `[0, 1)`) times
    /// [`JITTER_FACTOR`], as client-go's `wait.JitterUntil`, so that standbys do not all ask at once.
    pub fn acquire_retry_delay(&self, random: f64) -> Duration {
        let random = if random.is_finite() {
            random.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.retry_period + self.retry_period.mul_f64(random * JITTER_FACTOR)
    }
}

/// What to do with the Lease now.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// There is no Lease: create it with this spec.
    Create(LeaseSpec),
    /// Take the Lease over (its holder is empty or its lease expired): write this spec with the observed
    /// resourceVersion. `leaseTransitions` is one more than observed.
    Acquire(LeaseSpec),
    /// This elector holds the Lease: write this spec (a fresh `renewTime`, `acquireTime` and `leaseTransitions` as
    /// observed) with the observed resourceVersion.
    Renew(LeaseSpec),
    /// Another holder's lease is fresh: wait.
    StandBy {
        /// The holder.
        holder: String,
        /// When its lease expires unless the record changes, by the local clock.
        expires: Timestamp,
    },
}

/// What an elector last saw of the Lease.
#[derive(Clone, Debug, PartialEq)]
enum Observed {
    /// Nothing yet.
    Nothing,
    /// That there is no Lease.
    NoLease,
    /// The Lease's record.
    Record(LeaseSpec),
}

/// One elector's view of the Lease: the record last observed (or written), and when it last changed by the local
/// clock.
#[derive(Clone, Debug)]
pub struct Election {
    identity: String,
    settings: LeaderElectionSettings,
    observed: Observed,
    observed_at: Option<Timestamp>,
}

impl Election {
    /// An elector named `identity` that has observed nothing yet.
    pub fn new(identity: impl Into<String>, settings: LeaderElectionSettings) -> Self {
        Self {
            identity: identity.into(),
            settings,
            observed: Observed::Nothing,
            observed_at: None,
        }
    }

    /// This elector's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The settings.
    pub fn settings(&self) -> LeaderElectionSettings {
        self.settings
    }

    /// Takes a read of the Lease at `now` (`None`: there is no Lease; a Lease without a spec is `Some` of the
    /// default spec). The observation time moves to `now` only when the record differs from the one observed
    /// before: an unchanged record keeps ageing towards its expiry.
    pub fn observe(&mut self, spec: Option<&LeaseSpec>, now: Timestamp) {
        let observed = spec.map_or(Observed::NoLease, |s| Observed::Record(s.clone()));
        if self.observed != observed {
            self.observed = observed;
            self.observed_at = Some(now);
        }
    }

    /// Records that this elector wrote `spec` at `now` (pass the spec the API server returned): it is the new
    /// observed record.
    pub fn wrote(&mut self, spec: &LeaseSpec, now: Timestamp) {
        self.observed = Observed::Record(spec.clone());
        self.observed_at = Some(now);
    }

    /// Whether anything has been observed yet.
    pub fn has_observed(&self) -> bool {
        self.observed != Observed::Nothing
    }

    /// The observed holder (`None` when nothing observed, no Lease, or an empty holder).
    pub fn holder(&self) -> Option<&str> {
        self.observed_spec()
            .and_then(|s| s.holder_identity.as_deref())
            .filter(|h| !h.is_empty())
    }

    /// Whether the observed record names this elector as holder (client-go's `IsLeader`). Whether it still may act
    /// as leader is the renew deadline's business, which the acting part keeps.
    pub fn is_holder(&self) -> bool {
        self.holder() == Some(self.identity.as_str())
    }

    /// The observed record's `leaseTransitions` (0 when absent).
    pub fn transitions(&self) -> i32 {
        self.observed_spec()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0)
    }

    /// When the observed lease expires by the local clock: the last local observation of a change plus the
    /// observed `leaseDurationSeconds` (the holder's setting, not ours). `None` when nothing was observed.
    pub fn expires(&self) -> Option<Timestamp> {
        let at = self.observed_at?;
        let seconds = self
            .observed_spec()
            .and_then(|s| s.lease_duration_seconds)
            .unwrap_or(0);
        let seconds = u64::try_from(seconds).unwrap_or(0);
        Some(timeouts::add(at, Duration::from_secs(seconds)))
    }

    /// Decides from the observed record (call [`Election::observe`] first) what to do at `now`:
    /// - no Lease: [`Decision::Create`] (this elector the holder, `leaseTransitions` 0);
    /// - this elector holds it: [`Decision::Renew`] (`acquireTime` and `leaseTransitions` kept);
    /// - another holder, and `now` before [`Election::expires`]: [`Decision::StandBy`];
    /// - an empty holder (released), or an expired lease: [`Decision::Acquire`] (`leaseTransitions` + 1).
    ///
    /// Every spec written carries this elector's `leaseDurationSeconds` and `renewTime` `now`.
    pub fn decide(&self, now: Timestamp) -> Decision {
        let now = micro(now);
        let Observed::Record(observed) = &self.observed else {
            return Decision::Create(self.spec(None, now, now, 0));
        };
        if self.is_holder() {
            let acquired = observed.acquire_time.as_ref().map_or(now, |t| t.0);
            return Decision::Renew(self.spec(Some(observed), acquired, now, self.transitions()));
        }
        if let Some(holder) = self.holder()
            && let Some(expires) = self.expires()
            && now < expires
        {
            return Decision::StandBy {
                holder: holder.to_owned(),
                expires,
            };
        }
        Decision::Acquire(self.spec(Some(observed), now, now, self.transitions().saturating_add(1)))
    }

    /// The spec that releases the Lease (client-go's `ReleaseOnCancel`): an empty holder, `leaseDurationSeconds`
    /// 1, times `now`, `leaseTransitions` kept, so that a standby takes over at its next attempt instead of waiting
    /// for the lease to expire. `None` when this elector does not hold the observed record (nothing to release).
    pub fn release(&self, now: Timestamp) -> Option<LeaseSpec> {
        if !self.is_holder() {
            return None;
        }
        let now = micro(now);
        let mut spec = self.observed_spec().cloned().unwrap_or_default();
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.acquire_time = Some(MicroTime(now));
        spec.renew_time = Some(MicroTime(now));
        spec.lease_transitions = Some(self.transitions());
        Some(spec)
    }

    fn observed_spec(&self) -> Option<&LeaseSpec> {
        match &self.observed {
            Observed::Record(spec) => Some(spec),
            Observed::Nothing | Observed::NoLease => None,
        }
    }

    /// A spec naming this elector holder; other fields of `base` (preferredHolder, strategy) are kept.
    fn spec(
        &self,
        base: Option<&LeaseSpec>,
        acquired: Timestamp,
        now: Timestamp,
        transitions: i32,
    ) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.settings.lease_duration_seconds()),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..base.cloned().unwrap_or_default()
        }
    }
}

/// `t` truncated to microseconds: what a MicroTime keeps on the wire, so that a record written and read back
/// compares equal.
fn micro(t: Timestamp) -> Timestamp {
    Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + seconds).unwrap()
    }

    fn settings() -> LeaderElectionSettings {
        LeaderElectionSettings::default()
    }

    /// A record held by `holder`, renewed at `renewed` (by the holder's clock).
    fn held(holder: &str, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(at(-100))),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn the_defaults_are_the_reference_ones_and_valid() {
        let s = settings();
        assert_eq!(s.lease_duration, Duration::from_secs(15));
        assert_eq!(s.renew_deadline, Duration::from_secs(10));
        assert_eq!(s.retry_period, Duration::from_secs(2));
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.lease_duration_seconds(), 15);
    }

    #[test]
    fn validation_follows_client_go_and_names_the_flags() {
        let check = |lease: u64, renew: u64, retry: u64| {
            LeaderElectionSettings {
                lease_duration: Duration::from_millis(lease),
                renew_deadline: Duration::from_millis(renew),
                retry_period: Duration::from_millis(retry),
            }
            .validate()
        };
        let err = check(10_000, 10_000, 2_000).unwrap_err();
        assert!(err.contains("--leader-elect-lease-duration"), "{err}");
        assert!(err.contains("--leader-elect-renew-deadline"), "{err}");
        let err = check(15_000, 2_400, 2_000).unwrap_err();
        assert!(err.contains("--leader-elect-renew-deadline"), "{err}");
        assert!(err.contains("--leader-elect-retry-period"), "{err}");
        assert!(err.contains("1.2"), "{err}");
        assert_eq!(check(15_000, 2_401, 2_000), Ok(()), "just above retry * 1.2");
        assert!(
            check(0, 0, 0)
                .unwrap_err()
                .contains("--leader-elect-lease-duration")
        );
        assert!(
            check(15_000, 0, 2_000)
                .unwrap_err()
                .contains("--leader-elect-renew-deadline")
        );
        assert!(
            check(15_000, 10_000, 0)
                .unwrap_err()
                .contains("--leader-elect-retry-period")
        );
        assert!(
            check(15_000, 10_000, 0)
                .unwrap_err()
                .contains("greater than zero")
        );
    }

    #[test]
    fn the_lease_duration_is_written_in_whole_seconds_rounded_up() {
        let mut s = settings();
        s.lease_duration = Duration::from_millis(2_500);
        assert_eq!(s.lease_duration_seconds(), 3);
        s.lease_duration = Duration::from_millis(300);
        assert_eq!(s.lease_duration_seconds(), 1);
    }

    #[test]
    fn acquisition_attempts_are_jittered_by_up_to_the_factor() {
        let s = settings();
        assert_eq!(s.acquire_retry_delay(0.0), Duration::from_secs(2));
        assert_eq!(s.acquire_retry_delay(0.5), Duration::from_millis(3_200));
        assert_eq!(s.acquire_retry_delay(f64::NAN), Duration::from_secs(2));
        assert!(s.acquire_retry_delay(0.999_999) < Duration::from_millis(4_400));
    }

    #[test]
    fn a_missing_lease_is_created_with_this_elector_holding_it() {
        let mut e = Election::new("me", settings());
        e.observe(None, at(0));
        let Decision::Create(spec) = e.decide(at(0)) else {
            panic!("create")
        };
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, Some(MicroTime(at(0))));
        assert_eq!(spec.renew_time, Some(MicroTime(at(0))));
        assert_eq!(spec.lease_transitions, Some(0));
    }

    #[test]
    fn a_fresh_lease_of_another_holder_means_standing_by_until_it_expires_locally() {
        let mut e = Election::new("me", settings());
        e.observe(Some(&held("other", at(0), 3)), at(0));
        assert_eq!(
            e.decide(at(14)),
            Decision::StandBy {
                holder: "other".into(),
                expires: at(15)
            }
        );
        // Still the same record at 15 s: expired.
        e.observe(Some(&held("other", at(0), 3)), at(15));
        let Decision::Acquire(spec) = e.decide(at(15)) else {
            panic!("acquire")
        };
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_transitions, Some(4), "a takeover is a transition");
        assert_eq!(spec.acquire_time, Some(MicroTime(at(15))));
        assert_eq!(spec.renew_time, Some(MicroTime(at(15))));
        assert_eq!(spec.lease_duration_seconds, Some(15));
    }

    #[test]
    fn every_renewal_of_the_holder_restarts_the_local_expiry() {
        let mut e = Election::new("me", settings());
        for t in (0..60).step_by(2) {
            e.observe(Some(&held("other", at(t), 1)), at(t));
            assert!(
                matches!(e.decide(at(t + 1)), Decision::StandBy { .. }),
                "renewed at {t}"
            );
        }
    }

    #[test]
    fn the_expiry_uses_the_holders_lease_duration() {
        let mut e = Election::new("me", settings());
        let mut spec = held("other", at(0), 0);
        spec.lease_duration_seconds = Some(60);
        e.observe(Some(&spec), at(0));
        assert!(matches!(e.decide(at(59)), Decision::StandBy { .. }));
        assert!(matches!(e.decide(at(60)), Decision::Acquire(_)));
    }

    #[test]
    fn a_holder_whose_clock_runs_behind_is_not_taken_over_while_it_renews() {
        // The holder's clock is an hour behind: its renewTime is always an hour old by ours. Comparing it with now
        // would take over a lease that is renewed every 2 s.
        let mut e = Election::new("me", settings());
        for t in (0..40).step_by(2) {
            e.observe(Some(&held("other", at(t - 3_600), 1)), at(t));
            assert!(
                matches!(e.decide(at(t)), Decision::StandBy { .. }),
                "renewed at {t}"
            );
        }
    }

    #[test]
    fn a_holder_whose_clock_runs_ahead_is_taken_over_once_it_stops_renewing() {
        // The holder's clock is an hour ahead: its last renewTime looks fresh for an hour by ours. Only the local
        // observation counts: 15 s without a change is an expired lease.
        let mut e = Election::new("me", settings());
        let stale = held("other", at(3_600), 1);
        e.observe(Some(&stale), at(0));
        assert!(matches!(e.decide(at(10)), Decision::StandBy { .. }));
        e.observe(Some(&stale), at(16));
        assert!(matches!(e.decide(at(16)), Decision::Acquire(_)));
    }

    #[test]
    fn a_new_elector_waits_a_full_lease_duration_even_for_an_old_record() {
        let mut e = Election::new("me", settings());
        e.observe(Some(&held("other", at(-1_000), 1)), at(0));
        assert!(matches!(e.decide(at(1)), Decision::StandBy { .. }));
        assert!(matches!(e.decide(at(15)), Decision::Acquire(_)));
    }

    #[test]
    fn the_holder_renews_keeping_acquire_time_and_transitions() {
        let mut e = Election::new("me", settings());
        e.observe(Some(&held("me", at(0), 7)), at(0));
        assert!(e.is_holder());
        let Decision::Renew(spec) = e.decide(at(2)) else {
            panic!("renew")
        };
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.acquire_time, Some(MicroTime(at(-100))));
        assert_eq!(spec.renew_time, Some(MicroTime(at(2))));
        assert_eq!(spec.lease_transitions, Some(7));
        // Even after the local expiry: the renew deadline, not the expiry, ends a leader's tries.
        assert!(matches!(e.decide(at(100)), Decision::Renew(_)));
    }

    #[test]
    fn a_written_record_is_the_new_observation() {
        let mut e = Election::new("me", settings());
        e.observe(Some(&held("other", at(0), 2)), at(0));
        let Decision::Acquire(spec) = e.decide(at(20)) else {
            panic!("acquire")
        };
        e.wrote(&spec, at(20));
        assert!(e.is_holder());
        assert_eq!(e.expires(), Some(at(35)));
        let Decision::Renew(renewed) = e.decide(at(22)) else {
            panic!("renew")
        };
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(20))));
        assert_eq!(renewed.lease_transitions, Some(3));
    }

    #[test]
    fn an_empty_holder_is_acquired_at_once() {
        let mut e = Election::new("me", settings());
        let mut spec = held("", at(0), 4);
        spec.lease_duration_seconds = Some(15);
        e.observe(Some(&spec), at(0));
        assert_eq!(e.holder(), None);
        let Decision::Acquire(spec) = e.decide(at(0)) else {
            panic!("acquire")
        };
        assert_eq!(spec.lease_transitions, Some(5));
        // A Lease without a spec, as `kubectl create` might leave one, too.
        let mut e = Election::new("me", settings());
        e.observe(Some(&LeaseSpec::default()), at(0));
        let Decision::Acquire(spec) = e.decide(at(0)) else {
            panic!("acquire")
        };
        assert_eq!(spec.lease_transitions, Some(1));
    }

    #[test]
    fn a_release_empties_the_holder_and_another_acquires_at_once() {
        let mut leader = Election::new("a", settings());
        leader.observe(Some(&held("a", at(0), 2)), at(0));
        let released = leader.release(at(1)).expect("a holds the lease");
        assert_eq!(released.holder_identity.as_deref(), Some(""));
        assert_eq!(released.lease_duration_seconds, Some(1));
        assert_eq!(released.lease_transitions, Some(2));
        assert_eq!(released.renew_time, Some(MicroTime(at(1))));

        let mut standby = Election::new("b", settings());
        standby.observe(Some(&held("a", at(0), 2)), at(0));
        assert!(matches!(standby.decide(at(1)), Decision::StandBy { .. }));
        standby.observe(Some(&released), at(1));
        let Decision::Acquire(spec) = standby.decide(at(1)) else {
            panic!("acquire right after the release")
        };
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(3));
    }

    #[test]
    fn only_the_holder_releases() {
        let mut e = Election::new("me", settings());
        assert_eq!(e.release(at(0)), None, "nothing observed");
        e.observe(Some(&held("other", at(0), 0)), at(0));
        assert_eq!(e.release(at(0)), None);
    }

    #[test]
    fn other_spec_fields_are_kept() {
        let mut e = Election::new("me", settings());
        let mut spec = held("me", at(0), 0);
        spec.preferred_holder = Some("p".into());
        e.observe(Some(&spec), at(0));
        let Decision::Renew(renewed) = e.decide(at(1)) else {
            panic!("renew")
        };
        assert_eq!(renewed.preferred_holder.as_deref(), Some("p"));
    }

    #[test]
    fn times_are_written_with_microsecond_precision() {
        let mut e = Election::new("me", settings());
        e.observe(None, at(0));
        let now = Timestamp::from_nanosecond(1_700_000_000_123_456_789).unwrap();
        let Decision::Create(spec) = e.decide(now) else {
            panic!("create")
        };
        assert_eq!(
            spec.renew_time.unwrap().0,
            Timestamp::from_microsecond(1_700_000_000_123_456).unwrap()
        );
    }
}
