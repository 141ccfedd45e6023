//! The MachineSet controller's decisions (reference §5; spec 002 §12 "Machine Set" and the FAQ "How does MCM prioritize
//! the machines for deletion on scale-down of machinedeployment?").
//!
//! A set keeps `spec.replicas` machines made from its template. The controller observes the set and the machines of
//! its namespace (cache), and calls, in this order:
//!
//! 1. [`claim_machines`]: which machines the set owns, adopts (orphans that match its selector) and releases (owned
//!    machines that no longer match), with the patches of [`adoption_patch`] and [`release_patch`];
//! 2. [`Expectations::observe`] with the machines of the cache, then [`decide`] with the owned machines: the
//!    [`MachineSetPlan`] says which finalizer to add or remove, which machines to patch (template propagation), which
//!    to delete (in [`DeletionOrder`]) and how many to create (in slow-start batches, each one [`machine_to_create`]);
//! 3. after acting, [`status`] with what happened ([`ManageResult`]): a [`SetStatusUpdate`] written only when
//!    [`SetStatusUpdate::changes`] says so, and when to look again so that `minReadySeconds` is honoured without
//!    polling.
//!
//! Everything here is pure: the current time and the random seed of the Random delete policy are parameters.

use std::{
    cmp::{Ordering, Reverse},
    collections::{BTreeMap, BTreeSet},
    fmt,
    str::FromStr,
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use mcm_api::{
    ConditionStatus, GoDuration, Machine, MachineConfiguration, MachinePhase, MachineSet,
    MachineSetCondition, MachineSetConditionType, MachineSetStatus, MachineState, MachineSummary,
    keys::{annotations, extensions, finalizers, labels},
    validation::{self, FieldError},
};
use serde_json::{Map, Value, json};

use crate::{drain::selector_matches, timeouts};

/// The most machines a set creates, or deletes, in one pass (the reference's `BurstReplicas`).
pub const BURST_REPLICAS: usize = 100;

/// The first slow-start batch (the reference's and Kubernetes' `SlowStartInitialBatchSize`).
pub const SLOW_START_INITIAL_BATCH_SIZE: usize = 1;

/// After this long, unmet expectations count as met (Kubernetes' `ExpectationsTimeout`), so that a creation or
/// deletion the cache never shows (for example a machine deleted by someone else before the cache saw it) cannot hold
/// a set for ever.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_mins(5);

/// The deletion priority of a machine without (or with an unreadable) `machinepriority.machine.sapcloud.io`
/// annotation.
pub const DEFAULT_PRIORITY: i64 = 3;

/// `kind` of the owner reference a set puts on its machines.
pub const MACHINE_SET_KIND: &str = "MachineSet";

/// The value of the `freeze` label that stops a set from scaling up (set by the safety controller).
pub const FREEZE_VALUE: &str = "True";

/// Values of `node.machine.sapcloud.io/preserve` that keep a Failed machine while its preservation is being set up.
const PRESERVE_VALUES: [&str; 3] = ["now", "when-failed", "auto-preserved"];

/// The value of `node.machine.sapcloud.io/preserve` set by auto-preservation.
const AUTO_PRESERVED: &str = "auto-preserved";

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

fn name_of(machine: &Machine) -> &str {
    machine.metadata.name.as_deref().unwrap_or_default()
}

fn labels_of(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_LABELS)
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn is_deleting(machine: &Machine) -> bool {
    machine.metadata.deletion_timestamp.is_some()
}

/// Being deleted, or phase Terminating: the machine is on its way out and does not count as one of the set's.
fn is_going(machine: &Machine) -> bool {
    is_deleting(machine) || machine.phase() == Some(MachinePhase::Terminating)
}

fn set_is_deleting(set: &MachineSet) -> bool {
    set.metadata.deletion_timestamp.is_some()
}

fn has_finalizer(meta: &ObjectMeta) -> bool {
    meta.finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizers::MACHINE_CONTROLLER_MANAGER)
}

fn until(now: Timestamp, at: Timestamp) -> Duration {
    timeouts::elapsed(now, at)
}

fn min_duration(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Ownership
// ---------------------------------------------------------------------------------------------------------------------

/// The controller reference of a machine: its owner reference with `controller: true`.
pub fn controller_ref(machine: &Machine) -> Option<&OwnerReference> {
    machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// Whether the set's selector matches the machine's labels. A missing or empty selector matches nothing (the
/// reference: "If a MachineSet with a nil or empty selector creeps in, it should match nothing, not everything").
pub fn selects(set: &MachineSet, machine: &Machine) -> bool {
    let Some(selector) = set.spec.selector.as_ref() else {
        return false;
    };
    let empty = selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && selector.match_expressions.as_ref().is_none_or(Vec::is_empty);
    !empty && selector_matches(selector, labels_of(&machine.metadata))
}

/// What a set does with one machine of its namespace (Kubernetes' `ClaimObject`, which the reference uses through
/// `MachineControllerRefManager`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Claim {
    /// The set controls the machine (and its selector matches, unless the set is being deleted).
    Owned,
    /// An orphan the set should adopt: no controller, selector matches, neither the machine nor the set is being
    /// deleted. It is the set's once [`adoption_patch`] succeeded.
    Adopt,
    /// The set controls the machine but its selector no longer matches: release it with [`release_patch`]. It is no
    /// longer the set's.
    Release,
    /// Not the set's business: another namespace, another controller, or a non-matching orphan.
    Ignore,
}

/// Decides what `set` does with `machine`. Rules (Kubernetes `ClaimObject`):
/// - a machine controlled by another owner (uid) is ignored;
/// - a machine controlled by the set is owned while the selector matches, else released — **except while the set is
///   being deleted**: then every machine it controls is owned, so that the set deletes all of them before its
///   finalizer goes (Kubernetes ignores non-matching machines then and leaves them to the garbage collector, which
///   deletes them after the set is gone);
/// - an orphan is adopted when the selector matches and neither it nor the set is being deleted.
///
/// A set without a uid (never stored) owns nothing. Before adopting, the controller must re-read the set from the API
/// server and check its uid and that it is not being deleted (Kubernetes' `RecheckDeletionTimestamp`): a cache may
/// still show a set that is gone.
pub fn claim(set: &MachineSet, machine: &Machine) -> Claim {
    if machine.metadata.namespace.as_deref().unwrap_or_default()
        != set.metadata.namespace.as_deref().unwrap_or_default()
    {
        return Claim::Ignore;
    }
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        return Claim::Ignore;
    }
    match controller_ref(machine) {
        Some(owner) if owner.uid == uid => {
            if set_is_deleting(set) || selects(set, machine) {
                Claim::Owned
            } else {
                Claim::Release
            }
        }
        Some(_) => Claim::Ignore,
        None if set_is_deleting(set) || is_deleting(machine) || !selects(set, machine) => Claim::Ignore,
        None => Claim::Adopt,
    }
}

/// The machines of a namespace sorted by [`claim`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claims<'a> {
    /// Machines the set controls.
    pub owned: Vec<&'a Machine>,
    /// Orphans to adopt; add each to the owned ones once its adoption patch succeeded.
    pub adopt: Vec<&'a Machine>,
    /// Machines to release; they are not the set's.
    pub release: Vec<&'a Machine>,
}

/// Sorts the machines of the set's namespace (any others are ignored) by [`claim`].
pub fn claim_machines<'a>(set: &MachineSet, machines: impl IntoIterator<Item = &'a Machine>) -> Claims<'a> {
    let mut claims = Claims::default();
    for machine in machines {
        match claim(set, machine) {
            Claim::Owned => claims.owned.push(machine),
            Claim::Adopt => claims.adopt.push(machine),
            Claim::Release => claims.release.push(machine),
            Claim::Ignore => {}
        }
    }
    claims
}

/// The owner reference a set puts on its machines: `machine.sapcloud.io/v1alpha1` `MachineSet`, its name and uid,
/// `controller: true`, `blockOwnerDeletion: true` (as the reference).
pub fn owner_reference(set: &MachineSet) -> OwnerReference {
    OwnerReference {
        api_version: mcm_api::API_VERSION.to_owned(),
        kind: MACHINE_SET_KIND.to_owned(),
        name: set.metadata.name.clone().unwrap_or_default(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn owner_references_patch(machine: &Machine, references: Vec<OwnerReference>) -> Value {
    let references = if references.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(references).unwrap_or(Value::Null)
    };
    let mut metadata = Map::new();
    metadata.insert("ownerReferences".into(), references);
    if let Some(rv) = &machine.metadata.resource_version {
        metadata.insert("resourceVersion".into(), json!(rv));
    }
    json!({ "metadata": metadata })
}

/// The JSON merge patch that adopts `machine`: its owner references with the set's [`owner_reference`] added. A merge
/// patch replaces a list whole, so the patch carries every reference and the machine's `metadata.resourceVersion`: if
/// the machine changed meanwhile (another controller adopted it), the API server answers 409 and nothing is lost.
pub fn adoption_patch(set: &MachineSet, machine: &Machine) -> Value {
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    let mut references: Vec<OwnerReference> = machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != uid)
        .cloned()
        .collect();
    references.push(owner_reference(set));
    owner_references_patch(machine, references)
}

/// The JSON merge patch that releases `machine`: its owner references without the set's (the field removed when none
/// is left), with `metadata.resourceVersion` as in [`adoption_patch`].
pub fn release_patch(set: &MachineSet, machine: &Machine) -> Value {
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    let references: Vec<OwnerReference> = machine
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != uid)
        .cloned()
        .collect();
    owner_references_patch(machine, references)
}

// ---------------------------------------------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------------------------------------------

/// What a set controller asked the API server for and its cache does not show yet (Kubernetes'
/// `UIDTrackingControllerExpectations`). The controller keeps one per set, in memory; [`decide`] creates and deletes
/// nothing while they are not met, so a cache that lags behind the controller's own writes never makes the set
/// create a machine twice or delete one too many. (The reference tracks expectations but its check is commented out,
/// "TODO: Fix working of expectations".)
///
/// Creations are tracked by the name the API server gave the machine (`generateName`), deletions by name. Both are
/// observed from the cache's state ([`Expectations::observe`]), not counted from events, so a missed or repeated
/// event cannot skew them. A creation whose outcome is unknown (the call timed out) is tracked without a name and
/// only the timeout ends it. After [`EXPECTATIONS_TIMEOUT`] since the last expectation was raised they count as met.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expectations {
    creations: BTreeSet<String>,
    unknown_creations: usize,
    deletions: BTreeSet<String>,
    raised_at: Option<Timestamp>,
}

impl Expectations {
    /// No expectations.
    pub fn new() -> Self {
        Self::default()
    }

    fn raise(&mut self, now: Timestamp) {
        self.raised_at = Some(self.raised_at.map_or(now, |at| at.max(now)));
    }

    /// The API server created machine `name` for the set (after a successful create call).
    pub fn expect_creation(&mut self, name: impl Into<String>, now: Timestamp) {
        self.creations.insert(name.into());
        self.raise(now);
    }

    /// A create call whose outcome is unknown (for example a timeout: the machine may exist). Only the timeout ends
    /// this expectation, so the set waits rather than risk a second machine.
    pub fn expect_unknown_creation(&mut self, now: Timestamp) {
        self.unknown_creations += 1;
        self.raise(now);
    }

    /// The controller is about to delete machine `name` (raise it before the call).
    pub fn expect_deletion(&mut self, name: impl Into<String>, now: Timestamp) {
        self.deletions.insert(name.into());
        self.raise(now);
    }

    /// The delete call for `name` failed (other than NotFound): the cache will not show it, so stop waiting for it.
    pub fn deletion_failed(&mut self, name: &str) {
        self.deletions.remove(name);
    }

    /// Observes the cache: `machines` are the machines of the set's namespace as the cache holds them. A creation is
    /// met when a machine of that name is there; a deletion when the machine is not there any more or is being
    /// deleted.
    pub fn observe<'a>(&mut self, machines: impl IntoIterator<Item = &'a Machine>) {
        let mut present: BTreeMap<&str, bool> = BTreeMap::new();
        for machine in machines {
            present.insert(name_of(machine), is_deleting(machine));
        }
        self.creations.retain(|name| !present.contains_key(name.as_str()));
        self.deletions
            .retain(|name| present.get(name.as_str()).is_some_and(|deleting| !deleting));
        if self.is_empty() {
            self.raised_at = None;
        }
    }

    /// The cache reported machine `name` deleted (a watch event): both a creation and a deletion of it are met.
    pub fn observe_gone(&mut self, name: &str) {
        self.creations.remove(name);
        self.deletions.remove(name);
        if self.is_empty() {
            self.raised_at = None;
        }
    }

    /// The names of the machines whose creation or deletion is awaited: with the set's own machines, all that
    /// [`Expectations::observe`] needs to see (a caller with an index need not pass every machine).
    pub fn awaited(&self) -> impl Iterator<Item = &str> {
        self.creations.iter().chain(&self.deletions).map(String::as_str)
    }

    /// Nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.creations.is_empty() && self.unknown_creations == 0 && self.deletions.is_empty()
    }

    /// Creations not seen yet (named and unknown).
    pub fn pending_creations(&self) -> usize {
        self.creations.len() + self.unknown_creations
    }

    /// Deletions not seen yet.
    pub fn pending_deletions(&self) -> usize {
        self.deletions.len()
    }

    /// When pending expectations stop holding the set.
    pub fn expires_at(&self) -> Option<Timestamp> {
        if self.is_empty() {
            return None;
        }
        self.raised_at.map(|at| timeouts::add(at, EXPECTATIONS_TIMEOUT))
    }

    /// Whether the set may act: nothing pending, or the pending expectations expired.
    pub fn satisfied(&self, now: Timestamp) -> bool {
        self.expires_at().is_none_or(|at| now >= at)
    }

    /// Drops expired expectations; returns whether it did.
    pub fn expire(&mut self, now: Timestamp) -> bool {
        if !self.is_empty() && self.satisfied(now) {
            *self = Self::default();
            true
        } else {
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Deletion order
// ---------------------------------------------------------------------------------------------------------------------

/// A delete policy (Cluster API's `deletePolicy`, here the annotation `machine.sapcloud.io/delete-policy` on a
/// MachineSet or its MachineDeployment). It decides among machines that preservation, priority and the
/// marked-for-deletion time do not tell apart; see [`DeletionOrder`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeletePolicy {
    /// Unhealthy machines first, then in an order drawn from the seed.
    Random,
    /// Unhealthy machines first, then the newest.
    Newest,
    /// Unhealthy machines first, then the oldest.
    Oldest,
}

impl DeletePolicy {
    /// Every policy.
    pub const ALL: [Self; 3] = [Self::Random, Self::Newest, Self::Oldest];

    /// The annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Random => "Random",
            Self::Newest => "Newest",
            Self::Oldest => "Oldest",
        }
    }
}

