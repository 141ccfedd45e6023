//! Which machines go first on scale-down: delete policies, priorities, preservation and the autoscaler's marks.
//!
//! Separate because the order is a self-contained ranking that [`decide`](super::decide) only consumes.

use std::{
    cmp::{Ordering, Reverse},
    fmt,
    str::FromStr,
};

use jiff::Timestamp;
use mcm_api::{
    Machine, MachinePhase, MachineSet, MetaExt,
    keys::{annotations, extensions},
};

use super::{AUTO_PRESERVED, PRESERVE_VALUES, common::name_of};
use crate::timeouts;

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
    let (value, source_kind) = match (deployment_annotation, set.annotation(extensions::DELETE_POLICY)) {
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
/// CrashLoopBackOff 2, Unknown 3, Pending 4, Available 5, Running 6; any other phase (none yet, in-place phases, one
/// this build does not know) 0, "so brand-new machines are deleted first".
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

pub(super) fn parse_time(value: &str) -> Option<Timestamp> {
    value.trim().parse().ok()
}

/// When the machine was marked for deletion (`machine.sapcloud.io/marked-for-deletion-time`, RFC 3339); `None` when
/// absent or unreadable.
pub fn marked_for_deletion_at(machine: &Machine) -> Option<Timestamp> {
    machine
        .annotation(annotations::MARKED_FOR_DELETION_TIME)
        .and_then(parse_time)
}

/// Whether a Failed machine is kept rather than deleted and replaced (the reference's
/// `shouldFailedMachineBeTerminated`, negated): preserved until a future `preserveExpiryTime`; with no expiry time
/// yet, while the effective preserve value is `now`, `when-failed` or `auto-preserved` (preservation being set up).
/// The effective value is the last value applied from the node
/// (`node.machine.sapcloud.io/last-applied-node-preserve-value`) when there is one, else the machine's own
/// `node.machine.sapcloud.io/preserve` annotation. An expired preservation does not keep it.
pub fn keeps_failed_machine(machine: &Machine, now: Timestamp) -> bool {
    if let Some(expiry) = machine.preserve_expiry() {
        return expiry > now;
    }
    let from_node = machine
        .annotation(annotations::LAST_APPLIED_NODE_PRESERVE_VALUE)
        .filter(|v| !v.is_empty());
    let value = from_node.or_else(|| machine.annotation(annotations::PRESERVE));
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
        let preservation = match machine.preserve_expiry() {
            Some(expiry) if expiry > self.now => {
                if machine.annotation(annotations::PRESERVE) == Some(AUTO_PRESERVED) {
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
            priority: machine.priority(),
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
