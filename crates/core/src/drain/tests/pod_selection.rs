//! Pod selection and order, and waiting for pods to go.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{EphemeralVolumeSource, Pod, PodStatus, Volume},
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
};
use mcm_api::keys::extensions;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;

#[test]
fn mirror_daemonset_and_skip_pods_are_left_alone() {
    let mut mirror = pod("mirror");
    mirror.metadata.annotations = Some(BTreeMap::from([(MIRROR_POD_ANNOTATION.into(), "x".into())]));
    let mut ds = pod("ds");
    ds.metadata.owner_references = Some(vec![OwnerReference {
        kind: "DaemonSet".into(),
        controller: Some(true),
        name: "agent".into(),
        ..OwnerReference::default()
    }]);
    let skip = bound("skip").label(extensions::DRAIN_LABEL, "skip").build();
    // An owner that is not the controller does not make a DaemonSet pod.
    let mut owned = pod("owned");
    owned.metadata.owner_references = Some(vec![OwnerReference {
        kind: "DaemonSet".into(),
        controller: Some(false),
        ..OwnerReference::default()
    }]);
    let drain = plan("node-1", &[mirror, ds, skip, owned]);
    assert_eq!(
        drain
            .skipped
            .iter()
            .map(|(p, r)| (p.name.as_str(), *r))
            .collect::<Vec<_>>(),
        [
            ("ds", SkipReason::DaemonSet),
            ("mirror", SkipReason::Mirror),
            ("skip", SkipReason::SkipLabel)
        ]
    );
    assert_eq!(names(&drain.parallel), ["owned"]);
}

#[test]
fn wait_completed_and_terminating_pods_are_waited_for_not_evicted() {
    let job = bound("job")
        .label(extensions::DRAIN_LABEL, "wait-completed")
        .build();
    let mut done = bound("done")
        .label(extensions::DRAIN_LABEL, "wait-completed")
        .build();
    done.status = Some(PodStatus {
        phase: Some("Succeeded".into()),
        ..PodStatus::default()
    });
    let mut leaving = pod("leaving");
    leaving.metadata.deletion_timestamp = Some(Time(at(5)));
    let other_value = bound("other").label(extensions::DRAIN_LABEL, "please").build();
    let drain = plan("node-1", &[job, done, leaving, other_value]);
    assert_eq!(
        drain
            .wait
            .iter()
            .map(|(p, r)| (p.name.as_str(), *r))
            .collect::<Vec<_>>(),
        [
            ("job", WaitReason::WaitCompleted),
            ("leaving", WaitReason::Terminating)
        ]
    );
    assert_eq!(
        drain.skipped.len(),
        1,
        "a finished wait-completed pod needs nothing"
    );
    assert_eq!(
        names(&drain.parallel),
        ["other"],
        "an unknown label value drains as usual"
    );
    assert!(!drain.is_done());
    assert_eq!(
        drain
            .force_deletions()
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        ["job", "leaving", "other"]
    );
}

#[test]
fn pods_with_claims_are_serial_by_priority_and_others_parallel() {
    // Reference §4: "Pods with PVCs are evicted serially, sorted by spec.priority descending".
    let mut ephemeral = pod("eph");
    ephemeral.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "scratch".into(),
        ephemeral: Some(EphemeralVolumeSource::default()),
        ..Volume::default()
    }]);
    let mut elsewhere = bound("elsewhere").claim("c").build();
    elsewhere.spec.as_mut().unwrap().node_name = Some("node-2".into());
    let pods = vec![
        bound("db-b").claim("b").priority(10).build(),
        bound("db-none").claim("n").build(),
        bound("db-a").claim("a").priority(10).build(),
        bound("db-high").claim("h").priority(1000).build(),
        pod("web-2"),
        pod("web-1"),
        ephemeral,
        elsewhere,
    ];
    let drain = plan("node-1", &pods);
    assert_eq!(
        names(&drain.serial),
        ["db-high", "db-a", "db-b", "db-none", "eph"]
    );
    assert_eq!(names(&drain.parallel), ["web-1", "web-2"]);
    assert_eq!(claims(&pods[6]), ["eph-scratch"]);
}

#[test]
fn waiting_for_pods_follows_uid_and_phase() {
    let p = pod("p");
    let evicted = PodRef::of(&p);
    assert!(!pod_gone(&evicted, Some(&p)));
    assert!(pod_gone(&evicted, None));
    let mut replacement = p.clone();
    replacement.metadata.uid = Some("other".into());
    assert!(
        pod_gone(&evicted, Some(&replacement)),
        "a new pod under the same name"
    );
    let mut finished = p.clone();
    finished.status = Some(PodStatus {
        phase: Some("Failed".into()),
        ..PodStatus::default()
    });
    assert!(wait_done(&evicted, Some(&finished)));
    assert!(!wait_done(&evicted, Some(&p)));
}

#[test]
fn wait_times_follow_the_grace_period() {
    let s = settings();
    let mut p = pod("p");
    assert_eq!(
        pod_gone_timeout(&p, Duration::from_hours(2)),
        Duration::from_mins(1)
    );
    p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(600);
    assert_eq!(
        pod_gone_timeout(&p, Duration::from_mins(1)),
        Duration::from_secs(90)
    );
    assert_eq!(detach_timeout(&p, &s), Duration::from_mins(12));
}

proptest! {
    #[test]
    fn serial_order_is_priority_descending_then_name(
        specs in proptest::collection::vec((0usize..40, proptest::option::of(-5i32..5), any::<bool>()), 0..30)
    ) {
        let pods: Vec<Pod> = specs
            .iter()
            .enumerate()
            .map(|(i, (n, priority, pvc))| {
                let p = bound(&format!("p{n}-{i}")).with(|p| p.spec.get_or_insert_default().priority = *priority);
                if *pvc { p.claim("c") } else { p }.build()
            })
            .collect();
        let drain = plan("node-1", &pods);
        // Every pod lands in exactly one list.
        let all: BTreeSet<PodRef> = pods.iter().map(PodRef::of).collect();
        let planned: BTreeSet<PodRef> = drain.parallel.iter().chain(&drain.serial).cloned().collect();
        prop_assert_eq!(all, planned);
        prop_assert_eq!(drain.serial.len(), specs.iter().filter(|s| s.2).count());
        // Serial: priority descending, ties by name.
        let priority_of = |r: &PodRef| {
            pods.iter().find(|p| PodRef::of(p) == *r).and_then(|p| p.spec.as_ref()?.priority).unwrap_or(0)
        };
        for pair in drain.serial.windows(2) {
            let (a, b) = (priority_of(&pair[0]), priority_of(&pair[1]));
            prop_assert!(a > b || (a == b && pair[0].name < pair[1].name));
        }
    }
}
