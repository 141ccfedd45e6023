//! Leader election on a `coordination.k8s.io/v1` Lease, acted as client-go's `leaderelection` acts it (decisions in
//! `mcm_core::leader`): plain GET, CREATE and UPDATE with a resourceVersion precondition, so it works against any
//! API server, the embedded one included.
//!
//! A [`LeaderElector`] tries to acquire the Lease every retry period (jittered by up to 1.2 times): a GET, a CREATE
//! when there is none, otherwise the decision of [`Election::decide`] and an UPDATE carrying the resourceVersion
//! that was read, so that of two electors writing the same version one gets 409 Conflict and stands by. Once it
//! leads, it renews every retry period (first over the version it last wrote, without a read; on any failure by a
//! read and a write). A renewal that has not succeeded within the renew deadline, or a read showing another holder,
//! loses leadership: the state becomes [`LeaderState::Lost`] and [`LeaderElector::run`] returns. The reference
//! exits the process then; the caller decides.
//!
//! When `shutdown` resolves, the state becomes [`LeaderState::Standby`] first and then, with
//! [`Config::release_on_cancel`], the Lease is released (holder emptied, with the resourceVersion just read), so a
//! standby takes over at its next attempt instead of waiting for the lease to expire.

use std::{future::Future, pin::Pin, time::Duration};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use mcm_core::leader::{Decision, Election, LeaderElectionSettings};
use tokio::{sync::watch, time::Instant};

/// What this process knows about its leadership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderState {
    /// Nothing observed yet (the Lease could not be read so far).
    Unknown,
    /// Another holder's lease is fresh, or this elector stopped leading on shutdown: guarded work must not run.
    Standby,
    /// This elector holds the Lease: guarded work may run.
    Leading,
    /// This elector led and could not renew within the renew deadline, or saw another holder: guarded work must
    /// stop at once. Final.
    Lost,
}

impl LeaderState {
    /// Whether guarded work may run.
    pub fn is_leading(self) -> bool {
        self == Self::Leading
    }

    /// The `/readyz` check "leadership known": `Ok` while leading or standing by after an observation of the Lease.
    pub fn readiness(self) -> Result<(), String> {
        match self {
            Self::Leading | Self::Standby => Ok(()),
            Self::Unknown => Err("leadership not known yet: the lease has not been read".into()),
            Self::Lost => Err("leadership lost".into()),
        }
    }
}

/// Which Lease, who this elector is, and how it elects.
#[derive(Clone, Debug)]
pub struct Config {
    /// The Lease's namespace (`--namespace`).
    pub namespace: String,
    /// The Lease's name: [`mcm_core::leader::MCM_LOCK_NAME`] or [`mcm_core::leader::MC_LOCK_NAME`].
    pub name: String,
    /// This elector's identity, written as `holderIdentity`; unique per process ([`default_identity`]).
    pub identity: String,
    /// Lease duration, renew deadline, retry period.
    pub settings: LeaderElectionSettings,
    /// Whether to release the Lease on shutdown (client-go's `ReleaseOnCancel`); default true.
    pub release_on_cancel: bool,
}

impl Config {
    /// The reference's settings (15s, 10s, 2s) and release on shutdown.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            settings: LeaderElectionSettings::default(),
            release_on_cancel: true,
        }
    }
}

/// Elects a leader among the processes sharing one Lease; see the module documentation.
pub struct LeaderElector {
    api: Api<Lease>,
    config: Config,
    lease: String,
    state: watch::Sender<LeaderState>,
}

/// The result of one try to acquire or renew.
enum Outcome {
    /// This elector holds the Lease (written just now).
    Leading,
    /// Another holder's lease is fresh.
    Held(String),
    /// The read or write failed (a 409 Conflict included: someone else wrote first).
    Failed(String),
}

/// The result of the renewals of one leadership term.
enum Term {
    Lost(String),
    Shutdown,
}

impl LeaderElector {
    /// An elector of the Lease `config.namespace/config.name`; the settings are validated
    /// ([`LeaderElectionSettings::validate`]: the message names the flags).
    pub fn new(client: Client, config: Config) -> Result<Self, String> {
        config.settings.validate()?;
        if config.identity.is_empty() {
            return Err("the leader election identity must not be empty".into());
        }
        let (state, _) = watch::channel(LeaderState::Unknown);
        Ok(Self {
            api: Api::namespaced(client, &config.namespace),
            lease: format!("{}/{}", config.namespace, config.name),
            config,
            state,
        })
    }