impl fmt::Display for DeletePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a delete policy was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicySource {
    /// The MachineDeployment's annotation (passed in by the controller).
    MachineDeployment,
    /// The MachineSet's annotation.
    MachineSet,
}

impl fmt::Display for PolicySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::MachineDeployment => "MachineDeployment",
            Self::MachineSet => "MachineSet",
        })
    }
}

/// An unknown delete policy value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{source_kind} annotation {key}: unsupported value {value:?}: supported values: \"Random\", \"Newest\", \
     \"Oldest\"; the default deletion order is used",
    key = extensions::DELETE_POLICY
)]
pub struct DeletePolicyError {
    /// The value as written.
    pub value: String,
    /// Where it was written.
    pub source_kind: PolicySource,
}

impl FromStr for DeletePolicy {
    type Err = String;

    /// Parses `Random`, `Newest` or `Oldest`, ignoring ASCII case and surrounding blanks.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let value = value.trim();
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(value))
            .ok_or_else(|| value.to_owned())
    }
}

/// The delete policy of a set: the deployment's annotation value when the controller passes one (the set's annotation
/// is a copy of it that may lag behind), else the set's own annotation; `Ok(None)` when neither is set (the reference's
/// order). An unknown value is an error (report it as an event) and the caller uses the reference's order.
pub fn delete_policy(
    set: &MachineSet,
    deployment_annotation: Option<&str>,
) -> Result<Option<DeletePolicy>, DeletePolicyError> {
    let (value, source_kind) = match (
        deployment_annotation,
        annotation(&set.metadata, extensions::DELETE_POLICY),
    ) {
        (Some(value), _) => (value, PolicySource::MachineDeployment),
        (None, Some(value)) => (value, PolicySource::MachineSet),
        (None, None) => return Ok(None),
    };
    value
        .parse()
        .map(Some)
        .map_err(|value| DeletePolicyError { value, source_kind })
}

/// The reference's rank of a phase on scale-down (`ActiveMachines.Less`): lower goes first. Terminating 0, Failed 1,
/// CrashLoopBackOff 2, Unknown 3, Pending 4, Available 5, Running 6; any other phase (none yet, in-place phases) 0,
/// "so brand-new machines are deleted first".
pub fn phase_rank(phase: Option<MachinePhase>) -> u8 {
    match phase {
        Some(MachinePhase::Failed) => 1,
        Some(MachinePhase::CrashLoopBackOff) => 2,
        Some(MachinePhase::Unknown) => 3,
        Some(MachinePhase::Pending) => 4,
        Some(MachinePhase::Available) => 5,
        Some(MachinePhase::Running) => 6,
        _ => 0,
    }
}

/// The machine's deletion priority: `machinepriority.machine.sapcloud.io` as an integer, [`DEFAULT_PRIORITY`] when it
/// is absent or not an integer (as the reference, which logs and uses 3).
pub fn priority(machine: &Machine) -> i64 {
    annotation(&machine.metadata, annotations::MACHINE_PRIORITY)
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_PRIORITY)
}

fn parse_time(value: &str) -> Option<Timestamp> {
    value.trim().parse().ok()
}

/// When the machine was marked for deletion (`machine.sapcloud.io/marked-for-deletion-time`, RFC 3339); `None` when
/// absent or unreadable.
pub fn marked_for_deletion_at(machine: &Machine) -> Option<Timestamp> {
    annotation(&machine.metadata, annotations::MARKED_FOR_DELETION_TIME).and_then(parse_time)
}

fn preserve_expiry(machine: &Machine) -> Option<Timestamp> {
    machine
        .status
        .as_ref()
        .and_then(|s| s.current_status.preserve_expiry_time.as_ref())
        .map(|t| t.0)
}

/// Whether the machine is preserved: its `preserveExpiryTime` lies after `now` (reference §3.8).
pub fn is_preserved(machine: &Machine, now: Timestamp) -> bool {
    preserve_expiry(machine).is_some_and(|t| t > now)
}

/// Whether a Failed machine is kept rather than deleted and replaced (the reference's
/// `shouldFailedMachineBeTerminated`, negated): preserved until a future `preserveExpiryTime`; with no expiry time
/// yet, while the effective preserve value is `now`, `when-failed` or `auto-preserved` (preservation being set up).
/// The effective value is the last value applied from the node
/// (`node.machine.sapcloud.io/last-applied-node-preserve-value`) when there is one, else the machine's own
/// `node.machine.sapcloud.io/preserve` annotation. An expired preservation does not keep it.
pub fn keeps_failed_machine(machine: &Machine, now: Timestamp) -> bool {
    if let Some(expiry) = preserve_expiry(machine) {
        return expiry > now;
    }
    let from_node = annotation(&machine.metadata, annotations::LAST_APPLIED_NODE_PRESERVE_VALUE)
        .filter(|v| !v.is_empty());
    let value = from_node.or_else(|| annotation(&machine.metadata, annotations::PRESERVE));
    value.is_some_and(|v| PRESERVE_VALUES.contains(&v))
}

/// Preservation criterion: not preserved first, then auto-preserved, then explicitly preserved; earlier expiry first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PreservationRank {
    NotPreserved,
    AutoPreserved(Timestamp),
    Preserved(Timestamp),
}

/// Marked-for-deletion criterion: marked first, the older mark first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum MarkRank {
    Marked(Timestamp),
    Unmarked,
}

/// What the delete policy decides among otherwise equal machines.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PolicyRank {
    Oldest(Option<Timestamp>),
    Newest(Reverse<Option<Timestamp>>),
    Random(u64),
}

/// The last criteria: the reference's (phase rank, then older first) or a delete policy's (unhealthy first, then
/// the policy). One order uses one variant for every machine.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TailRank {
    Reference {
        phase_rank: u8,
        created: Option<Timestamp>,
    },
    Policy {
        healthy: bool,
        rank: PolicyRank,
    },
}

/// A machine's place in a [`DeletionOrder`]: machines with smaller keys are deleted first. Keys are totally ordered;
/// two machines compare equal only if they have the same name and uid.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeletionKey {
    preservation: PreservationRank,
    priority: i64,
    mark: MarkRank,
    tail: TailRank,
    name: String,
    uid: String,
}

/// The order in which a set deletes machines on scale-down (earliest first). The criteria, in order:
///
/// 1. **preservation** (reference §5 ActiveMachines.Less, 1): "Preserved machines (expiry time in the future) are
///    deleted last. Among preserved machines, auto-preserved ones go before explicitly preserved ones, and an earlier
///    expiry goes first."
/// 2. **priority** (2): "Lower `machinepriority.machine.sapcloud.io` goes first. The default is 3, and
///    cluster-autoscaler sets 1."
/// 3. **marked for deletion** (3): "Both have a `marked-for-deletion-time` ⇒ the older one goes first. A machine that
///    has the annotation goes before one that does not."
/// 4. without a delete policy, the reference's last criteria: **phase rank** ([`phase_rank`], 4) and then "An
///    **older** creationTimestamp goes first" (5);
///    with a [`DeletePolicy`], instead: machines that are not healthy (phase other than Running or Available: new,
///    Pending, CrashLoopBackOff, Unknown, Failed, Terminating, in-place) before healthy ones, and among those the
///    policy: `Oldest` the oldest first, `Newest` the newest first, `Random` an order drawn from the seed (a hash of
///    the seed and the machine's name and uid, so it does not depend on the input order).
/// 5. name, then uid, so that the order is total and deterministic.
///
/// A missing creationTimestamp counts as the oldest (Go's zero time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeletionOrder {
    /// The delete policy; `None` is the reference's order.
    pub policy: Option<DeletePolicy>,
    /// The seed of the Random policy.
    pub seed: u64,
    /// Now, which decides what is preserved.
    pub now: Timestamp,
}

impl DeletionOrder {
    /// An order with the given policy, seed and time.
    pub fn new(policy: Option<DeletePolicy>, seed: u64, now: Timestamp) -> Self {
        Self { policy, seed, now }
    }

    /// The machine's key in this order.
    pub fn key(&self, machine: &Machine) -> DeletionKey {
        let preservation = match preserve_expiry(machine) {
            Some(expiry) if expiry > self.now => {
                if annotation(&machine.metadata, annotations::PRESERVE) == Some(AUTO_PRESERVED) {
                    PreservationRank::AutoPreserved(expiry)
                } else {
                    PreservationRank::Preserved(expiry)
                }
            }
            _ => PreservationRank::NotPreserved,
        };
        let mark = marked_for_deletion_at(machine).map_or(MarkRank::Unmarked, MarkRank::Marked);
        let created = timeouts::created_at(machine);
        let tail = match self.policy {
            None => TailRank::Reference {
                phase_rank: phase_rank(machine.phase()),
                created,
            },
            Some(policy) => TailRank::Policy {
                healthy: matches!(
                    machine.phase(),
                    Some(MachinePhase::Running | MachinePhase::Available)
                ),
                rank: match policy {
                    DeletePolicy::Oldest => PolicyRank::Oldest(created),
                    DeletePolicy::Newest => PolicyRank::Newest(Reverse(created)),
                    DeletePolicy::Random => PolicyRank::Random(random_rank(self.seed, machine)),
                },
            },
        };
        DeletionKey {
            preservation,
            priority: priority(machine),
            mark,
            tail,
            name: name_of(machine).to_owned(),
            uid: machine.metadata.uid.clone().unwrap_or_default(),
        }
    }

    /// Compares two machines: `Less` means `a` is deleted before `b`.
    pub fn compare(&self, a: &Machine, b: &Machine) -> Ordering {
        self.key(a).cmp(&self.key(b))
    }

    /// Sorts machines into deletion order, first to delete first.
    pub fn sort(&self, machines: &mut [&Machine]) {
        machines.sort_by_cached_key(|m| self.key(m));
    }
}

/// FNV-1a over the name and uid, mixed with the seed by SplitMix64's finalizer: a well-spread number per machine that
/// depends only on the seed and the machine.
fn random_rank(seed: u64, machine: &Machine) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let uid = machine.metadata.uid.as_deref().unwrap_or_default();
    for byte in name_of(machine)
        .bytes()
        .chain(std::iter::once(0))
        .chain(uid.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = hash ^ seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------------------------------------------------
// The plan
// ---------------------------------------------------------------------------------------------------------------------

/// What [`decide`] looks at.
#[derive(Clone, Copy, Debug)]
pub struct MachineSetInput<'a> {
    /// The set, as read (the reference GETs it from the API server).
    pub set: &'a MachineSet,
    /// The machines the set owns ([`Claims::owned`] plus those adopted successfully), from the cache.
    pub machines: &'a [&'a Machine],
    /// The set's expectations, after [`Expectations::observe`] on the cache.
    pub expectations: &'a Expectations,
    /// The `machine.sapcloud.io/delete-policy` annotation of the set's MachineDeployment, when it has one.
    pub deployment_delete_policy: Option<&'a str>,
    /// Now.
    pub now: Timestamp,
    /// The seed of the Random delete policy (any number; a new one per pass is fine).
    pub random: u64,
}

/// Why a machine is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeletionReason {
    /// The set has more machines than `spec.replicas` (picked in [`DeletionOrder`]).
    ScaleDown,
    /// The cluster-autoscaler marked it (priority `1`, marked before the set's
    /// `last-deployment-replica-change-by-scaler-time`; reference §6.5).
    MarkedByAutoscaler,
    /// The machine is Failed and not preserved: it is replaced.
    Failed,
    /// The set is being deleted: all its machines go first.
    SetDeleted,
}

impl DeletionReason {
    /// A short name for events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ScaleDown => "ScaleDown",
            Self::MarkedByAutoscaler => "MarkedByAutoscaler",
            Self::Failed => "Failed",
            Self::SetDeleted => "SetDeleted",
        }
    }
}

/// A machine to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineDeletion {
    /// The machine's name.
    pub name: String,
    /// Why.
    pub reason: DeletionReason,
}

/// A patch for an existing machine (template propagation).
#[derive(Clone, Debug, PartialEq)]
pub struct MachinePatch {
    /// The machine's name.
    pub name: String,
    /// The JSON merge patch.
    pub patch: Value,
}

/// Why the plan does less than the replica count asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The set is invalid: nothing is created or deleted (report the errors on the set and as an event).
    Invalid(Vec<FieldError>),
    /// Creations or deletions are not in the cache yet: nothing is created or deleted until they are, or until
    /// `until`.
    ExpectationsPending {
        /// Creations not seen yet.
        creations: usize,
        /// Deletions not seen yet.
        deletions: usize,
        /// When they stop holding the set.
        until: Timestamp,
    },
    /// The set carries `freeze=True` (safety controller): it does not scale up; deletions go on.
    Frozen {
        /// Machines missing.
        missing: usize,
    },
    /// The set carries `node.machine.sapcloud.io/scale-up-disabled`: it does not scale up.
    ScaleUpDisabled {
        /// Machines missing.
        missing: usize,
    },
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid(errors) => write!(f, "invalid: {}", validation::summarize(errors)),
            Self::ExpectationsPending {
                creations,
                deletions,
                until,
            } => write!(
                f,
                "waiting for {creations} creation(s) and {deletions} deletion(s) to show in the cache (at most until \
                 {until})"
            ),
            Self::Frozen { missing } => write!(
                f,
                "frozen by the safety controller (label {}={FREEZE_VALUE}): {missing} machine(s) not created",
                labels::FREEZE
            ),
            Self::ScaleUpDisabled { missing } => write!(
                f,
                "scale-up disabled (label {}): {missing} machine(s) not created",
                labels::SCALE_UP_DISABLED
            ),
        }
    }
}

