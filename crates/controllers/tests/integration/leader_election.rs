//! Leader election against the embedded API server over HTTPS with the real kube client: each test has its own
//! server (temporary directory, free port) and electors with short durations. Every wait is a poll with a deadline;
//! every elector's leadership is recorded as it changes ([`Timeline`]), and no two electors of a test may ever lead
//! at once.

use crate::support;

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, api::PostParams};
use mcm_apiserver::{ApiServer, Config as ServerConfig};
use mcm_controllers::leader::{self, Config, LeaderElector, LeaderState};
use mcm_core::leader::LeaderElectionSettings;
use serde_json::Value;
use support::{History, NAMESPACE, wait_for};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};

/// Short durations that keep client-go's rules: lease 3s > renew deadline 2s > retry 300ms × 1.2.
fn settings() -> LeaderElectionSettings {
    LeaderElectionSettings {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
    }
}

/// Time for requests and scheduling on a busy 2-core machine, on top of what the algorithm allows.
const SLACK: Duration = Duration::from_secs(1);

/// The longest a standby may wait between acquisition attempts: the retry period jittered by up to 1.2 times.
fn max_retry(settings: LeaderElectionSettings) -> Duration {
    settings.retry_period.mul_f64(2.2)
}

/// An embedded API server of one test.
struct Server {
    running: Option<ApiServer>,
    _dir: tempfile::TempDir,
    client: Client,
}

impl Server {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = ServerConfig::new(dir.path());
        config.in_memory = true;
        let server = ApiServer::start(config).await.expect("the API server starts");
        let client = support::client_for(&server).await;
        Self {
            running: Some(server),
            _dir: dir,
            client,
        }
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    async fn lease(&self, name: &str) -> Lease {
        self.leases().get(name).await.expect("the lease exists")
    }

    async fn shutdown(&mut self) {
        if let Some(server) = self.running.take() {
            server.shutdown().await;
        }
    }
}

/// A state an elector published and when the test saw it; `None` once the elector is gone.
type Entry = (Instant, Option<LeaderState>);

/// Every state an elector published.
#[derive(Clone, Default)]
struct Timeline(Arc<Mutex<Vec<Entry>>>);

impl Timeline {
    fn follow(mut state: watch::Receiver<LeaderState>) -> Self {
        let timeline = Self::default();
        let entries = Arc::clone(&timeline.0);
        tokio::spawn(async move {
            loop {
                let now = *state.borrow_and_update();
                entries
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((Instant::now(), Some(now)));
                if state.changed().await.is_err() {
                    entries
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((Instant::now(), None));
                    return;
                }
            }
        });
        timeline
    }