    /// The leadership as it changes: start guarded work on [`LeaderState::Leading`], stop it on anything else.
    pub fn subscribe(&self) -> watch::Receiver<LeaderState> {
        self.state.subscribe()
    }

    /// The `/readyz` check "leadership known" ([`LeaderState::readiness`]), for
    /// `Metrics::add_readiness_check`.
    pub fn readiness(&self) -> impl Fn() -> Result<(), String> + Send + Sync + 'static {
        readiness(self.subscribe())
    }

    /// This elector's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Elects until leadership is lost or `shutdown` resolves, and returns the final state: [`LeaderState::Lost`]
    /// after a loss, otherwise the state at shutdown ([`LeaderState::Standby`] if it led, the Lease then released
    /// with [`Config::release_on_cancel`]). Resolve `shutdown` once the work the Lease guards has stopped: a
    /// successor may start the moment the Lease is released.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> LeaderState {
        let mut shutdown = std::pin::pin!(shutdown);
        let settings = self.config.settings;
        let mut election = Election::new(self.config.identity.clone(), settings);
        let mut current: Option<Lease> = None;
        let mut last_holder: Option<String> = None;
        tracing::info!(lease = %self.lease, identity = %self.config.identity, "leader election starts");
        // Acquire.
        loop {
            let Some(outcome) = unless(
                &mut shutdown,
                self.attempt(&mut election, &mut current, settings.renew_deadline),
            )
            .await
            else {
                return self.shut_down(&mut election).await;
            };
            match outcome {
                Outcome::Leading => break,
                Outcome::Held(holder) => {
                    if last_holder.as_deref() != Some(holder.as_str()) {
                        tracing::info!(lease = %self.lease, identity = %self.config.identity, holder = %holder,
                            "the lease is held by another: standing by");
                        last_holder = Some(holder);
                    }
                    self.publish(LeaderState::Standby);
                }
                Outcome::Failed(error) => {
                    tracing::debug!(lease = %self.lease, identity = %self.config.identity, error = %error,
                        "could not acquire the lease");
                    if election.has_observed() {
                        self.publish(LeaderState::Standby);
                    }
                }
            }
            let delay = settings.acquire_retry_delay(rand::random::<f64>());
            if unless(&mut shutdown, tokio::time::sleep(delay)).await.is_none() {
                return self.shut_down(&mut election).await;
            }
        }
        tracing::info!(lease = %self.lease, identity = %self.config.identity, holder = %self.config.identity,
            transitions = election.transitions(), "acquired the lease: leading");
        self.publish(LeaderState::Leading);
        match self.renew(&mut shutdown, &mut election, &mut current).await {
            Term::Shutdown => self.shut_down(&mut election).await,
            Term::Lost(reason) => {
                self.publish(LeaderState::Lost);
                tracing::error!(lease = %self.lease, identity = %self.config.identity,
                    holder = election.holder().unwrap_or(""), reason = %reason, "lost the lease: leading stops");
                LeaderState::Lost
            }
        }
    }

    /// Renews every retry period until a renewal does not succeed within the renew deadline (client-go's
    /// `renew`: each round starts a retry period after the last success and retries every retry period), another
    /// holder is seen, or `shutdown` resolves.
    async fn renew(
        &self,
        shutdown: &mut Pin<&mut (impl Future<Output = ()> + Send)>,
        election: &mut Election,
        current: &mut Option<Lease>,
    ) -> Term {
        let settings = self.config.settings;
        loop {
            if unless(shutdown, tokio::time::sleep(settings.retry_period))
                .await
                .is_none()
            {
                return Term::Shutdown;
            }
            let deadline = Instant::now() + settings.renew_deadline;
            let mut last_error = String::from("no renewal tried");
            loop {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    return Term::Lost(format!(
                        "not renewed within the renew deadline ({:?}): {last_error}",
                        settings.renew_deadline
                    ));
                }
                let Some(outcome) = unless(shutdown, self.attempt(election, current, remaining)).await else {
                    return Term::Shutdown;
                };
                match outcome {
                    Outcome::Leading => break,
                    // Not client-go's way (it keeps trying until the deadline, and fails each time): another
                    // holder may already be leading, so stop now.
                    Outcome::Held(holder) => return Term::Lost(format!("the lease is held by {holder}")),
                    Outcome::Failed(error) => {
                        tracing::warn!(lease = %self.lease, identity = %self.config.identity, error = %error,
                            "renewing the lease failed; retrying");
                        last_error = error;
                    }
                }
                let remaining = deadline.saturating_duration_since(Instant::now());
                let pause = settings.retry_period.min(remaining);
                if unless(shutdown, tokio::time::sleep(pause)).await.is_none() {
                    return Term::Shutdown;
                }
            }
        }
    }

    /// One try to acquire or renew (client-go's `tryAcquireOrRenew`), bounded by `limit`.
    async fn attempt(
        &self,
        election: &mut Election,
        current: &mut Option<Lease>,
        limit: Duration,
    ) -> Outcome {
        match tokio::time::timeout(limit, self.try_acquire_or_renew(election, current)).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Failed(format!("no answer within {limit:?}")),
        }
    }

    async fn try_acquire_or_renew(&self, election: &mut Election, current: &mut Option<Lease>) -> Outcome {
        // Fast path: the holder writes over the version it last wrote, without reading first. A 409 means the
        // Lease changed since: read it and decide again.
        if election.is_holder()
            && let Some(lease) = current.as_ref()
            && let Decision::Renew(spec) = election.decide(Timestamp::now())
        {
            match self.replace(lease, spec).await {
                Ok(written) => {
                    election.wrote(&spec_of(&written), Timestamp::now());
                    *current = Some(written);
                    return Outcome::Leading;
                }
                Err(error) => {
                    tracing::debug!(lease = %self.lease, error = %error, "optimistic renewal failed; reading the lease");
                }
            }
        }
        let lease = match self.api.get_opt(&self.config.name).await {
            Ok(lease) => lease,
            Err(error) => return Outcome::Failed(format!("reading the lease: {error}")),
        };
        let now = Timestamp::now();
        election.observe(lease.as_ref().map(spec_of).as_ref(), now);
        *current = lease;
        let written = match (election.decide(now), current.as_ref()) {
            (Decision::StandBy { holder, .. }, _) => return Outcome::Held(holder),
            (Decision::Create(spec), _) | (Decision::Acquire(spec) | Decision::Renew(spec), None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (Decision::Acquire(spec) | Decision::Renew(spec), Some(lease)) => self.replace(lease, spec).await,
        };
        match written {
            Ok(written) => {
                election.wrote(&spec_of(&written), Timestamp::now());
                *current = Some(written);
                Outcome::Leading
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Outcome::Failed(format!(
                "another elector wrote the lease first: {}",
                status.message
            )),
            Err(error) => Outcome::Failed(format!("writing the lease: {error}")),
        }
    }

    /// UPDATE of `lease` with `spec`: the body carries the resourceVersion of `lease`, a precondition (409 when
    /// the Lease changed since).
    async fn replace(&self, lease: &Lease, spec: LeaseSpec) -> Result<Lease, kube::Error> {
        let mut lease = lease.clone();
        lease.spec = Some(spec);
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
    }

    /// Stops leading (the state becomes Standby unless nothing was ever observed) and, with
    /// `release_on_cancel`, releases the Lease if this elector holds it.
    async fn shut_down(&self, election: &mut Election) -> LeaderState {
        let led = self.state.borrow().is_leading();
        if led || election.has_observed() {
            self.publish(LeaderState::Standby);
        }
        if self.config.release_on_cancel {
            let limit = self.config.settings.renew_deadline;
            match tokio::time::timeout(limit, self.release(election)).await {
                Ok(Ok(true)) => tracing::info!(lease = %self.lease, identity = %self.config.identity,
                    holder = "", "released the lease"),
                Ok(Ok(false)) => {}
                Ok(Err(error)) => tracing::warn!(lease = %self.lease, identity = %self.config.identity,
                    error = %error, "releasing the lease failed; it expires instead"),
                Err(_) => tracing::warn!(lease = %self.lease, identity = %self.config.identity,
                    "releasing the lease timed out; it expires instead"),
            }
        } else if led {
            tracing::info!(lease = %self.lease, identity = %self.config.identity,
                "stopped leading; the lease expires");
        }
        *self.state.borrow()
    }

    /// Reads the Lease and, if this elector holds it, writes the released spec with the resourceVersion read.
    /// `Ok(false)`: nothing to release.
    async fn release(&self, election: &mut Election) -> Result<bool, kube::Error> {
        let Some(lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(false);
        };
        let now = Timestamp::now();
        election.observe(Some(&spec_of(&lease)), now);
        let Some(spec) = election.release(now) else {
            return Ok(false);
        };
        let written = self.replace(&lease, spec).await?;
        election.wrote(&spec_of(&written), Timestamp::now());
        Ok(true)
    }

    fn publish(&self, state: LeaderState) {
        self.state.send_if_modified(|current| {
            if *current == state {
                false
            } else {
                *current = state;
                true
            }
        });
    }
}

/// The `/readyz` check "leadership known" over a leadership channel ([`LeaderState::readiness`]).
pub fn readiness(
    state: watch::Receiver<LeaderState>,
) -> impl Fn() -> Result<(), String> + Send + Sync + 'static {
    move || state.borrow().readiness()
}