/// What the set controller does in one pass. Act in this order: add the finalizer; apply `propagate`; delete
/// (raise [`Expectations::expect_deletion`] before each call, [`Expectations::deletion_failed`] after a failed one;
/// NotFound counts as done); create `create` machines ([`machine_to_create`]) batch by batch as in
/// `create_batches`, stopping after the first batch with an error, and raise [`Expectations::expect_creation`] with
/// the name of each created machine; remove the finalizer; then [`status`].
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use]
pub struct MachineSetPlan {
    /// Add `machine.sapcloud.io/machine-controller-manager` to the set.
    pub add_finalizer: bool,
    /// The set is being deleted and no machine of it is left: remove the finalizer.
    pub remove_finalizer: bool,
    /// Machines to create now.
    pub create: usize,
    /// Slow-start batches of `create` (1, 2, 4, …).
    pub create_batches: Vec<usize>,
    /// Machines to delete, in order.
    pub delete: Vec<MachineDeletion>,
    /// Template propagation to existing machines.
    pub propagate: Vec<MachinePatch>,
    /// Why less is done than the replica count asks.
    pub holds: Vec<Hold>,
    /// The delete policy in force.
    pub delete_policy: Option<DeletePolicy>,
    /// An unusable delete policy annotation (report it; the reference's order is used).
    pub policy_problem: Option<DeletePolicyError>,
    /// When to look again (expectations expiring, a preserved Failed machine's preservation ending); `None`: on
    /// the next change.
    pub requeue_after: Option<Duration>,
}

/// The slow-start batch sizes for `count` creations (the reference's and Kubernetes' `slowStartBatch`): the first
/// batch has `initial` calls and each next batch twice as many, the last one what is left. The controller stops after
/// the first batch with an error, so a quota or a wrong template costs one call, not `count`.
pub fn slow_start_batches(count: usize, initial: usize) -> Vec<usize> {
    let mut batches = Vec::new();
    let mut remaining = count;
    let mut size = remaining.min(initial.max(1));
    while size > 0 {
        batches.push(size);
        remaining -= size;
        size = remaining.min(size.saturating_mul(2));
    }
    batches
}

/// The machines the cluster-autoscaler marked for deletion (reference `getMachinesMarkedForDeletion`): priority
/// annotation exactly `1` and a `marked-for-deletion-time` at or before the set's
/// `last-deployment-replica-change-by-scaler-time`. None when the set has no (readable) such time.
pub fn marked_by_autoscaler<'a>(set: &MachineSet, machines: &[&'a Machine]) -> Vec<&'a Machine> {
    let Some(changed_at) =
        annotation(&set.metadata, annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME).and_then(parse_time)
    else {
        return Vec::new();
    };
    machines
        .iter()
        .copied()
        .filter(|m| annotation(&m.metadata, annotations::MACHINE_PRIORITY) == Some("1"))
        .filter(|m| marked_for_deletion_at(m).is_some_and(|at| at <= changed_at))
        .collect()
}

/// Decides one pass of the set controller; see [`MachineSetPlan`] for how to act on it.
///
/// - **Being deleted**: every machine not yet being deleted is deleted (reference: "delete all child machines, then
///   remove the finalizer once none remain"); the finalizer goes when no machine is left. Validation and
///   expectations do not hold a deletion.
/// - **Invalid** (`mcm_api::validation`): nothing is created, deleted or patched.
/// - Otherwise the finalizer is added and the template propagated ([`propagation_patch`]); while
///   [`Expectations::satisfied`] is false nothing is created or deleted.
/// - **Counting** (reference §5 manageReplicas, "Terminating machines do not count"): machines being deleted or
///   Terminating do not count; Failed machines that are not kept ([`keeps_failed_machine`]) are deleted and do not
///   count, so their replacements are created in the same pass; machines marked by the cluster-autoscaler
///   ([`marked_by_autoscaler`]) are deleted and do not count. The rest are the active machines.
/// - **Scale up**: `replicas − active` machines (at most [`BURST_REPLICAS`]) in [`slow_start_batches`], unless the
///   set carries `freeze=True` or `node.machine.sapcloud.io/scale-up-disabled` (deletions go on).
/// - **Scale down**: the first `active − replicas` active machines (at most [`BURST_REPLICAS`]) in
///   [`DeletionOrder`] with the set's delete policy ([`delete_policy`]).
/// - At most [`BURST_REPLICAS`] deletions per pass: scale-down first, then marked, then Failed (the reference's order).
pub fn decide(input: &MachineSetInput<'_>) -> MachineSetPlan {
    let set = input.set;
    let now = input.now;
    let mut plan = MachineSetPlan::default();
    match delete_policy(set, input.deployment_delete_policy) {
        Ok(policy) => plan.delete_policy = policy,
        Err(problem) => plan.policy_problem = Some(problem),
    }
    let order = DeletionOrder::new(plan.delete_policy, input.random, now);

    if set_is_deleting(set) {
        let mut remaining: Vec<&Machine> = input
            .machines
            .iter()
            .copied()
            .filter(|m| !is_deleting(m))
            .collect();
        order.sort(&mut remaining);
        plan.delete = remaining
            .iter()
            .map(|m| MachineDeletion {
                name: name_of(m).to_owned(),
                reason: DeletionReason::SetDeleted,
            })
            .collect();
        plan.remove_finalizer = input.machines.is_empty() && has_finalizer(&set.metadata);
        return plan;
    }

    let errors = validation::validate_machine_set(set);
    if !errors.is_empty() {
        plan.holds.push(Hold::Invalid(errors));
        return plan;
    }
    plan.add_finalizer = !has_finalizer(&set.metadata);
    plan.propagate = input
        .machines
        .iter()
        .filter_map(|m| {
            propagation_patch(set, m).map(|patch| MachinePatch {
                name: name_of(m).to_owned(),
                patch,
            })
        })
        .collect();
    // A preserved Failed machine is deleted when its preservation ends.
    plan.requeue_after = input
        .machines
        .iter()
        .filter(|m| !is_going(m) && m.phase() == Some(MachinePhase::Failed))
        .filter_map(|m| preserve_expiry(m).filter(|t| *t > now))
        .map(|t| until(now, t))
        .min();

    if !input.expectations.satisfied(now) {
        let until_at = input.expectations.expires_at().unwrap_or(now);
        plan.holds.push(Hold::ExpectationsPending {
            creations: input.expectations.pending_creations(),
            deletions: input.expectations.pending_deletions(),
            until: until_at,
        });
        plan.requeue_after = min_duration(plan.requeue_after, Some(until(now, until_at)));
        return plan;
    }
    manage_replicas(input, &order, &mut plan);
    plan
}

/// Scale up or down, Failed and marked machines (the part of [`decide`] held by expectations).
fn manage_replicas(input: &MachineSetInput<'_>, order: &DeletionOrder, plan: &mut MachineSetPlan) {
    let set = input.set;
    let now = input.now;
    let not_going: Vec<&Machine> = input.machines.iter().copied().filter(|m| !is_going(m)).collect();
    let failed: Vec<&Machine> = not_going
        .iter()
        .copied()
        .filter(|m| m.phase() == Some(MachinePhase::Failed) && !keeps_failed_machine(m, now))
        .collect();
    let active: Vec<&Machine> = not_going
        .iter()
        .copied()
        .filter(|m| !failed.iter().any(|f| std::ptr::eq(*f, *m)))
        .collect();
    let marked = marked_by_autoscaler(set, &active);
    let mut remaining: Vec<&Machine> = active
        .iter()
        .copied()
        .filter(|m| !marked.iter().any(|x| std::ptr::eq(*x, *m)))
        .collect();
    let replicas = usize::try_from(set.spec.replicas).unwrap_or(0);

    let mut deletions: Vec<MachineDeletion> = Vec::new();
    if remaining.len() < replicas {
        let missing = replicas - remaining.len();
        let set_labels = labels_of(&set.metadata);
        if set_labels.get(labels::FREEZE).map(String::as_str) == Some(FREEZE_VALUE) {
            plan.holds.push(Hold::Frozen { missing });
        } else if set_labels.contains_key(labels::SCALE_UP_DISABLED) {
            plan.holds.push(Hold::ScaleUpDisabled { missing });
        } else {
            plan.create = missing.min(BURST_REPLICAS);
            plan.create_batches = slow_start_batches(plan.create, SLOW_START_INITIAL_BATCH_SIZE);
        }
    } else if remaining.len() > replicas {
        let excess = (remaining.len() - replicas).min(BURST_REPLICAS);
        order.sort(&mut remaining);
        deletions.extend(remaining[..excess].iter().map(|m| MachineDeletion {
            name: name_of(m).to_owned(),
            reason: DeletionReason::ScaleDown,
        }));
    }
    let mut marked = marked;
    order.sort(&mut marked);
    deletions.extend(marked.iter().map(|m| MachineDeletion {
        name: name_of(m).to_owned(),
        reason: DeletionReason::MarkedByAutoscaler,
    }));
    let mut failed = failed;
    order.sort(&mut failed);
    deletions.extend(failed.iter().map(|m| MachineDeletion {
        name: name_of(m).to_owned(),
        reason: DeletionReason::Failed,
    }));
    let mut seen = BTreeSet::new();
    deletions.retain(|d| seen.insert(d.name.clone()));
    deletions.truncate(BURST_REPLICAS);
    plan.delete = deletions;
}

// ---------------------------------------------------------------------------------------------------------------------
// The machine to create, and propagation
// ---------------------------------------------------------------------------------------------------------------------

/// The effective creation timeout the set hands to its machines: the set's
/// `node.machine.sapcloud.io/effective-creation-timeout` annotation (copied from its MachineDeployment), else the
/// template's.
pub fn effective_creation_timeout(set: &MachineSet) -> Option<&str> {
    annotation(&set.metadata, annotations::EFFECTIVE_CREATION_TIMEOUT).or_else(|| {
        set.spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| annotation(m, annotations::EFFECTIVE_CREATION_TIMEOUT))
    })
}

/// The `generateName` of the set's machines: `<set-name>-` (the reference's `getMachinesPrefix`; the name alone if the
/// dash would make it longer than a DNS subdomain may be).
pub fn generate_name(set: &MachineSet) -> String {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    if name.len() < 253 {
        format!("{name}-")
    } else {
        name.to_owned()
    }
}