    fn entries(&self) -> Vec<Entry> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Asserts that the recorded leadership periods of `timelines` never overlap.
fn assert_never_two_leaders(timelines: &[&Timeline]) {
    let mut events: Vec<(Instant, usize, bool)> = Vec::new();
    for (i, timeline) in timelines.iter().enumerate() {
        let mut leading = false;
        for (at, state) in timeline.entries() {
            let now = state == Some(LeaderState::Leading);
            if now != leading {
                events.push((at, i, now));
                leading = now;
            }
        }
    }
    // Ends before starts at the same instant.
    events.sort_by_key(|&(at, _, starts)| (at, starts));
    let mut leaders = 0;
    for (at, i, starts) in events {
        if starts {
            leaders += 1;
            assert!(leaders <= 1, "elector {i} leads at {at:?} while another does");
        } else {
            leaders -= 1;
        }
    }
}

/// One running elector.
struct Elector {
    identity: String,
    state: watch::Receiver<LeaderState>,
    timeline: Timeline,
    readiness: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<LeaderState>>,
}

impl Elector {
    fn start(client: &Client, lease: &str, identity: &str, settings: LeaderElectionSettings) -> Self {
        let mut config = Config::new(NAMESPACE, lease, identity);
        config.settings = settings;
        let elector = LeaderElector::new(client.clone(), config).expect("valid settings");
        let state = elector.subscribe();
        let readiness = Box::new(elector.readiness());
        let timeline = Timeline::follow(elector.subscribe());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(elector.run(async move {
            let _ = stopped.await;
        }));
        Self {
            identity: identity.to_owned(),
            state,
            timeline,
            readiness,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn now(&self) -> LeaderState {
        *self.state.borrow()
    }

    /// Whether it leads now (a killed elector does not, whatever it published last).
    fn leads(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished()) && self.now().is_leading()
    }

    /// Kills the elector as `kill -9` would: no release, no last word.
    async fn kill(&mut self) {
        let task = self.task.take().expect("running");
        task.abort();
        let _ = task.await;
    }

    /// Shuts it down gracefully and returns its final state.
    async fn stop(&mut self) -> LeaderState {
        let _ = self.stop.take().expect("running").send(());
        tokio::time::timeout(support::DEADLINE, self.task.take().expect("running"))
            .await
            .expect("the elector stops in time")
            .expect("the elector task ends cleanly")
    }

    /// Waits for the end of the run (after a loss) and returns its final state.
    async fn finished(&mut self) -> LeaderState {
        tokio::time::timeout(support::DEADLINE, self.task.take().expect("running"))
            .await
            .expect("the elector ends in time")
            .expect("the elector task ends cleanly")
    }
}

/// Waits until exactly one of `electors` leads and the others stand by, checking on every look that no two lead;
/// returns the leader's index.
async fn one_leader(electors: &[&Elector]) -> usize {
    wait_for("exactly one leader, the others standing by", async || {
        let leading: Vec<usize> = (0..electors.len()).filter(|&i| electors[i].leads()).collect();
        assert!(leading.len() <= 1, "two leaders at once: {leading:?}");
        let standby = electors
            .iter()
            .filter(|e| e.now() == LeaderState::Standby)
            .count();
        (leading.len() == 1 && standby == electors.len() - 1).then(|| leading[0])
    })
    .await
}

/// Waits until `electors[other]` leads, checking at every look that the two never lead at once.
async fn takeover(electors: &[Elector; 2], other: usize) {
    wait_for("the standby to take over", async || {
        assert!(
            !(electors[0].leads() && electors[1].leads()),
            "two leaders at once"
        );
        electors[other].leads().then_some(())
    })
    .await;
}

fn spec_holder(lease: &Lease) -> &str {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("")
}

fn spec_transitions(lease: &Lease) -> i32 {
    lease.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0)
}

fn renew_time(lease: &Lease) -> jiff::Timestamp {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .expect("a renewTime")
        .0
}

fn acquire_time(lease: &Lease) -> jiff::Timestamp {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.as_ref())
        .expect("an acquireTime")
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_after_its_lease_expires_and_never_two_lead() {
    let server = Server::start().await;
    let history = History::start(server.leases()).await;
    let settings = settings();
    let mut electors = [
        Elector::start(&server.client, "mc", "a", settings),
        Elector::start(&server.client, "mc", "b", settings),
    ];
    let first = one_leader(&[&electors[0], &electors[1]]).await;
    let other = 1 - first;
    assert_eq!((electors[0].readiness)(), Ok(()), "leadership known");
    assert_eq!((electors[1].readiness)(), Ok(()), "leadership known");
    let lease = server.lease("mc").await;
    assert_eq!(spec_holder(&lease), electors[first].identity);
    let transitions = spec_transitions(&lease);
    // The leader renews; the standby keeps standing by over several lease durations' worth of renewals.
    wait_for("two renewals by the leader", async || {
        let renewals = history
            .of("mc")
            .iter()
            .filter(|s| spec_holder(&s.object) == electors[first].identity)
            .count();
        assert!(
            !electors[other].leads(),
            "the standby leads while the leader renews"
        );
        (renewals >= 3).then_some(())
    })
    .await;

    electors[first].kill().await;
    let killed = Instant::now();
    takeover(&electors, other).await;
    let took = killed.elapsed();
    eprintln!("taken over {took:?} after the kill");
    // The standby may see the leader's last renewal up to one (jittered) retry after the kill, and tries again up to
    // one retry after the lease expired by its clock.
    let bound = settings.lease_duration + 2 * max_retry(settings) + SLACK;
    assert!(took <= bound, "took over after {took:?}, more than {bound:?}");

    let lease = server.lease("mc").await;
    assert_eq!(
        spec_holder(&lease),
        electors[other].identity,
        "holderIdentity switched"
    );
    assert_eq!(
        spec_transitions(&lease),
        transitions + 1,
        "leaseTransitions counts the takeover"
    );
    assert_eq!(lease.spec.as_ref().unwrap().lease_duration_seconds, Some(3));
    // The takeover came no sooner than a lease duration after the killed leader's last renewal (one clock here).
    let versions = history.of("mc");
    let last_of_killed = versions
        .iter()
        .rev()
        .find(|s| spec_holder(&s.object) == electors[first].identity)
        .expect("versions of the killed leader");
    let takeover = versions
        .iter()
        .find(|s| spec_holder(&s.object) == electors[other].identity)
        .expect("the takeover version");
    let gap = acquire_time(&takeover.object).duration_since(renew_time(&last_of_killed.object));
    assert!(
        gap >= jiff::SignedDuration::from_secs(3),
        "taken over {gap:?} after the last renewal, before the lease expired"
    );
    // Every change of holder in the history is one transition.
    let holders: Vec<(String, i32)> = versions
        .iter()
        .map(|s| (spec_holder(&s.object).to_owned(), spec_transitions(&s.object)))
        .collect();
    for pair in holders.windows(2) {
        let [(h0, t0), (h1, t1)] = pair else {
            unreachable!()
        };
        let expected = if h0 == h1 { *t0 } else { t0 + 1 };
        assert_eq!(*t1, expected, "versions {holders:?}");
    }
    assert_never_two_leaders(&[&electors[0].timeline, &electors[1].timeline]);
    assert_eq!(electors[other].stop().await, LeaderState::Standby);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_shutting_down_releases_and_the_standby_takes_over_at_once() {
    let server = Server::start().await;
    let history = History::start(server.leases()).await;
    // A long lease: without the release, the standby would wait 10 s.
    let settings = LeaderElectionSettings {
        lease_duration: Duration::from_secs(10),
        ..settings()
    };
    let mut electors = [
        Elector::start(&server.client, "mcm", "a", settings),
        Elector::start(&server.client, "mcm", "b", settings),
    ];
    let first = one_leader(&[&electors[0], &electors[1]]).await;
    let other = 1 - first;
    let transitions = spec_transitions(&server.lease("mcm").await);

    let stopping = Instant::now();
    assert_eq!(electors[first].stop().await, LeaderState::Standby);
    takeover(&electors, other).await;
    let took = stopping.elapsed();
    eprintln!("taken over {took:?} after the shutdown began");
    let bound = max_retry(settings) + SLACK;
    assert!(took <= bound, "took over after {took:?}, more than {bound:?}");
    assert!(took < settings.lease_duration / 2, "{took:?}: not at once");

    let lease = server.lease("mcm").await;
    assert_eq!(spec_holder(&lease), electors[other].identity);
    assert_eq!(spec_transitions(&lease), transitions + 1);
    // The release itself: an empty holder, just before the takeover.
    let versions = history.of("mcm");
    let released = versions
        .iter()
        .position(|s| spec_holder(&s.object).is_empty())
        .expect("a released version");
    assert_eq!(
        spec_holder(&versions[released + 1].object),
        electors[other].identity,
        "the release is followed by the takeover"
    );
    assert_never_two_leaders(&[&electors[0].timeline, &electors[1].timeline]);
    assert_eq!(electors[other].stop().await, LeaderState::Standby);
    assert_eq!(
        spec_holder(&server.lease("mcm").await),
        "",
        "the last one releases too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_taken_reports_lost() {
    let server = Server::start().await;
    let settings = settings();
    let mut elector = Elector::start(&server.client, "mc", "a", settings);
    wait_for("a to lead", async || elector.leads().then_some(())).await;

    // Another writer takes the Lease with a fresh renewTime, as a leader with a skewed or broken view might.
    let mut lease = server.lease("mc").await;
    let spec = lease.spec.as_mut().expect("a spec");
    spec.holder_identity = Some("thief".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        jiff::Timestamp::now(),
    ));
    server
        .leases()
        .replace("mc", &PostParams::default(), &lease)
        .await
        .expect("the lease is taken");
    let stolen = Instant::now();
    wait_for("a to report Lost", async || {
        (elector.now() == LeaderState::Lost).then_some(())
    })
    .await;
    let took = stolen.elapsed();
    eprintln!("lost {took:?} after the lease was taken");
    assert!(
        took <= settings.renew_deadline,
        "lost after {took:?}, more than the renew deadline"
    );
    assert_eq!(elector.finished().await, LeaderState::Lost);
    assert!((elector.readiness)().is_err(), "lost is not ready");
    assert_eq!(
        spec_holder(&server.lease("mc").await),
        "thief",
        "the loser does not write over the new holder"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_reach_the_api_server_reports_lost_within_the_renew_deadline() {
    let mut server = Server::start().await;
    let settings = settings();
    let mut elector = Elector::start(&server.client, "mc", "a", settings);
    wait_for("a to lead", async || elector.leads().then_some(())).await;

    let down = Instant::now();
    server.shutdown().await;
    // A newcomer that never reads the Lease does not know its leadership: not ready.
    let newcomer = Elector::start(&server.client, "mc", "newcomer", settings);
    wait_for("a to report Lost", async || {
        (elector.now() == LeaderState::Lost).then_some(())
    })
    .await;
    let took = down.elapsed();
    eprintln!("lost {took:?} after the server began to shut down");
    // A round starts a retry period after the last success and ends at the renew deadline.
    let bound = settings.retry_period + settings.renew_deadline + SLACK;
    assert!(took <= bound, "lost after {took:?}, more than {bound:?}");
    // The last round may have started up to a retry period before the server went down.
    assert!(
        took >= settings.renew_deadline.saturating_sub(settings.retry_period),
        "lost after {took:?}, before the renew deadline"
    );
    assert_eq!(elector.finished().await, LeaderState::Lost);
    assert_eq!(newcomer.now(), LeaderState::Unknown);
    let not_ready = (newcomer.readiness)().unwrap_err();
    assert!(not_ready.contains("not known"), "{not_ready}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_what_kubectl_shows() {
    let server = Server::start().await;
    let identity = leader::default_identity();
    let mut elector = Elector::start(&server.client, "machine-controller", &identity, settings());
    wait_for("the elector to lead", async || elector.leads().then_some(())).await;

    // As kubectl reads it: the raw JSON.
    let get = async || -> Value {
        let request = http::Request::get(format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/machine-controller"
        ))
        .body(Vec::new())
        .expect("a request");
        server.client.request(request).await.expect("the lease is read")
    };
    let first = get().await;
    assert_eq!(first["apiVersion"], "coordination.k8s.io/v1");
    assert_eq!(first["kind"], "Lease");
    let spec = &first["spec"];
    assert_eq!(spec["holderIdentity"], identity.as_str());
    assert_eq!(spec["leaseDurationSeconds"], 3);
    assert_eq!(spec["leaseTransitions"], 0);
    for field in ["acquireTime", "renewTime"] {
        let time = spec[field]
            .as_str()
            .unwrap_or_else(|| panic!("{field} in {spec}"));
        assert!(is_micro_time(time), "{field} {time}: RFC 3339 with microseconds");
    }
    // Renewals move renewTime and keep acquireTime.
    let renewed = wait_for("a renewal", async || {
        let now = get().await;
        (now["spec"]["renewTime"] != spec["renewTime"]).then_some(now)
    })
    .await;
    assert_eq!(renewed["spec"]["acquireTime"], spec["acquireTime"]);
    assert_eq!(renewed["spec"]["holderIdentity"], identity.as_str());
    assert!(renewed["spec"]["renewTime"].as_str().unwrap() > spec["renewTime"].as_str().unwrap());
    assert_eq!(elector.stop().await, LeaderState::Standby);
}

/// `2006-01-02T15:04:05.000000Z`, as Kubernetes writes a MicroTime.
fn is_micro_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 27
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            26 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

#[test]
fn invalid_settings_are_refused_naming_the_flag() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
    let client = Client::try_from(config).unwrap();
    let mut config = Config::new(NAMESPACE, "mc", "a");
    config.settings.renew_deadline = config.settings.lease_duration;
    let Err(err) = LeaderElector::new(client, config) else {
        panic!("refused")
    };
    assert!(err.contains("--leader-elect-lease-duration"), "{err}");
}