/// Waits until this process leads: `true` once [`LeaderState::Leading`], `false` if leadership is lost or the
/// elector ends first.
pub async fn wait_until_leading(state: &mut watch::Receiver<LeaderState>) -> bool {
    match state
        .wait_for(|s| matches!(s, LeaderState::Leading | LeaderState::Lost))
        .await
    {
        Ok(s) => s.is_leading(),
        Err(_) => false,
    }
}

/// Waits until this process no longer leads, and returns the state: [`LeaderState::Lost`] after a loss, or when
/// the elector ended while leading without saying so (its task panicked or was aborted);
/// [`LeaderState::Standby`] on shutdown.
pub async fn wait_until_not_leading(state: &mut watch::Receiver<LeaderState>) -> LeaderState {
    match state.wait_for(|s| !s.is_leading()).await {
        Ok(s) => *s,
        Err(_) => LeaderState::Lost,
    }
}

/// client-go's default identity: the host name, `_`, and a random UUID (version 4), unique per process.
pub fn default_identity() -> String {
    let host = ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|path| {
            std::fs::read_to_string(path)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into());
    format!("{host}_{}", uuid_v4(rand::random()))
}

/// A version 4 UUID from 16 random bytes, in its usual text form.
fn uuid_v4(mut bytes: [u8; 16]) -> String {
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = format!("{:032x}", u128::from_be_bytes(bytes));
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The Lease's spec (a Lease without one has the empty spec).
fn spec_of(lease: &Lease) -> LeaseSpec {
    lease.spec.clone().unwrap_or_default()
}

/// Runs `work` unless `shutdown` resolves first (`None` then).
async fn unless<T>(
    shutdown: &mut Pin<&mut (impl Future<Output = ()> + Send)>,
    work: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        () = shutdown.as_mut() => None,
        value = work => Some(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_identity_is_host_and_a_uuid() {
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b, "unique per call");
        let (host, uuid) = a.rsplit_once('_').expect("host_uuid");
        assert!(!host.is_empty());
        assert_eq!(uuid.len(), 36, "{uuid}");
        assert_eq!(uuid.as_bytes()[14], b'4', "version 4: {uuid}");
        assert!(
            matches!(uuid.as_bytes()[19], b'8' | b'9' | b'a' | b'b'),
            "variant: {uuid}"
        );
    }

    #[test]
    fn readiness_means_leadership_known() {
        let (tx, rx) = watch::channel(LeaderState::Unknown);
        let ready = readiness(rx);
        assert!(ready().is_err());
        tx.send_replace(LeaderState::Standby);
        assert_eq!(ready(), Ok(()));
        tx.send_replace(LeaderState::Leading);
        assert_eq!(ready(), Ok(()));
        tx.send_replace(LeaderState::Lost);
        assert!(ready().unwrap_err().contains("lost"));
    }
}
