//! The wire markers and descriptions: round trips, the reference's texts word for word, and properties.

use std::time::Duration;

use mcm_driver::MachineCode;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;
use crate::drain::{Blocker, DrainOutcome, ForceReason, PodRef};

#[test]
fn every_step_round_trips_through_its_marker() {
    for step in DeletionStep::ALL {
        assert_eq!(DeletionStep::parse(&step.to_string()), step, "{}", step.name());
    }
    assert_eq!(DeletionStep::SetTerminating.to_string(), "");
}

#[test]
fn descriptions_written_by_the_reference_are_read_as_the_reference_reads_them() {
    // Reference §3.5: the next step is decoded by substring match on lastOperation.description.
    let cases = [
        (
            "Set machine status to termination. Now, getting VM Status",
            DeletionStep::GetVmStatus,
        ),
        (
            "Error occurred with decoding machine error status while getting VM status, aborting with retry. \
             Set machine status to termination. Now, getting VM Status",
            DeletionStep::GetVmStatus,
        ),
        ("Initiate node drain", DeletionStep::Drain),
        (
            "Drain failed due to - error when evicting pods. Will retry in next sync. Initiate node drain",
            DeletionStep::Drain,
        ),
        (
            "Force Drain successful. Delete Volume Attachments",
            DeletionStep::DeleteVolumeAttachments,
        ),
        (
            "Drain failed due to - x. However, since it's a force deletion shall continue deletion of VM. Delete \
             Volume Attachments",
            DeletionStep::DeleteVolumeAttachments,
        ),
        ("Drain successful. Initiate VM deletion", DeletionStep::DeleteVm),
        (
            "Skipping drain as nodeName is not a valid one for machine. Initiate VM deletion",
            DeletionStep::DeleteVm,
        ),
        (
            "No Live VolumeAttachments for node: n. Moving to VM Deletion. Initiate VM deletion",
            DeletionStep::DeleteVm,
        ),
        (
            "VM deletion was successful. Initiate node object deletion",
            DeletionStep::DeleteNode,
        ),
        (
            "VM not found. Continuing deletion flow. Initiate node object deletion",
            DeletionStep::DeleteNode,
        ),
        (
            "VM was not found at provider. Initiate node object deletion",
            DeletionStep::DeleteNode,
        ),
        (
            "VM deletion was successful. Remove node finalizers",
            DeletionStep::DeleteNode,
        ),
        (
            "Deletion of Node Object \"n\" is successful. Initiate machine object finalizer removal",
            DeletionStep::RemoveFinalizer,
        ),
        // Not ending with a marker: the reference's substring rule.
        ("Initiate node drain (by hand)", DeletionStep::Drain),
        // Unknown text: restart at the first step.
        ("Creating machine on cloud provider", DeletionStep::SetTerminating),
        ("", DeletionStep::SetTerminating),
    ];
    for (text, step) in cases {
        assert_eq!(DeletionStep::parse(text), step, "{text}");
    }
}

#[test]
fn a_message_quoting_a_marker_does_not_mislead() {
    // The reference would read "Initiate node drain" first (its order); the text ends with the VM deletion marker.
    let description = DeletionDescription::VmDeletionFailed {
        code: MachineCode::Unavailable,
        message: "Initiate node drain".into(),
        backoff: true,
    };
    assert_eq!(
        DeletionStep::parse(&description.to_string()),
        DeletionStep::DeleteVm
    );
}

#[test]
fn reference_texts_are_written_word_for_word() {
    let cases = [
        (
            DeletionDescription::Started,
            "Set machine status to termination. Now, getting VM Status",
        ),
        (DeletionDescription::VmFound, "Initiate node drain"),
        (
            DeletionDescription::NoNodeName,
            "Skipping drain as nodeName is not a valid one for machine. Initiate VM deletion",
        ),
        (
            DeletionDescription::VmDeleted,
            "VM deletion was successful. Initiate node object deletion",
        ),
        (
            DeletionDescription::VmNotFound,
            "VM not found. Continuing deletion flow. Initiate node object deletion",
        ),
        (
            DeletionDescription::NodeDeleted { node: "n".into() },
            "Deletion of Node Object \"n\" is successful. Initiate machine object finalizer removal",
        ),
        (
            DeletionDescription::NodeAlreadyGone { node: "n".into() },
            "No node object found for \"n\", continuing deletion flow. Initiate machine object finalizer removal",
        ),
        (
            DeletionDescription::VolumesDetached { node: "n".into() },
            "Node Volumes for node: n are already detached. Moving to VM Deletion. Initiate VM deletion",
        ),
        (
            DeletionDescription::ForceDrainFailed {
                outcome: DrainOutcome::Failed { message: "x".into() },
            },
            "Drain failed due to - x. However, since it's a force deletion shall continue deletion of VM. \
             Delete Volume Attachments",
        ),
        (
            DeletionDescription::VmDeletionFailed {
                code: MachineCode::Unavailable,
                message: "m".into(),
                backoff: true,
            },
            "VM deletion failed due to - machine codes error: code = [Unavailable] message = [m]. However, will \
             re-try in the next resync. Initiate VM deletion",
        ),
        (
            DeletionDescription::HooksPending {
                kind: HookKind::PreDrain,
                hooks: vec!["a".into(), "b".into()],
            },
            "Waiting for pre-drain hooks [a, b]. Initiate node drain",
        ),
        (
            DeletionDescription::HooksPending {
                kind: HookKind::PreTerminate,
                hooks: vec!["backup".into()],
            },
            "Waiting for pre-terminate hooks [backup]. Initiate VM deletion",
        ),
    ];
    for (description, expected) in cases {
        assert_eq!(description.to_string(), expected);
    }
}