/// The machine to create for `set`, complete so that it needs no second write: `generateName` `<set-name>-`, the set's
/// namespace, the template's labels and annotations (plus the set's effective creation timeout annotation), the
/// template's finalizers plus `machine.sapcloud.io/machine-controller-manager`, the set's [`owner_reference`], and the
/// template's spec — without `providerID`, which the machine controller sets once for the machine's own VM.
pub fn machine_to_create(set: &MachineSet) -> Machine {
    let template = &set.spec.template;
    let meta = template.metadata.as_ref();
    let labels = meta.and_then(|m| m.labels.clone()).filter(|l| !l.is_empty());
    let mut machine_annotations = meta.and_then(|m| m.annotations.clone()).unwrap_or_default();
    if let Some(timeout) = effective_creation_timeout(set) {
        machine_annotations.insert(
            annotations::EFFECTIVE_CREATION_TIMEOUT.to_owned(),
            timeout.to_owned(),
        );
    }
    let mut machine_finalizers = meta.and_then(|m| m.finalizers.clone()).unwrap_or_default();
    if !machine_finalizers
        .iter()
        .any(|f| f == finalizers::MACHINE_CONTROLLER_MANAGER)
    {
        machine_finalizers.push(finalizers::MACHINE_CONTROLLER_MANAGER.to_owned());
    }
    let mut spec = template.spec.clone();
    spec.provider_id.clear();
    Machine {
        metadata: ObjectMeta {
            generate_name: Some(generate_name(set)),
            namespace: set.metadata.namespace.clone(),
            labels,
            annotations: (!machine_annotations.is_empty()).then_some(machine_annotations),
            finalizers: Some(machine_finalizers),
            owner_references: Some(vec![owner_reference(set)]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// The duration fields of [`MachineConfiguration`] (JSON names), compared by value in [`propagation_patch`].
const DURATION_FIELDS: [&str; 5] = [
    "drainTimeout",
    "healthTimeout",
    "creationTimeout",
    "inPlaceUpdateTimeout",
    "machinePreserveTimeout",
];

fn configuration_view(config: &MachineConfiguration) -> Map<String, Value> {
    match serde_json::to_value(config) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// The part of a machine the set propagates, as JSON: `metadata.annotations` with only the effective creation timeout,
/// and `spec` with `nodeTemplate`, the configuration fields and `class.kind`.
fn propagated_view(
    timeout: Option<&str>,
    node_template: Option<&mcm_api::NodeTemplateSpec>,
    config: Map<String, Value>,
    class_kind: &str,
) -> Value {
    let mut machine_annotations = Map::new();
    if let Some(timeout) = timeout {
        machine_annotations.insert(annotations::EFFECTIVE_CREATION_TIMEOUT.into(), json!(timeout));
    }
    let mut spec = config;
    if let Some(template) = node_template {
        spec.insert(
            "nodeTemplate".into(),
            serde_json::to_value(template).unwrap_or(Value::Null),
        );
    }
    let mut class = Map::new();
    if !class_kind.is_empty() {
        class.insert("kind".into(), json!(class_kind));
    }
    spec.insert("class".into(), Value::Object(class));
    json!({ "metadata": { "annotations": machine_annotations }, "spec": spec })
}

/// The RFC 7386 merge patch that turns `old` into `new`: objects are diffed key by key (a key `new` lacks becomes
/// `null`), anything else is replaced whole. `None` when they are equal.
pub(crate) fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = Map::new();
            for (key, value) in new {
                match old.get(key) {
                    Some(previous) => {
                        if let Some(diff) = merge_diff(previous, value) {
                            patch.insert(key.clone(), diff);
                        }
                    }
                    None => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            for key in old.keys() {
                if !new.contains_key(key) {
                    patch.insert(key.clone(), Value::Null);
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

fn same_duration(a: &Value, b: &Value) -> bool {
    match (a.as_str(), b.as_str()) {
        (Some(a), Some(b)) => matches!(
            (GoDuration::new(a).parse(), GoDuration::new(b).parse()),
            (Ok(x), Ok(y)) if x == y
        ),
        _ => false,
    }
}

/// The minimal JSON merge patch that brings an existing machine in line with the set's template without replacing
/// it (the reference's `syncMachinesNodeTemplates`, `syncMachinesConfig`, `syncMachinesClassKind`, plus the effective
/// creation timeout of [`effective_creation_timeout`]): `spec.nodeTemplate`, the machine configuration (timeouts,
/// `maxEvictRetries`, `nodeConditions`, `disableHealthTimeout`), `spec.class.kind`, and the annotation
/// `node.machine.sapcloud.io/effective-creation-timeout` (removed when the set has none). `None` when the machine
/// already matches, or is not active (being deleted, Terminating or Failed: the reference skips inactive machines).
/// Durations equal in value (`10m` and `10m0s`) count as equal.
pub fn propagation_patch(set: &MachineSet, machine: &Machine) -> Option<Value> {
    if is_going(machine) || machine.phase() == Some(MachinePhase::Failed) {
        return None;
    }
    let template = &set.spec.template.spec;
    let old_config = configuration_view(&machine.spec.configuration);
    let mut new_config = configuration_view(&template.configuration);
    for field in DURATION_FIELDS {
        if let (Some(old), Some(new)) = (old_config.get(field), new_config.get(field))
            && old != new
            && same_duration(old, new)
        {
            new_config.insert(field.to_owned(), old.clone());
        }
    }
    let old = propagated_view(
        annotation(&machine.metadata, annotations::EFFECTIVE_CREATION_TIMEOUT),
        machine.spec.node_template.as_ref(),
        old_config,
        &machine.spec.class.kind,
    );
    let new = propagated_view(
        effective_creation_timeout(set),
        template.node_template.as_ref(),
        new_config,
        &template.class.kind,
    );
    merge_diff(&old, &new)
}

// ---------------------------------------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------------------------------------

/// Why creating or deleting machines failed (the `ReplicaFailure` condition's reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaFailureReason {
    /// A machine could not be created.
    FailedCreate,
    /// A machine could not be deleted.
    FailedDelete,
}

impl ReplicaFailureReason {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailedCreate => "FailedCreate",
            Self::FailedDelete => "FailedDelete",
        }
    }
}

/// A failure of the pass's creations or deletions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaFailure {
    /// Create or delete.
    pub reason: ReplicaFailureReason,
    /// The error, for the condition's message.
    pub message: String,
}

/// What came of the pass's creations and deletions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManageResult {
    /// Nothing was tried (held by expectations, invalid, being deleted): the `ReplicaFailure` condition stays as it
    /// is.
    NotRun,
    /// Everything tried succeeded: the `ReplicaFailure` condition is removed.
    Succeeded,
    /// Something failed: the `ReplicaFailure` condition is set.
    Failed(ReplicaFailure),
}

/// The set's new status. Write it (for example as [`SetStatusUpdate::merge_patch`] on the `status` subresource)
/// only when [`SetStatusUpdate::changes`] says so.
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use]
pub struct SetStatusUpdate {
    /// The whole new status: the fields the set controller owns computed, the others (`lastOperation`,
    /// `autoPreserveFailedMachineCount`, conditions of other types) carried over.
    pub status: MachineSetStatus,
}

/// The status fields the set controller writes (JSON names).
const OWNED_STATUS_FIELDS: [&str; 8] = [
    "replicas",
    "fullyLabeledReplicas",
    "readyReplicas",
    "availableReplicas",
    "preservedFailedReplicas",
    "observedGeneration",
    "machineSetCondition",
    "failedMachines",
];

impl SetStatusUpdate {
    /// Whether writing the update changes the status.
    pub fn changes(&self, current: Option<&MachineSetStatus>) -> bool {
        let empty = MachineSetStatus::default();
        self.status != *current.unwrap_or(&empty)
    }

    /// Applies the update (what the API server does with [`SetStatusUpdate::merge_patch`]).
    pub fn apply(&self, status: &mut MachineSetStatus) {
        let kept_operation = std::mem::take(&mut status.last_operation);
        let kept_count = status.auto_preserve_failed_machine_count.take();
        *status = self.status.clone();
        status.last_operation = kept_operation;
        status.auto_preserve_failed_machine_count = kept_count;
    }

    /// The JSON merge patch for the set's `status` subresource: `{"status": {...}}` with every field the set
    /// controller owns, `null` for those that are now empty or zero (so the patch clears them), and nothing else.
    pub fn merge_patch(&self) -> Value {
        let serialized = match serde_json::to_value(&self.status) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        let status: Map<String, Value> = OWNED_STATUS_FIELDS
            .iter()
            .map(|field| {
                (
                    (*field).to_owned(),
                    serialized.get(*field).cloned().unwrap_or(Value::Null),
                )
            })
            .collect();
        json!({ "status": status })
    }
}

/// The status and when to compute it again.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct StatusPlan {
    /// The new status.
    pub update: SetStatusUpdate,
    /// When a Running machine reaches `minReadySeconds` and so becomes available: compute the status again then.
    pub recheck_after: Option<Duration>,
}

/// Whether a machine counts as ready: Running and not being deleted (reference: readyReplicas = Running).
fn is_ready(machine: &Machine) -> bool {
    !is_deleting(machine) && machine.phase() == Some(MachinePhase::Running)
}

/// When a machine becomes (or became) available: Running (or Available, the phase without a target cluster) and not
/// being deleted, from its phase's `lastUpdateTime` plus `minReadySeconds`. `None` if it is not Running or Available,
/// or if `minReadySeconds` > 0 and the phase has no time (it cannot be told how long it has been up).
fn available_at(machine: &Machine, min_ready: Duration) -> Option<Timestamp> {
    if is_deleting(machine)
        || !matches!(
            machine.phase(),
            Some(MachinePhase::Running | MachinePhase::Available)
        )
    {
        return None;
    }
    if min_ready.is_zero() {
        return Some(Timestamp::MIN);
    }
    machine
        .status
        .as_ref()
        .and_then(|s| s.current_status.last_update_time.as_ref())
        .map(|since| timeouts::add(since.0, min_ready))
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn summary(set: &MachineSet, machine: &Machine) -> MachineSummary {
    MachineSummary {
        name: name_of(machine).to_owned(),
        provider_id: machine.spec.provider_id.clone(),
        last_operation: machine
            .status
            .as_ref()
            .map(|s| s.last_operation.clone())
            .unwrap_or_default(),
        owner_ref: set.metadata.name.clone().unwrap_or_default(),
    }
}

fn conditions(
    current: &[MachineSetCondition],
    result: &ManageResult,
    now: Timestamp,
) -> Vec<MachineSetCondition> {
    let is_failure = |c: &MachineSetCondition| c.r#type == MachineSetConditionType::ReplicaFailure;
    let mut conditions = current.to_vec();
    match result {
        ManageResult::NotRun => {}
        ManageResult::Succeeded => conditions.retain(|c| !is_failure(c)),
        ManageResult::Failed(failure) => {
            let same = conditions.iter().any(|c| {
                is_failure(c) && c.status == ConditionStatus::True && c.reason == failure.reason.as_str()
            });
            if !same {
                conditions.retain(|c| !is_failure(c));
                conditions.push(MachineSetCondition {
                    r#type: MachineSetConditionType::ReplicaFailure,
                    status: ConditionStatus::True,
                    last_transition_time: Some(Time(now)),
                    reason: failure.reason.as_str().to_owned(),
                    message: failure.message.clone(),
                });
            }
        }
    }
    conditions
}

/// The set's status from its owned machines (reference `calculateMachineSetStatus`):
/// - `replicas`: the machines of the set, those being deleted included;
/// - `fullyLabeledReplicas`: those whose labels include all the template's labels;
/// - `readyReplicas`: Running, not being deleted;
/// - `availableReplicas`: Running or Available (no target cluster), not being deleted, for at least
///   `minReadySeconds` since the phase's `lastUpdateTime` (the reference ignores `minReadySeconds`);
/// - `preservedFailedReplicas`: Failed and preserved;
/// - `failedMachines`: machines whose last operation failed and that are not preserved, by name, as the reference's
///   `MachineSummary` (absent when there are none);
/// - the `ReplicaFailure` condition from `result` (set with reason `FailedCreate`/`FailedDelete` and the error, kept
///   while the reason stays the same, removed after a pass whose creations and deletions all succeeded); other
///   conditions (`Frozen`, the safety controller's) are kept;
/// - `observedGeneration`: the set's generation.
///
/// `recheck_after` is the soonest instant a Running machine reaches `minReadySeconds`.
pub fn status(set: &MachineSet, machines: &[&Machine], result: &ManageResult, now: Timestamp) -> StatusPlan {
    let current = set.status.clone().unwrap_or_default();
    let min_ready = Duration::from_secs(u64::try_from(set.spec.min_ready_seconds).unwrap_or(0));
    let template_labels = set.spec.template.labels();
    let mut recheck_at: Option<Timestamp> = None;
    let mut available = 0;
    for machine in machines {
        match available_at(machine, min_ready) {
            Some(at) if at <= now => available += 1,
            Some(at) => recheck_at = Some(recheck_at.map_or(at, |r| r.min(at))),
            None => {}
        }
    }
    let fully_labeled = machines
        .iter()
        .filter(|m| {
            let machine_labels = labels_of(&m.metadata);
            template_labels
                .iter()
                .all(|(k, v)| machine_labels.get(k) == Some(v))
        })
        .count();
    let preserved_failed = machines
        .iter()
        .filter(|m| m.phase() == Some(MachinePhase::Failed) && is_preserved(m, now))
        .count();
    let mut failed: Vec<MachineSummary> = machines
        .iter()
        .filter(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.last_operation.state == Some(MachineState::Failed))
                && !is_preserved(m, now)
        })
        .map(|m| summary(set, m))
        .collect();
    failed.sort_by(|a, b| a.name.cmp(&b.name));
    let status = MachineSetStatus {
        replicas: count(machines.len()),
        fully_labeled_replicas: count(fully_labeled),
        ready_replicas: count(machines.iter().filter(|m| is_ready(m)).count()),
        available_replicas: count(available),
        preserved_failed_replicas: count(preserved_failed),
        observed_generation: set.metadata.generation.unwrap_or(0),
        conditions: conditions(&current.conditions, result, now),
        last_operation: current.last_operation.clone(),
        failed_machines: (!failed.is_empty()).then_some(failed),
        auto_preserve_failed_machine_count: current.auto_preserve_failed_machine_count,
    };
    StatusPlan {
        update: SetStatusUpdate { status },
        recheck_after: recheck_at.map(|at| until(now, at)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use mcm_api::{
        ClassSpec, LastOperation, MachineSpec, MachineStatus, MachineTemplateSpec, NodeTemplateSpec,
    };
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    use super::*;

    const SET_UID: &str = "uid-ms";

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn app_labels() -> BTreeMap<String, String> {
        BTreeMap::from([("app".to_owned(), "web".to_owned())])
    }

    fn set(replicas: i32) -> MachineSet {
        let mut set = MachineSet::default();
        set.metadata.name = Some("ms".into());
        set.metadata.namespace = Some("ns".into());
        set.metadata.uid = Some(SET_UID.into());
        set.metadata.generation = Some(4);
        set.metadata.finalizers = Some(vec![finalizers::MACHINE_CONTROLLER_MANAGER.into()]);
        set.spec.replicas = replicas;
        set.spec.selector = Some(LabelSelector {
            match_labels: Some(app_labels()),
            ..LabelSelector::default()
        });
        set.spec.template = MachineTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(app_labels()),
                ..ObjectMeta::default()
            }),
            spec: MachineSpec {
                class: ClassSpec {
                    kind: "MachineClass".into(),
                    name: "small".into(),
                    ..ClassSpec::default()
                },
                ..MachineSpec::default()
            },
        };
        set
    }

    fn machine(name: &str, phase: Option<MachinePhase>) -> Machine {
        let mut m = Machine::default();
        m.metadata.name = Some(name.into());
        m.metadata.namespace = Some("ns".into());
        m.metadata.uid = Some(format!("uid-{name}"));
        m.metadata.labels = Some(app_labels());
        m.metadata.creation_timestamp = Some(Time(at(100)));
        m.metadata.owner_references = Some(vec![owner_reference(&set(1))]);
        m.spec = set(1).spec.template.spec;
        let mut status = MachineStatus::default();
        status.current_status.phase = phase;
        status.current_status.last_update_time = Some(Time(at(100)));
        m.status = Some(status);
        m
    }

    fn annotate(m: &mut Machine, key: &str, value: &str) {
        m.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
    }

    fn running(name: &str) -> Machine {
        machine(name, Some(MachinePhase::Running))
    }

    fn plan_for(set: &MachineSet, machines: &[Machine], expectations: &Expectations) -> MachineSetPlan {
        let refs: Vec<&Machine> = machines.iter().collect();
        decide(&MachineSetInput {
            set,
            machines: &refs,
            expectations,
            deployment_delete_policy: None,
            now: at(1000),
            random: 7,
        })
    }

    fn deleted(plan: &MachineSetPlan) -> Vec<(&str, DeletionReason)> {
        plan.delete.iter().map(|d| (d.name.as_str(), d.reason)).collect()
    }

    // --- Ownership -------------------------------------------------------------------------------------------------

    #[test]
    fn claim_owns_matching_machines_adopts_matching_orphans_and_releases_the_others() {
        // Kubernetes ClaimObject: owned + match = keep; owned + no match = release; orphan + match = adopt.
        let set = set(3);
        let owned = running("a");
        let mut orphan = running("b");
        orphan.metadata.owner_references = None;
        let mut drifted = running("c");
        drifted.metadata.labels = Some(BTreeMap::from([("app".into(), "db".into())]));
        let mut other_orphan = running("d");
        other_orphan.metadata.owner_references = None;
        other_orphan.metadata.labels = None;
        let claims = claim_machines(&set, [&owned, &orphan, &drifted, &other_orphan]);
        assert_eq!(claims.owned, vec![&owned]);
        assert_eq!(claims.adopt, vec![&orphan]);
        assert_eq!(claims.release, vec![&drifted]);
    }

    #[test]
    fn machines_of_another_controller_or_namespace_are_ignored() {
        let set = set(3);
        let mut foreign = running("a");
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
        let mut elsewhere = running("b");
        elsewhere.metadata.namespace = Some("other".into());
        elsewhere.metadata.owner_references = None;
        let mut not_controller = running("c");
        not_controller.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
        assert_eq!(claim(&set, &foreign), Claim::Ignore);
        assert_eq!(claim(&set, &elsewhere), Claim::Ignore);
        // An owner reference that is not the controller does not make a machine owned: it is an orphan.
        assert_eq!(claim(&set, &not_controller), Claim::Adopt);
    }

    #[test]
    fn orphans_being_deleted_are_not_adopted_and_a_deleting_set_adopts_nothing() {
        let mut orphan = running("a");
        orphan.metadata.owner_references = None;
        orphan.metadata.deletion_timestamp = Some(Time(at(5)));
        assert_eq!(claim(&set(1), &orphan), Claim::Ignore);

        let mut deleting = set(1);
        deleting.metadata.deletion_timestamp = Some(Time(at(5)));
        let mut orphan = running("b");
        orphan.metadata.owner_references = None;
        assert_eq!(claim(&deleting, &orphan), Claim::Ignore);
    }

    #[test]
    fn a_deleting_set_owns_every_machine_it_controls_so_it_deletes_them_first() {
        let mut deleting = set(1);
        deleting.metadata.deletion_timestamp = Some(Time(at(5)));
        let mut drifted = running("a");
        drifted.metadata.labels = None;
        assert_eq!(claim(&deleting, &drifted), Claim::Owned);
    }

    #[test]
    fn an_empty_or_missing_selector_matches_nothing() {
        let mut set = set(1);
        let mut orphan = running("a");
        orphan.metadata.owner_references = None;
        set.spec.selector = Some(LabelSelector::default());
        assert!(!selects(&set, &orphan));
        assert_eq!(claim(&set, &orphan), Claim::Ignore);
        set.spec.selector = None;
        assert!(!selects(&set, &orphan));
        // Match expressions select too.
        set.spec.selector = Some(LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "app".into(),
                    operator: "In".into(),
                    values: Some(vec!["web".into(), "api".into()]),
                },
            ]),
            ..LabelSelector::default()
        });
        assert!(selects(&set, &orphan));
    }

    #[test]
    fn a_set_without_uid_owns_nothing() {
        let mut set = set(1);
        set.metadata.uid = None;
        let mut orphan = running("a");
        orphan.metadata.owner_references = None;
        assert_eq!(claim(&set, &orphan), Claim::Ignore);
    }

    #[test]
    fn adoption_adds_the_controller_reference_and_keeps_the_others() {
        let set = set(1);
        let mut orphan = running("a");
        orphan.metadata.resource_version = Some("42".into());
        orphan.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "keep".into(),
            uid: "cm".into(),
            ..OwnerReference::default()
        }]);
        let patch = adoption_patch(&set, &orphan);
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let mut object = serde_json::to_value(&orphan).unwrap();
        json_patch::merge(&mut object, &patch);
        let adopted: Machine = serde_json::from_value(object).unwrap();
        let refs = adopted.metadata.owner_references.unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0].name, "keep");
        assert_eq!(refs[1], owner_reference(&set));
        assert_eq!(refs[1].controller, Some(true));
        assert_eq!(refs[1].block_owner_deletion, Some(true));
        assert_eq!(refs[1].kind, "MachineSet");
        assert_eq!(refs[1].api_version, "machine.sapcloud.io/v1alpha1");
    }

    #[test]
    fn release_removes_only_the_sets_reference() {
        let set = set(1);
        let mut owned = running("a");
        let patch = release_patch(&set, &owned);
        assert_eq!(patch["metadata"]["ownerReferences"], Value::Null);
        let mut object = serde_json::to_value(&owned).unwrap();
        json_patch::merge(&mut object, &patch);
        let released: Machine = serde_json::from_value(object).unwrap();
        assert_eq!(released.metadata.owner_references, None);

        owned
            .metadata
            .owner_references
            .as_mut()
            .unwrap()
            .push(OwnerReference {
                name: "keep".into(),
                uid: "x".into(),
                ..OwnerReference::default()
            });
        let patch = release_patch(&set, &owned);
        assert_eq!(patch["metadata"]["ownerReferences"][0]["name"], "keep");
        assert_eq!(patch["metadata"]["ownerReferences"].as_array().unwrap().len(), 1);
    }

    // --- Expectations ----------------------------------------------------------------------------------------------

    #[test]
    fn expectations_hold_until_the_cache_shows_the_sets_own_writes() {
        let mut exp = Expectations::new();
        assert!(exp.satisfied(at(0)));
        exp.expect_creation("ms-a", at(10));
        exp.expect_deletion("old", at(10));
        assert!(!exp.satisfied(at(11)));
        assert_eq!((exp.pending_creations(), exp.pending_deletions()), (1, 1));

        let old = running("old");
        let created = running("ms-a");
        exp.observe([&old]);
        assert_eq!((exp.pending_creations(), exp.pending_deletions()), (1, 1));
        exp.observe([&old, &created]);
        assert_eq!((exp.pending_creations(), exp.pending_deletions()), (0, 1));
        let mut old_deleting = old.clone();
        old_deleting.metadata.deletion_timestamp = Some(Time(at(12)));
        exp.observe([&old_deleting, &created]);
        assert!(exp.is_empty());
        assert!(exp.satisfied(at(12)));
        assert_eq!(exp.expires_at(), None);
    }

    #[test]
    fn a_machine_gone_from_the_cache_meets_its_deletion() {
        let mut exp = Expectations::new();
        exp.expect_deletion("old", at(10));
        exp.observe([]);
        assert!(exp.is_empty());
        exp.expect_creation("new", at(10));
        exp.observe_gone("new");
        assert!(exp.is_empty());
    }

    #[test]
    fn expectations_expire_after_five_minutes() {
        // Kubernetes ExpectationsTimeout = 5m: a creation the cache never shows cannot hold a set for ever.
        let mut exp = Expectations::new();
        exp.expect_creation("ms-a", at(10));
        exp.expect_creation("ms-b", at(70));
        assert_eq!(exp.expires_at(), Some(at(370)));
        assert!(!exp.satisfied(at(369)));
        assert!(exp.satisfied(at(370)));
        assert!(!exp.clone().expire(at(369)));
        assert!(exp.expire(at(370)));
        assert!(exp.is_empty());
    }

    #[test]
    fn an_unknown_creation_holds_until_the_timeout_and_a_failed_deletion_does_not() {
        let mut exp = Expectations::new();
        exp.expect_unknown_creation(at(0));
        exp.observe([&running("anything")]);
        assert!(!exp.satisfied(at(299)));
        assert!(exp.satisfied(at(300)));

        let mut exp = Expectations::new();
        exp.expect_deletion("a", at(0));
        exp.deletion_failed("a");
        assert!(exp.satisfied(at(1)));
    }

    #[test]
    fn without_expectations_a_lagging_cache_would_create_twice() {
        // The reference's expectations gate is commented out ("TODO: Fix working of expectations"); this shows why
        // the gate matters: the same stale cache seen twice asks for the same machines twice.
        let set = set(3);
        let stale: Vec<Machine> = Vec::new();
        let first = plan_for(&set, &stale, &Expectations::new());
        assert_eq!(first.create, 3);
        let forgetful = plan_for(&set, &stale, &Expectations::new());
        assert_eq!(forgetful.create, 3, "a fresh view of a stale cache asks again");

        let mut exp = Expectations::new();
        for i in 0..first.create {
            exp.expect_creation(format!("ms-{i}"), at(1000));
        }
        exp.observe(&stale);
        let held = plan_for(&set, &stale, &exp);
        assert_eq!(held.create, 0);
        assert!(matches!(
            held.holds[..],
            [Hold::ExpectationsPending {
                creations: 3,
                deletions: 0,
                ..
            }]
        ));
        assert_eq!(held.requeue_after, Some(EXPECTATIONS_TIMEOUT));
    }

    // --- decide ----------------------------------------------------------------------------------------------------

    #[test]
    fn slow_start_batches_double_from_one() {
        // slowStartBatch: "Batch sizes start at SlowStartInitialBatchSize and double with each successful iteration".
        assert_eq!(slow_start_batches(10, 1), vec![1, 2, 4, 3]);
        assert_eq!(slow_start_batches(1, 1), vec![1]);
        assert_eq!(slow_start_batches(0, 1), Vec::<usize>::new());
        assert_eq!(slow_start_batches(7, 1), vec![1, 2, 4]);
        assert_eq!(slow_start_batches(5, 0), vec![1, 2, 2]);
    }

    #[test]
    fn scale_up_creates_the_missing_machines_in_slow_start_batches() {
        let plan = plan_for(&set(10), &[running("a")], &Expectations::new());
        assert_eq!(plan.create, 9);
        assert_eq!(plan.create_batches, vec![1, 2, 4, 2]);
        assert!(plan.delete.is_empty());
        assert!(plan.holds.is_empty());
        assert!(!plan.add_finalizer);
    }

    #[test]
    fn at_most_burst_replicas_are_created_per_pass() {
        // Reference: "MS creates min(−diff, BurstReplicas=100) machines".
        let plan = plan_for(&set(250), &[], &Expectations::new());
        assert_eq!(plan.create, BURST_REPLICAS);
        assert_eq!(plan.create_batches.iter().sum::<usize>(), BURST_REPLICAS);
    }

    #[test]
    fn terminating_machines_and_machines_being_deleted_do_not_count() {
        // Reference §5: "diff = #non-Terminating machines − spec.replicas. Terminating machines do not count."
        let mut deleting = running("b");
        deleting.metadata.deletion_timestamp = Some(Time(at(900)));
        let machines = [
            running("a"),
            deleting,
            machine("c", Some(MachinePhase::Terminating)),
        ];
        let plan = plan_for(&set(3), &machines, &Expectations::new());
        assert_eq!(plan.create, 2);
        assert!(
            plan.delete.is_empty(),
            "machines on their way out are not deleted again"
        );
    }

    #[test]
    fn failed_machines_are_deleted_and_replaced_in_the_same_pass() {
        // Reference §5: "every Failed machine that is not preserved ... this is how failed machines are replaced".
        let machines = [running("a"), machine("b", Some(MachinePhase::Failed))];
        let plan = plan_for(&set(2), &machines, &Expectations::new());
        assert_eq!(deleted(&plan), vec![("b", DeletionReason::Failed)]);
        assert_eq!(plan.create, 1);
    }

    #[test]
    fn a_preserved_failed_machine_is_neither_deleted_nor_replaced_until_its_preservation_ends() {
        // Reference §3.8: "A preserved Failed machine is not deleted or replaced by the MachineSet".
        let mut failed = machine("b", Some(MachinePhase::Failed));
        failed
            .status
            .as_mut()
            .unwrap()
            .current_status
            .preserve_expiry_time = Some(Time(at(1600)));
        let machines = [running("a"), failed.clone()];
        let plan = plan_for(&set(2), &machines, &Expectations::new());
        assert!(plan.delete.is_empty());
        assert_eq!(plan.create, 0);
        assert_eq!(plan.requeue_after, Some(Duration::from_mins(10)));

        // Preservation expired: "A still-Failed machine then terminates."
        failed
            .status
            .as_mut()
            .unwrap()
            .current_status
            .preserve_expiry_time = Some(Time(at(999)));
        let plan = plan_for(&set(2), &[running("a"), failed.clone()], &Expectations::new());
        assert_eq!(deleted(&plan), vec![("b", DeletionReason::Failed)]);
        assert_eq!(plan.create, 1);

        // Preservation being set up (annotation, no expiry yet) keeps it too.
        failed
            .status
            .as_mut()
            .unwrap()
            .current_status
            .preserve_expiry_time = None;
        annotate(&mut failed, annotations::PRESERVE, "when-failed");
        assert!(keeps_failed_machine(&failed, at(1000)));
        annotate(
            &mut failed,
            annotations::LAST_APPLIED_NODE_PRESERVE_VALUE,
            "false",
        );
        assert!(!keeps_failed_machine(&failed, at(1000)), "the node's value wins");
    }

    #[test]
    fn a_frozen_set_does_not_scale_up_but_still_deletes() {
        // Reference §7: "The effect of a freeze is only that the MachineSet does not scale up; scale-down and
        // deletion continue."
        let mut frozen = set(3);
        frozen.metadata.labels = Some(BTreeMap::from([(labels::FREEZE.into(), "True".into())]));
        let machines = [running("a"), machine("b", Some(MachinePhase::Failed))];
        let plan = plan_for(&frozen, &machines, &Expectations::new());
        assert_eq!(plan.create, 0);
        assert_eq!(plan.holds, vec![Hold::Frozen { missing: 2 }]);
        assert_eq!(deleted(&plan), vec![("b", DeletionReason::Failed)]);
        assert!(plan.holds[0].to_string().contains("freeze=True"));

        frozen.spec.replicas = 0;
        let plan = plan_for(&frozen, &machines, &Expectations::new());
        assert_eq!(
            deleted(&plan),
            vec![("a", DeletionReason::ScaleDown), ("b", DeletionReason::Failed)]
        );

        // Only the value True freezes (the reference compares with "True").
        let mut not_frozen = set(3);
        not_frozen.metadata.labels = Some(BTreeMap::from([(labels::FREEZE.into(), "False".into())]));
        assert_eq!(plan_for(&not_frozen, &[], &Expectations::new()).create, 3);
    }

    #[test]
    fn scale_up_disabled_stops_creation() {
        let mut set = set(2);
        set.metadata.labels = Some(BTreeMap::from([(
            labels::SCALE_UP_DISABLED.into(),
            "true".into(),
        )]));
        let plan = plan_for(&set, &[], &Expectations::new());
        assert_eq!(plan.create, 0);
        assert_eq!(plan.holds, vec![Hold::ScaleUpDisabled { missing: 2 }]);
    }

    #[test]
    fn scale_down_deletes_the_first_machines_in_deletion_order() {
        let mut low = running("low");
        annotate(&mut low, annotations::MACHINE_PRIORITY, "1");
        let machines = [
            running("a"),
            machine("pending", Some(MachinePhase::Pending)),
            low,
            running("b"),
        ];
        let plan = plan_for(&set(2), &machines, &Expectations::new());
        assert_eq!(
            deleted(&plan),
            vec![
                ("low", DeletionReason::ScaleDown),
                ("pending", DeletionReason::ScaleDown)
            ]
        );
        assert_eq!(plan.create, 0);
    }

    #[test]
    fn the_autoscaler_handshake_deletes_exactly_the_marked_machines() {
        // Reference §6.5: "The MachineSet deletes marked machines whose mark time ≤ that timestamp."
        let mut set = set(2);
        annotate_set(
            &mut set,
            annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME,
            "2024-01-01T00:10:00Z",
        );
        let mut marked = running("marked");
        annotate(&mut marked, annotations::MACHINE_PRIORITY, "1");
        annotate(
            &mut marked,
            annotations::MARKED_FOR_DELETION_TIME,
            "2024-01-01T00:09:00Z",
        );
        let mut later = running("later");
        annotate(&mut later, annotations::MACHINE_PRIORITY, "1");
        annotate(
            &mut later,
            annotations::MARKED_FOR_DELETION_TIME,
            "2024-01-01T00:11:00Z",
        );
        let machines = [running("a"), marked.clone(), later.clone()];
        let plan = plan_for(&set, &machines, &Expectations::new());
        assert_eq!(
            deleted(&plan),
            vec![("marked", DeletionReason::MarkedByAutoscaler)]
        );
        assert_eq!(plan.create, 0);

        // Marked at exactly the change time counts ("Before or Equal").
        annotate(
            &mut later,
            annotations::MARKED_FOR_DELETION_TIME,
            "2024-01-01T00:10:00Z",
        );
        let machines = [running("a"), marked, later];
        let refs: Vec<&Machine> = machines.iter().collect();
        let names: Vec<&str> = marked_by_autoscaler(&set, &refs)
            .iter()
            .map(|m| name_of(m))
            .collect();
        assert_eq!(names, vec!["marked", "later"]);

        // Without the set's change time (or with an unreadable one), nothing is deleted for a mark.
        let mut unreadable = set.clone();
        annotate_set(
            &mut unreadable,
            annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME,
            "yesterday",
        );
        assert!(marked_by_autoscaler(&unreadable, &refs).is_empty());
    }

    #[test]
    fn a_marked_machine_that_replicas_still_count_is_replaced() {
        // The mark is older than the scaler's replica change, but the set's replicas were not lowered: the marked
        // machine goes and the set keeps its count (as the reference, one pass sooner).
        let mut set = set(2);
        annotate_set(
            &mut set,
            annotations::LAST_REPLICA_CHANGE_BY_SCALER_TIME,
            "2024-01-01T00:10:00Z",
        );
        let mut marked = running("marked");
        annotate(&mut marked, annotations::MACHINE_PRIORITY, "1");
        annotate(
            &mut marked,
            annotations::MARKED_FOR_DELETION_TIME,
            "2024-01-01T00:09:00Z",
        );
        let plan = plan_for(&set, &[running("a"), marked], &Expectations::new());
        assert_eq!(
            deleted(&plan),
            vec![("marked", DeletionReason::MarkedByAutoscaler)]
        );
        assert_eq!(plan.create, 1);
    }

    fn annotate_set(set: &mut MachineSet, key: &str, value: &str) {
        set.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
    }

    #[test]
    fn pending_expectations_hold_deletions_too() {
        let mut exp = Expectations::new();
        exp.expect_deletion("x", at(900));
        let plan = plan_for(&set(0), &[running("a"), running("x")], &exp);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.requeue_after, Some(Duration::from_secs(200)));
    }

    #[test]
    fn an_invalid_set_creates_and_deletes_nothing() {
        // DESIGN principle 5: "no machine is created or destroyed because of it".
        let mut invalid = set(3);
        invalid.spec.selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "other".into())])),
            ..LabelSelector::default()
        });
        let plan = plan_for(
            &invalid,
            &[machine("a", Some(MachinePhase::Failed))],
            &Expectations::new(),
        );
        assert_eq!((plan.create, plan.delete.len(), plan.propagate.len()), (0, 0, 0));
        assert!(matches!(&plan.holds[..], [Hold::Invalid(errors)] if errors[0].path == "spec.selector"));
        invalid.spec.replicas = -1;
        assert!(matches!(
            &plan_for(&invalid, &[], &Expectations::new()).holds[..],
            [Hold::Invalid(_)]
        ));
    }

    #[test]
    fn a_deleting_set_deletes_all_its_machines_then_drops_its_finalizer() {
        // Reference §5: "MachineSet deletion: delete all child machines, then remove the finalizer once none remain."
        let mut deleting = set(3);
        deleting.metadata.deletion_timestamp = Some(Time(at(900)));
        let mut already = running("b");
        already.metadata.deletion_timestamp = Some(Time(at(901)));
        let mut exp = Expectations::new();
        exp.expect_creation("never-seen", at(999));
        let plan = plan_for(&deleting, &[running("a"), already.clone()], &exp);
        assert_eq!(deleted(&plan), vec![("a", DeletionReason::SetDeleted)]);
        assert_eq!(plan.create, 0);
        assert!(!plan.remove_finalizer);
        let plan = plan_for(&deleting, &[already], &exp);
        assert!(plan.delete.is_empty() && !plan.remove_finalizer);
        let plan = plan_for(&deleting, &[], &exp);
        assert!(plan.remove_finalizer);
        deleting.metadata.finalizers = None;
        assert!(!plan_for(&deleting, &[], &exp).remove_finalizer);
    }

    #[test]
    fn a_missing_finalizer_is_added() {
        let mut set = set(0);
        set.metadata.finalizers = None;
        assert!(plan_for(&set, &[], &Expectations::new()).add_finalizer);
    }

    // --- Deletion order --------------------------------------------------------------------------------------------

    fn names<'a>(machines: &[&'a Machine]) -> Vec<&'a str> {
        machines.iter().map(|m| name_of(m)).collect()
    }

    fn sorted<'a>(order: &DeletionOrder, machines: &'a [Machine]) -> Vec<&'a str> {
        let mut refs: Vec<&Machine> = machines.iter().collect();
        order.sort(&mut refs);
        names(&refs)
    }

    fn created(mut m: Machine, second: i64) -> Machine {
        m.metadata.creation_timestamp = Some(Time(at(second)));
        m
    }

    #[test]
    fn the_faq_order_least_priority_then_phase_then_oldest() {
        // Spec 002 FAQ: "Machine with least value of machinepriority annotation is picked up. If all machines have
        // equal priorities, then following precedence is followed: Terminating > Failed > CrashloopBackoff > Unknown >
        // Pending > Available > Running. If still there is no match, the machine with oldest creation time (.i.e.
        // creationTimestamp) is picked up."
        let mut prio1 = running("prio1");
        annotate(&mut prio1, annotations::MACHINE_PRIORITY, "1");
        let machines = [
            created(running("running-new"), 300),
            created(running("running-old"), 200),
            machine("available", Some(MachinePhase::Available)),
            machine("pending", Some(MachinePhase::Pending)),
            machine("unknown", Some(MachinePhase::Unknown)),
            machine("crash", Some(MachinePhase::CrashLoopBackOff)),
            machine("failed", Some(MachinePhase::Failed)),
            machine("terminating", Some(MachinePhase::Terminating)),
            prio1,
        ];
        let order = DeletionOrder::new(None, 0, at(1000));
        assert_eq!(
            sorted(&order, &machines),
            vec![
                "prio1",
                "terminating",
                "failed",
                "crash",
                "unknown",
                "pending",
                "available",
                "running-old",
                "running-new"
            ]
        );
    }

    #[test]
    fn new_machines_rank_with_terminating_and_bad_priorities_count_as_three() {
        // Reference: "Any phase not listed ("" or InPlace*) ranks 0, so brand-new machines are deleted first";
        // "Machine priority is taken to be the default value (3)" when it does not parse.
        assert_eq!(phase_rank(None), 0);
        assert_eq!(phase_rank(Some(MachinePhase::InPlaceUpdating)), 0);
        let mut bad = running("bad");
        annotate(&mut bad, annotations::MACHINE_PRIORITY, "high");
        assert_eq!(priority(&bad), DEFAULT_PRIORITY);
        let mut two = running("two");
        annotate(&mut two, annotations::MACHINE_PRIORITY, "2");
        let machines = [created(bad, 1), two, created(machine("new", None), 500)];
        let order = DeletionOrder::new(None, 0, at(1000));
        assert_eq!(sorted(&order, &machines), vec!["two", "new", "bad"]);
    }

    #[test]
    fn marked_machines_go_first_older_mark_first() {
        // Reference §5 (3): "Both have a marked-for-deletion-time ⇒ the older one goes first. A machine that has the
        // annotation goes before one that does not."
        let mut old_mark = running("old-mark");
        annotate(
            &mut old_mark,
            annotations::MARKED_FOR_DELETION_TIME,
            "2024-01-01T00:00:00Z",
        );
        let mut new_mark = running("new-mark");
        annotate(
            &mut new_mark,
            annotations::MARKED_FOR_DELETION_TIME,
            "2024-01-02T00:00:00Z",
        );
        let machines = [
            machine("pending", Some(MachinePhase::Pending)),
            new_mark,
            old_mark,
        ];
        let order = DeletionOrder::new(None, 0, at(1000));
        assert_eq!(sorted(&order, &machines), vec!["old-mark", "new-mark", "pending"]);
    }

    #[test]
    fn preserved_machines_go_last_auto_preserved_before_explicit_earlier_expiry_first() {
        // Reference §5 (1): "Preserved machines (expiry time in the future) are deleted last. Among preserved
        // machines, auto-preserved ones go before explicitly preserved ones, and an earlier expiry goes first."
        let preserve = |name: &str, expiry: i64, auto: bool| {
            let mut m = machine(name, Some(MachinePhase::Failed));
            m.status.as_mut().unwrap().current_status.preserve_expiry_time = Some(Time(at(expiry)));
            if auto {
                annotate(&mut m, annotations::PRESERVE, "auto-preserved");
            }
            annotate(&mut m, annotations::MACHINE_PRIORITY, "1");
            m
        };
        let machines = [
            preserve("explicit-late", 3000, false),
            preserve("explicit-early", 2000, false),
            preserve("auto-late", 3000, true),
            preserve("auto-early", 2000, true),
            preserve("expired", 500, false),
            running("running"),
        ];
        let order = DeletionOrder::new(None, 0, at(1000));
        assert_eq!(
            sorted(&order, &machines),
            vec![
                "expired",
                "running",
                "auto-early",
                "auto-late",
                "explicit-early",
                "explicit-late"
            ]
        );
    }

    #[test]
    fn a_delete_policy_replaces_phase_rank_and_age_but_not_priority_or_mark() {
        let mut prio1 = created(running("prio1"), 50);
        annotate(&mut prio1, annotations::MACHINE_PRIORITY, "1");
        let mut marked = created(running("marked"), 60);
        annotate(
            &mut marked,
            annotations::MARKED_FOR_DELETION_TIME,
            "2024-01-01T00:00:00Z",
        );
        let machines = [
            created(running("old"), 100),
            created(running("new"), 300),
            created(running("mid"), 200),
            created(machine("pending-old", Some(MachinePhase::Pending)), 10),
            created(machine("unknown-new", Some(MachinePhase::Unknown)), 400),
            marked,
            prio1,
        ];
        let newest = DeletionOrder::new(Some(DeletePolicy::Newest), 0, at(1000));
        assert_eq!(
            sorted(&newest, &machines),
            vec![
                "prio1",
                "marked",
                "unknown-new",
                "pending-old",
                "new",
                "mid",
                "old"
            ]
        );
        let oldest = DeletionOrder::new(Some(DeletePolicy::Oldest), 0, at(1000));
        assert_eq!(
            sorted(&oldest, &machines),
            vec![
                "prio1",
                "marked",
                "pending-old",
                "unknown-new",
                "old",
                "mid",
                "new"
            ]
        );
        let random = DeletionOrder::new(Some(DeletePolicy::Random), 42, at(1000));
        let order = sorted(&random, &machines);
        assert_eq!(&order[..2], &["prio1", "marked"]);
        let mut unhealthy = order[2..4].to_vec();
        unhealthy.sort_unstable();
        assert_eq!(unhealthy, vec!["pending-old", "unknown-new"]);
    }

    #[test]
    fn the_random_policy_depends_on_the_seed_only() {
        let machines: Vec<Machine> = (0..12).map(|i| running(&format!("m{i}"))).collect();
        let order = DeletionOrder::new(Some(DeletePolicy::Random), 9, at(1000));
        let first = sorted(&order, &machines);
        let reversed: Vec<Machine> = machines.iter().rev().cloned().collect();
        assert_eq!(sorted(&order, &reversed), first, "independent of the input order");
        let other = DeletionOrder::new(Some(DeletePolicy::Random), 10, at(1000));
        assert_ne!(sorted(&other, &machines), first, "another seed, another order");
    }

    #[test]
    fn the_deployments_delete_policy_wins_and_a_bad_value_is_reported() {
        let mut set = set(1);
        assert_eq!(delete_policy(&set, None), Ok(None));
        annotate_set(&mut set, extensions::DELETE_POLICY, "Oldest");
        assert_eq!(delete_policy(&set, None), Ok(Some(DeletePolicy::Oldest)));
        assert_eq!(
            delete_policy(&set, Some("newest")),
            Ok(Some(DeletePolicy::Newest))
        );
        let err = delete_policy(&set, Some("Youngest")).unwrap_err();
        assert_eq!(err.source_kind, PolicySource::MachineDeployment);
        assert!(err.to_string().contains("\"Youngest\""), "{err}");

        annotate_set(&mut set, extensions::DELETE_POLICY, "bogus");
        let machines = [running("a")];
        let plan = plan_for(&set, &machines, &Expectations::new());
        assert_eq!(plan.delete_policy, None);
        assert_eq!(plan.policy_problem.unwrap().source_kind, PolicySource::MachineSet);
    }

    // --- Creation and propagation ----------------------------------------------------------------------------------

    #[test]
    fn the_machine_to_create_needs_no_second_write() {
        let mut set = set(1);
        annotate_set(&mut set, annotations::EFFECTIVE_CREATION_TIMEOUT, "30m");
        let template_meta = set.spec.template.metadata.as_mut().unwrap();
        template_meta.annotations = Some(BTreeMap::from([("team".into(), "a".into())]));
        template_meta.finalizers = Some(vec!["example.com/keep".into()]);
        set.spec.template.spec.provider_id = "aws:///i-123".into();
        set.spec.template.spec.configuration.drain_timeout = Some(GoDuration::new("1h"));
        let m = machine_to_create(&set);
        assert_eq!(m.metadata.generate_name.as_deref(), Some("ms-"));
        assert_eq!(m.metadata.name, None);
        assert_eq!(m.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(m.metadata.labels, Some(app_labels()));
        assert_eq!(
            m.metadata.annotations,
            Some(BTreeMap::from([
                (annotations::EFFECTIVE_CREATION_TIMEOUT.into(), "30m".into()),
                ("team".into(), "a".into()),
            ]))
        );
        assert_eq!(
            m.metadata.finalizers,
            Some(vec![
                "example.com/keep".into(),
                finalizers::MACHINE_CONTROLLER_MANAGER.into()
            ])
        );
        assert_eq!(m.metadata.owner_references, Some(vec![owner_reference(&set)]));
        assert_eq!(m.spec.provider_id, "");
        assert_eq!(m.spec.class.name, "small");
        assert_eq!(m.spec.configuration.drain_timeout, Some(GoDuration::new("1h")));
        // The set owns what it creates, and the new machine needs no propagation.
        let mut stored = m.clone();
        stored.metadata.name = Some("ms-abcde".into());
        assert_eq!(claim(&set, &stored), Claim::Owned);
        assert_eq!(propagation_patch(&set, &stored), None);
    }

    #[test]
    fn propagation_patches_node_template_configuration_class_kind_and_the_timeout_annotation() {
        let mut set = set(1);
        let mut m = running("a");
        assert_eq!(propagation_patch(&set, &m), None);

        set.spec.template.spec.node_template = Some(NodeTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([("pool".into(), "b".into())])),
                ..ObjectMeta::default()
            }),
            spec: None,
        });
        set.spec.template.spec.configuration.health_timeout = Some(GoDuration::new("5m"));
        annotate_set(&mut set, annotations::EFFECTIVE_CREATION_TIMEOUT, "40m");
        m.spec.node_template = Some(NodeTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([
                    ("pool".into(), "a".into()),
                    ("old".into(), "x".into()),
                ])),
                ..ObjectMeta::default()
            }),
            spec: None,
        });
        m.spec.configuration.drain_timeout = Some(GoDuration::new("2h"));
        annotate(&mut m, "unrelated", "kept");
        let patch = propagation_patch(&set, &m).unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": { "annotations": { annotations::EFFECTIVE_CREATION_TIMEOUT: "40m" } },
                "spec": {
                    "nodeTemplate": { "metadata": { "labels": { "pool": "b", "old": null } } },
                    "healthTimeout": "5m",
                    "drainTimeout": null,
                }
            })
        );
        let updated = apply_patch(&m, &patch);
        assert_eq!(updated.spec.node_template, set.spec.template.spec.node_template);
        assert_eq!(updated.spec.configuration, set.spec.template.spec.configuration);
        assert_eq!(annotation(&updated.metadata, "unrelated"), Some("kept"));
        assert_eq!(updated.spec.class.name, "small", "the machine is not replaced");
        assert_eq!(propagation_patch(&set, &updated), None);

        // The annotation goes when the set has none; the class kind follows the template.
        set.metadata.annotations = None;
        set.spec.template.spec.class.kind = "AWSMachineClass".into();
        let patch = propagation_patch(&set, &updated).unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": { "annotations": { annotations::EFFECTIVE_CREATION_TIMEOUT: null } },
                "spec": { "class": { "kind": "AWSMachineClass" } }
            })
        );
    }

    fn apply_patch(machine: &Machine, patch: &Value) -> Machine {
        let mut object = serde_json::to_value(machine).unwrap();
        json_patch::merge(&mut object, patch);
        serde_json::from_value(object).unwrap()
    }

    #[test]
    fn equal_durations_are_not_rewritten_and_inactive_machines_are_left_alone() {
        let mut set = set(1);
        set.spec.template.spec.configuration.drain_timeout = Some(GoDuration::new("10m"));
        let mut m = running("a");
        m.spec.configuration.drain_timeout = Some(GoDuration::new("10m0s"));
        assert_eq!(propagation_patch(&set, &m), None);

        set.spec.template.spec.configuration.drain_timeout = Some(GoDuration::new("20m"));
        assert!(propagation_patch(&set, &m).is_some());
        for phase in [MachinePhase::Failed, MachinePhase::Terminating] {
            assert_eq!(propagation_patch(&set, &machine("b", Some(phase))), None);
        }
        let mut deleting = running("c");
        deleting.metadata.deletion_timestamp = Some(Time(at(1)));
        assert_eq!(propagation_patch(&set, &deleting), None);

        let plan = plan_for(&set, &[m, deleting], &Expectations::new());
        assert_eq!(plan.propagate.len(), 1);
        assert_eq!(plan.propagate[0].name, "a");
    }

    // --- Status ----------------------------------------------------------------------------------------------------

    fn phase_since(name: &str, phase: MachinePhase, since: i64) -> Machine {
        let mut m = machine(name, Some(phase));
        m.status.as_mut().unwrap().current_status.last_update_time = Some(Time(at(since)));
        m
    }

    #[test]
    fn status_counts_as_the_reference_and_honours_min_ready_seconds() {
        let mut set = set(5);
        set.spec.min_ready_seconds = 60;
        let mut unlabeled = phase_since("unlabeled", MachinePhase::Pending, 0);
        unlabeled.metadata.labels = None;
        let mut deleting = phase_since("deleting", MachinePhase::Running, 0);
        deleting.metadata.deletion_timestamp = Some(Time(at(990)));
        let machines = [
            phase_since("ready-long", MachinePhase::Running, 900),
            phase_since("ready-new", MachinePhase::Running, 980),
            phase_since("no-target", MachinePhase::Available, 100),
            unlabeled,
            deleting,
        ];
        let refs: Vec<&Machine> = machines.iter().collect();
        let plan = status(&set, &refs, &ManageResult::NotRun, at(1000));
        let s = &plan.update.status;
        assert_eq!(s.replicas, 5);
        assert_eq!(s.fully_labeled_replicas, 4);
        assert_eq!(s.ready_replicas, 2, "Running and not being deleted");
        assert_eq!(
            s.available_replicas, 2,
            "ready-long and no-target; ready-new only at 1040"
        );
        assert_eq!(s.observed_generation, 4);
        assert_eq!(plan.recheck_after, Some(Duration::from_secs(40)));

        let later = status(&set, &refs, &ManageResult::NotRun, at(1040));
        assert_eq!(
            later.update.status.available_replicas, 3,
            "Running for at least minReadySeconds"
        );
        assert_eq!(later.recheck_after, None);

        set.spec.min_ready_seconds = 0;
        let without_min_ready = status(&set, &refs, &ManageResult::NotRun, at(1000));
        assert_eq!(without_min_ready.update.status.available_replicas, 3);
    }

    #[test]
    fn failed_machines_are_summarized_except_preserved_ones() {
        let set = set(3);
        let failure = LastOperation {
            description: "Cloud provider message - machine codes error: code = [Internal] message = [boom]"
                .into(),
            state: Some(MachineState::Failed),
            ..LastOperation::default()
        };
        let mut b = machine("b", Some(MachinePhase::CrashLoopBackOff));
        b.spec.provider_id = "sim:///b".into();
        b.status.as_mut().unwrap().last_operation = failure.clone();
        let mut preserved = machine("a", Some(MachinePhase::Failed));
        preserved.status.as_mut().unwrap().last_operation = failure.clone();
        preserved
            .status
            .as_mut()
            .unwrap()
            .current_status
            .preserve_expiry_time = Some(Time(at(5000)));
        let machines = [b, preserved, running("c")];
        let refs: Vec<&Machine> = machines.iter().collect();
        let s = status(&set, &refs, &ManageResult::NotRun, at(1000)).update.status;
        assert_eq!(
            s.failed_machines,
            Some(vec![MachineSummary {
                name: "b".into(),
                provider_id: "sim:///b".into(),
                last_operation: failure,
                owner_ref: "ms".into(),
            }])
        );
        assert_eq!(s.preserved_failed_replicas, 1);
        let none = status(&set, &[&running("c")], &ManageResult::NotRun, at(1000));
        assert_eq!(none.update.status.failed_machines, None);
    }

    #[test]
    fn the_replica_failure_condition_follows_the_last_pass() {
        let mut set = set(3);
        set.status = Some(MachineSetStatus {
            conditions: vec![MachineSetCondition {
                r#type: MachineSetConditionType::Frozen,
                status: ConditionStatus::True,
                last_transition_time: None,
                reason: "OverShootingReplicaCount".into(),
                message: String::new(),
            }],
            ..MachineSetStatus::default()
        });
        let failed = ManageResult::Failed(ReplicaFailure {
            reason: ReplicaFailureReason::FailedCreate,
            message: "quota exceeded".into(),
        });
        let first = status(&set, &[], &failed, at(1000)).update;
        let condition = first.status.conditions.last().unwrap();
        assert_eq!(condition.r#type, MachineSetConditionType::ReplicaFailure);
        assert_eq!(condition.reason, "FailedCreate");
        assert_eq!(condition.message, "quota exceeded");
        assert_eq!(condition.last_transition_time, Some(Time(at(1000))));
        assert_eq!(first.status.conditions[0].r#type, MachineSetConditionType::Frozen);

        // Same reason again later: nothing changes (reference SetCondition keeps a condition of equal status and
        // reason).
        let mut stored = set.clone();
        first.apply(stored.status.as_mut().unwrap());
        let again = ManageResult::Failed(ReplicaFailure {
            reason: ReplicaFailureReason::FailedCreate,
            message: "quota exceeded again".into(),
        });
        let second = status(&stored, &[], &again, at(2000)).update;
        assert!(!second.changes(stored.status.as_ref()));
        // A pass that did nothing keeps it; a pass that succeeded clears it.
        assert!(
            !status(&stored, &[], &ManageResult::NotRun, at(3000))
                .update
                .changes(stored.status.as_ref())
        );
        let cleared = status(&stored, &[], &ManageResult::Succeeded, at(3000)).update;
        assert_eq!(cleared.status.conditions.len(), 1);
        assert!(cleared.changes(stored.status.as_ref()));
    }

    #[test]
    fn status_is_written_only_when_it_changes_and_the_patch_clears_zeroes() {
        let mut set = set(2);
        let machines = [running("a"), running("b")];
        let refs: Vec<&Machine> = machines.iter().collect();
        let update = status(&set, &refs, &ManageResult::Succeeded, at(1000)).update;
        assert!(update.changes(None));
        let mut object = json!({ "status": { "lastOperation": { "description": "kept" } } });
        json_patch::merge(&mut object, &update.merge_patch());
        let written: MachineSetStatus = serde_json::from_value(object["status"].clone()).unwrap();
        assert_eq!(written.replicas, 2);
        assert_eq!(written.last_operation.description, "kept");
        set.status = Some(written);
        assert!(
            !status(&set, &refs, &ManageResult::Succeeded, at(1100))
                .update
                .changes(set.status.as_ref())
        );

        // Scaled to zero: the patch writes null for the counts, so they do not linger.
        let empty = status(&set, &[], &ManageResult::Succeeded, at(1200)).update;
        let patch = empty.merge_patch();
        assert_eq!(patch["status"]["replicas"], Value::Null);
        assert_eq!(patch["status"]["readyReplicas"], Value::Null);
        assert_eq!(patch["status"]["observedGeneration"], 4);
        assert!(patch["status"].get("lastOperation").is_none());
        let mut object = serde_json::to_value(set.status.as_ref().unwrap()).unwrap();
        json_patch::merge(&mut object, &patch["status"]);
        let written: MachineSetStatus = serde_json::from_value(object).unwrap();
        assert_eq!(written.replicas, 0);
        let mut applied = set.status.clone().unwrap();
        empty.apply(&mut applied);
        assert_eq!(applied, written);
    }

    // --- Properties ------------------------------------------------------------------------------------------------

    /// The reference's criteria, written as the reference states them (reference §5 ActiveMachines.Less, 1–5), to
    /// check [`DeletionOrder`] against. `Equal` where the reference has no opinion.
    fn reference_compare(a: &Machine, b: &Machine, now: Timestamp) -> Ordering {
        let preserved = |m: &Machine| {
            is_preserved(m, now).then(|| {
                let auto = annotation(&m.metadata, annotations::PRESERVE) == Some("auto-preserved");
                (!auto, preserve_expiry(m))
            })
        };
        match (preserved(a), preserved(b)) {
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x != y => return x.cmp(&y),
            _ => {}
        }
        if priority(a) != priority(b) {
            return priority(a).cmp(&priority(b));
        }
        match (marked_for_deletion_at(a), marked_for_deletion_at(b)) {
            (Some(x), Some(y)) if x != y => return x.cmp(&y),
            (Some(_), None) => return Ordering::Less,
            (None, Some(_)) => return Ordering::Greater,
            _ => {}
        }
        let rank = |m: &Machine| phase_rank(m.phase());
        if rank(a) != rank(b) {
            return rank(a).cmp(&rank(b));
        }
        timeouts::created_at(a).cmp(&timeouts::created_at(b))
    }

    fn phase_strategy() -> impl Strategy<Value = Option<MachinePhase>> {
        prop_oneof![
            Just(None),
            proptest::sample::select(MachinePhase::ALL.to_vec()).prop_map(Some),
        ]
    }

    prop_compose! {
        fn arbitrary_machine(index: usize)(
            phase in phase_strategy(),
            priority in proptest::option::of(prop_oneof![Just("1"), Just("2"), Just("3"), Just("5"), Just("x")]),
            mark in proptest::option::of(0i64..4),
            created in proptest::option::of(0i64..4),
            preserved in proptest::option::of((0i64..4, any::<bool>())),
        ) -> Machine {
            let mut m = machine(&format!("m{index}"), phase);
            m.metadata.creation_timestamp = created.map(|c| Time(at(c)));
            if let Some(p) = priority {
                annotate(&mut m, annotations::MACHINE_PRIORITY, p);
            }
            if let Some(mark) = mark {
                annotate(&mut m, annotations::MARKED_FOR_DELETION_TIME, &at(mark).to_string());
            }
            if let Some((expiry, auto)) = preserved {
                // Expiries 0 and 1 lie in the past (now = 2), 2 is now (not preserved), 3 in the future.
                m.status.as_mut().unwrap().current_status.preserve_expiry_time = Some(Time(at(expiry)));
                if auto {
                    annotate(&mut m, annotations::PRESERVE, "auto-preserved");
                }
            }
            m
        }
    }

    fn machines_strategy() -> impl Strategy<Value = Vec<Machine>> {
        (1usize..12).prop_flat_map(|n| (0..n).map(arbitrary_machine).collect::<Vec<_>>())
    }

    /// Durations as users write them: 5m and 300s are the same.
    fn duration_text() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("5m"), Just("300s"), Just("1h")]
    }

    fn policy_strategy() -> impl Strategy<Value = Option<DeletePolicy>> {
        prop_oneof![
            Just(None),
            proptest::sample::select(DeletePolicy::ALL.to_vec()).prop_map(Some),
        ]
    }

    proptest! {
        #[test]
        fn the_deletion_order_is_a_total_order_consistent_with_the_reference(
            machines in machines_strategy(),
            policy in policy_strategy(),
            seed in any::<u64>(),
        ) {
            let now = at(2);
            let order = DeletionOrder::new(policy, seed, now);
            for a in &machines {
                for b in &machines {
                    let ours = order.compare(a, b);
                    // Antisymmetric, and equal only for the same machine.
                    prop_assert_eq!(ours, order.compare(b, a).reverse());
                    prop_assert_eq!(ours == Ordering::Equal, name_of(a) == name_of(b));
                    let reference = reference_compare(a, b, now);
                    if policy.is_none() {
                        // Without a policy: exactly the reference's criteria wherever they decide.
                        if reference != Ordering::Equal {
                            prop_assert_eq!(ours, reference, "{} vs {}", name_of(a), name_of(b));
                        }
                    } else {
                        // With a policy: preservation, priority and mark still decide first.
                        let mut a_tail = a.clone();
                        let mut b_tail = b.clone();
                        for m in [&mut a_tail, &mut b_tail] {
                            m.status.as_mut().unwrap().current_status.phase = Some(MachinePhase::Running);
                            m.metadata.creation_timestamp = None;
                        }
                        let prefix = reference_compare(&a_tail, &b_tail, now);
                        let healthy = |m: &Machine| {
                            matches!(m.phase(), Some(MachinePhase::Running | MachinePhase::Available))
                        };
                        let (age_a, age_b) = (timeouts::created_at(a), timeouts::created_at(b));
                        if prefix != Ordering::Equal {
                            prop_assert_eq!(ours, prefix);
                        } else if healthy(a) != healthy(b) {
                            // Then unhealthy machines first, as Cluster API's delete policies.
                            prop_assert_eq!(ours, healthy(a).cmp(&healthy(b)));
                        } else if age_a != age_b && policy == Some(DeletePolicy::Oldest) {
                            prop_assert_eq!(ours, age_a.cmp(&age_b));
                        } else if age_a != age_b && policy == Some(DeletePolicy::Newest) {
                            prop_assert_eq!(ours, age_b.cmp(&age_a));
                        }
                    }
                }
                for b in &machines {
                    for c in &machines {
                        // Transitive.
                        if order.compare(a, b) != Ordering::Greater && order.compare(b, c) != Ordering::Greater {
                            prop_assert_ne!(order.compare(a, c), Ordering::Greater);
                        }
                    }
                }
            }
            // Sorting is deterministic whatever the input order.
            let mut forward: Vec<&Machine> = machines.iter().collect();
            let mut backward: Vec<&Machine> = machines.iter().rev().collect();
            order.sort(&mut forward);
            order.sort(&mut backward);
            prop_assert_eq!(names(&forward), names(&backward));
        }

        #[test]
        fn slow_start_batches_sum_to_the_count_and_double(count in 0usize..500, initial in 1usize..4) {
            let batches = slow_start_batches(count, initial);
            prop_assert_eq!(batches.iter().sum::<usize>(), count);
            // Every batch but the last is `initial · 2^i`; the last is what is left, never more than that.
            for (i, batch) in batches.iter().enumerate() {
                let full = initial << i;
                if i + 1 < batches.len() {
                    prop_assert_eq!(*batch, full);
                } else {
                    prop_assert!(*batch >= 1 && *batch <= full);
                }
            }
        }

        #[test]
        fn decide_never_overshoots_never_undershoots_and_deletes_only_its_own(
            machines in machines_strategy(),
            replicas in 0i32..12,
            deleting_mask in proptest::collection::vec(any::<bool>(), 12),
            policy in policy_strategy(),
        ) {
            let mut set = set(replicas);
            if let Some(policy) = policy {
                annotate_set(&mut set, extensions::DELETE_POLICY, policy.as_str());
            }
            let machines: Vec<Machine> = machines
                .into_iter()
                .zip(deleting_mask)
                .map(|(mut m, deleting)| {
                    if deleting {
                        m.metadata.deletion_timestamp = Some(Time(at(1)));
                    }
                    m
                })
                .collect();
            let refs: Vec<&Machine> = machines.iter().collect();
            let now = at(2);
            let plan = decide(&MachineSetInput {
                set: &set,
                machines: &refs,
                expectations: &Expectations::new(),
                deployment_delete_policy: None,
                now,
                random: 1,
            });
            let deleted: BTreeSet<&str> = plan.delete.iter().map(|d| d.name.as_str()).collect();
            prop_assert_eq!(deleted.len(), plan.delete.len(), "each machine once");
            for name in &deleted {
                let m = machines.iter().find(|m| name_of(m) == *name).unwrap();
                prop_assert!(!is_going(m), "only machines not on their way out");
            }
            // Machines that stay and count.
            let staying = machines
                .iter()
                .filter(|m| !is_going(m) && !deleted.contains(name_of(m)))
                .filter(|m| m.phase() != Some(MachinePhase::Failed) || keeps_failed_machine(m, now))
                .count();
            let replicas = usize::try_from(replicas).unwrap();
            prop_assert!(staying + plan.create <= replicas.max(staying), "never more than replicas");
            let scale_down = plan.delete.iter().filter(|d| d.reason == DeletionReason::ScaleDown).count();
            if scale_down > 0 {
                prop_assert_eq!(staying, replicas, "scale-down stops at replicas");
                prop_assert_eq!(plan.create, 0);
            } else {
                prop_assert_eq!(staying + plan.create, replicas.max(staying));
            }
            prop_assert_eq!(plan.create_batches.iter().sum::<usize>(), plan.create);
        }

        #[test]
        fn propagation_converges_in_one_patch(
            template_timeouts in proptest::collection::vec(proptest::option::of(duration_text()), 3),
            machine_timeouts in proptest::collection::vec(proptest::option::of(duration_text()), 3),
            template_labels in proptest::option::of(proptest::collection::btree_map("[a-c]", "[x-z]", 0..3)),
            machine_labels in proptest::option::of(proptest::collection::btree_map("[a-c]", "[x-z]", 0..3)),
            set_timeout in proptest::option::of(prop_oneof![Just("20m"), Just("1h")]),
            machine_timeout in proptest::option::of(prop_oneof![Just("20m"), Just("1h")]),
        ) {
            let mut set = set(1);
            let mut m = running("a");
            let config = |c: &mut MachineConfiguration, values: &[Option<&str>]| {
                c.drain_timeout = values[0].map(GoDuration::new);
                c.health_timeout = values[1].map(GoDuration::new);
                c.creation_timeout = values[2].map(GoDuration::new);
            };
            config(&mut set.spec.template.spec.configuration, &template_timeouts);
            config(&mut m.spec.configuration, &machine_timeouts);
            let node_template = |labels: Option<BTreeMap<String, String>>| labels.map(|l| NodeTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(l), ..ObjectMeta::default() }),
                spec: None,
            });
            set.spec.template.spec.node_template = node_template(template_labels);
            m.spec.node_template = node_template(machine_labels);
            if let Some(t) = set_timeout {
                annotate_set(&mut set, annotations::EFFECTIVE_CREATION_TIMEOUT, t);
            }
            if let Some(t) = machine_timeout {
                annotate(&mut m, annotations::EFFECTIVE_CREATION_TIMEOUT, t);
            }
            let updated = match propagation_patch(&set, &m) {
                Some(patch) => apply_patch(&m, &patch),
                None => m.clone(),
            };
            prop_assert_eq!(propagation_patch(&set, &updated), None);
            prop_assert_eq!(&updated.spec.node_template, &set.spec.template.spec.node_template);
            prop_assert_eq!(
                annotation(&updated.metadata, annotations::EFFECTIVE_CREATION_TIMEOUT),
                set_timeout
            );
            let parse = |d: &Option<GoDuration>| d.as_ref().map(|d| d.parse().unwrap());
            let (got, want) = (&updated.spec.configuration, &set.spec.template.spec.configuration);
            prop_assert_eq!(parse(&got.drain_timeout), parse(&want.drain_timeout));
            prop_assert_eq!(parse(&got.health_timeout), parse(&want.health_timeout));
            prop_assert_eq!(parse(&got.creation_timeout), parse(&want.creation_timeout));
            // Everything else is untouched.
            prop_assert_eq!(&updated.metadata.labels, &m.metadata.labels);
            prop_assert_eq!(&updated.spec.class.name, &m.spec.class.name);
        }
    }

    // --- A lagging cache never yields extra machines -----------------------------------------------------------------

    /// One machine of the simulated API server: when it was created, failed, deleted and removed (logical times).
    #[derive(Clone)]
    struct SimMachine {
        machine: Machine,
        created: u64,
        failed: Option<u64>,
        deleted: Option<u64>,
    }

    /// How long a deleted machine stays (finalizer) before it is gone.
    const LINGER: u64 = 2;

    struct World {
        clock: u64,
        machines: Vec<SimMachine>,
        next_name: usize,
    }

    impl World {
        fn tick(&mut self) -> u64 {
            self.clock += 1;
            self.clock
        }

        /// The API server's state as of logical time `seen` (what a cache that lags behind holds).
        fn view(&self, seen: u64) -> Vec<Machine> {
            self.machines
                .iter()
                .filter(|s| s.created <= seen && s.deleted.is_none_or(|d| d + LINGER > seen))
                .map(|s| {
                    let mut m = s.machine.clone();
                    if s.failed.is_some_and(|f| f <= seen) {
                        m.status.as_mut().unwrap().current_status.phase = Some(MachinePhase::Failed);
                    }
                    if s.deleted.is_some_and(|d| d <= seen) {
                        m.metadata.deletion_timestamp = Some(Time(at(1)));
                    }
                    m
                })
                .collect()
        }

        /// Machines that exist now, are not being deleted and are not Failed.
        fn active_now(&self) -> usize {
            self.active_known(u64::MAX)
        }

        /// The same, except that failures after `seen` are not counted: those are someone else's changes the cache
        /// has not shown yet, which no controller can act on; the set's own creations and deletions are all counted.
        fn active_known(&self, seen: u64) -> usize {
            self.machines
                .iter()
                .filter(|s| s.deleted.is_none() && s.failed.is_none_or(|f| f > seen))
                .count()
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Reconcile with a cache lagging this many logical steps behind (never going back).
        Reconcile(u64),
        /// The machine controller marks the machine at this index Failed.
        Fail(usize),
        /// Someone scales the set.
        Scale(i32),
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u64..6).prop_map(Op::Reconcile),
            1 => (0usize..20).prop_map(Op::Fail),
            1 => (0i32..7).prop_map(Op::Scale),
        ]
    }

    /// One reconcile against the cache as of `seen`; returns the plan it acted on. Checks that it never creates
    /// beyond `replicas`, and never scales down below it, in the API server's real state.
    fn reconcile(
        world: &mut World,
        set: &MachineSet,
        exp: &mut Expectations,
        seen: u64,
        now: Timestamp,
    ) -> MachineSetPlan {
        let cache = world.view(seen);
        exp.observe(&cache);
        let owned = claim_machines(set, &cache).owned;
        let plan = decide(&MachineSetInput {
            set,
            machines: &owned,
            expectations: exp,
            deployment_delete_policy: None,
            now,
            random: 3,
        });
        let replicas = usize::try_from(set.spec.replicas).unwrap();
        let before = world.active_known(seen);
        if plan.create > 0 {
            assert!(
                before + plan.create <= replicas,
                "extra machines: {before} active + {} created > {replicas} replicas",
                plan.create
            );
        }
        for deletion in &plan.delete {
            exp.expect_deletion(&deletion.name, now);
            let clock = world.tick();
            let target = world
                .machines
                .iter_mut()
                .find(|s| name_of(&s.machine) == deletion.name)
                .unwrap();
            if target.deleted.is_none() {
                target.deleted = Some(clock);
            }
        }
        let scaled_down = plan.delete.iter().any(|d| d.reason == DeletionReason::ScaleDown);
        if scaled_down {
            assert!(world.active_known(seen) >= replicas, "scaled down below replicas");
        }
        for _ in 0..plan.create {
            let mut m = machine_to_create(set);
            m.metadata.name = Some(format!("ms-{}", world.next_name));
            m.metadata.uid = Some(format!("uid-ms-{}", world.next_name));
            world.next_name += 1;
            m.status = Some(MachineStatus::default());
            exp.expect_creation(name_of(&m).to_owned(), now);
            let created = world.tick();
            world.machines.push(SimMachine {
                machine: m,
                created,
                failed: None,
                deleted: None,
            });
        }
        plan
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn a_lagging_cache_never_yields_extra_machines(
            initial in 0i32..6,
            ops in proptest::collection::vec(op_strategy(), 1..60),
        ) {
            // Issue: "expectations enforced, so a lagging cache never yields extra machines". The cache is the API
            // server's state some steps ago (never going back); the set must not create beyond replicas nor delete
            // below them in the real state, whatever the lag; once the cache catches up, the set converges.
            let mut set = set(initial);
            let mut world = World { clock: 0, machines: Vec::new(), next_name: 0 };
            let mut exp = Expectations::new();
            let mut seen = 0;
            for (step, op) in ops.iter().enumerate() {
                let now = at(1000 + i64::try_from(step).unwrap());
                match op {
                    Op::Reconcile(lag) => {
                        seen = seen.max(world.clock.saturating_sub(*lag));
                        let _ = reconcile(&mut world, &set, &mut exp, seen, now);
                    }
                    Op::Fail(index) => {
                        let clock = world.tick();
                        if let Some(target) = world.machines.get_mut(*index)
                            && target.deleted.is_none()
                            && target.failed.is_none()
                        {
                            target.failed = Some(clock);
                        }
                    }
                    Op::Scale(replicas) => set.spec.replicas = *replicas,
                }
            }
            // The cache catches up: the set converges to replicas, with every Failed machine deleted.
            let mut settled = false;
            for round in 0..20 {
                let now = at(2000 + round);
                let clock = world.clock;
                let plan = reconcile(&mut world, &set, &mut exp, clock, now);
                if plan.create == 0 && plan.delete.is_empty() && plan.holds.is_empty() {
                    settled = true;
                    break;
                }
            }
            prop_assert!(settled);
            prop_assert_eq!(world.active_now(), usize::try_from(set.spec.replicas).unwrap());
            prop_assert!(world.machines.iter().all(|s| s.failed.is_none() || s.deleted.is_some()));
        }
    }
}