fn step_strategy() -> impl Strategy<Value = DeletionStep> {
    proptest::sample::select(DeletionStep::ALL.to_vec())
}

/// Free text, sometimes quoting a marker.
fn message_strategy() -> impl Strategy<Value = String> {
    let markers: Vec<String> = DeletionStep::DECODE_ORDER
        .iter()
        .map(|(m, _)| (*m).to_owned())
        .collect();
    prop_oneof![
        any::<String>(),
        (any::<String>(), proptest::sample::select(markers)).prop_map(|(a, m)| format!("{a}{m}")),
    ]
}

fn outcome_strategy() -> impl Strategy<Value = DrainOutcome> {
    let pod = ("[a-z0-9-]{1,10}", "[a-z0-9-]{1,10}").prop_map(|(namespace, name)| PodRef {
        namespace,
        name,
        uid: String::new(),
    });
    let blocker = (pod, proptest::option::of("[a-z0-9-]{1,10}"), any::<bool>()).prop_map(
        |(pod, pdb, misconfigured)| Blocker {
            pod,
            pdb,
            misconfigured,
        },
    );
    prop_oneof![
        (0usize..5, 0usize..5).prop_map(|(evicted, deleted)| DrainOutcome::Drained { evicted, deleted }),
        (0usize..5, proptest::option::of(blocker.clone()))
            .prop_map(|(remaining, blocked)| DrainOutcome::InProgress { remaining, blocked }),
        blocker.prop_map(DrainOutcome::Blocked),
        (0u64..10_000, 0usize..5).prop_map(|(s, remaining)| DrainOutcome::TimedOut {
            timeout: Duration::from_secs(s),
            remaining
        }),
        message_strategy().prop_map(|message| DrainOutcome::Failed { message }),
    ]
}

fn description_strategy() -> impl Strategy<Value = DeletionDescription> {
    use DeletionDescription as D;
    let name = "[a-z0-9][a-z0-9.-]{0,20}";
    let code = (0u32..18).prop_map(|n| MachineCode::from_number(n).unwrap());
    let reason = prop_oneof![
        Just(ForceReason::Label { value: "True".into() }),
        Just(ForceReason::DrainTimeout {
            timeout: Duration::from_hours(2)
        }),
        Just(ForceReason::NodeNotReady {
            after: Duration::from_mins(5)
        }),
    ];
    let kind = prop_oneof![Just(HookKind::PreDrain), Just(HookKind::PreTerminate)];
    prop_oneof![
        Just(D::Started),
        Just(D::VmFound),
        Just(D::NoNodeName),
        Just(D::VmDeleted),
        Just(D::VmNotFound),
        (code.clone(), message_strategy()).prop_map(|(code, message)| D::VmStatusFailed { code, message }),
        code.clone().prop_map(|code| D::VmStatusUnknown { code }),
        prop_oneof![Just(DeletionStep::DeleteVm), Just(DeletionStep::RemoveFinalizer)]
            .prop_map(|next| D::NoTargetCluster { next }),
        (kind, proptest::collection::vec("[a-z0-9][a-z0-9._-]{0,10}", 1..4))
            .prop_map(|(kind, hooks)| D::HooksPending { kind, hooks }),
        name.prop_map(|node| D::NodeNotFound { node }),
        outcome_strategy().prop_map(|outcome| D::DrainInProgress { outcome }),
        outcome_strategy().prop_map(|outcome| D::DrainFailed { outcome }),
        outcome_strategy().prop_map(|outcome| D::Drained { outcome }),
        (reason, outcome_strategy()).prop_map(|(reason, outcome)| D::ForceDrained { reason, outcome }),
        outcome_strategy().prop_map(|outcome| D::ForceDrainFailed { outcome }),
        (name, 0usize..9).prop_map(|(node, count)| D::VolumeAttachmentsDeleting { node, count }),
        name.prop_map(|node| D::VolumesDetached { node }),
        name.prop_map(|node| D::NoLiveVolumeAttachments { node }),
        name.prop_map(|node| D::VolumeAttachmentsNodeGone { node }),
        (name, message_strategy()).prop_map(|(node, message)| D::VolumeAttachmentsFailed { node, message }),
        (code, message_strategy(), any::<bool>()).prop_map(|(code, message, backoff)| {
            D::VmDeletionFailed {
                code,
                message,
                backoff,
            }
        }),
        name.prop_map(|node| D::NodeDeleted { node }),
        name.prop_map(|node| D::NodeAlreadyGone { node }),
        name.prop_map(|machine| D::NoNodeLabel { machine }),
        (name, message_strategy()).prop_map(|(node, message)| D::NodeDeletionFailed { node, message }),
        (name, name, step_strategy()).prop_map(|(machine, node, at)| D::ControllerNode { machine, node, at }),
    ]
}

proptest! {
    #[test]
    fn every_description_names_its_next_step(description in description_strategy()) {
        // The persisted step is read back from the written text, whatever the messages inside say.
        let text = description.to_string();
        prop_assert_eq!(DeletionStep::parse(&text), description.next_step(), "{}", text);
    }

    #[test]
    fn parse_never_panics(text in any::<String>()) {
        let _ = DeletionStep::parse(&text);
    }

    #[test]
    fn a_text_without_a_marker_restarts(text in "[a-z ,.]{0,60}") {
        prop_assert_eq!(DeletionStep::parse(&text), DeletionStep::SetTerminating);
    }
}
