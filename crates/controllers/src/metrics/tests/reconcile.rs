//! The reconcile meters: requeues read from actions, reconciles counted and the work queue followed.

use std::{sync::Arc, time::Duration};

use kube::{ResourceExt as _, runtime::controller::Action};
use mcm_api::Machine;

use super::{lines, machine, store_of};
use crate::metrics::{Metrics, requeue_after};

#[test]
fn requeues_are_read_from_actions() {
    for duration in [
        Duration::from_secs(5),
        Duration::from_millis(100),
        Duration::from_millis(1500),
        Duration::from_mins(10),
        Duration::from_micros(250),
        Duration::from_nanos(7),
        Duration::ZERO,
    ] {
        let read = requeue_after(&Action::requeue(duration)).expect("a requeue");
        assert!(
            read.abs_diff(duration) < Duration::from_micros(1),
            "{duration:?} read as {read:?}"
        );
    }
    assert_eq!(requeue_after(&Action::await_change()), None);
}

#[test]
fn the_meter_counts_reconciles_and_follows_the_queue() {
    let metrics = Arc::new(Metrics::new());
    let m1 = machine("m1").build();
    let m2 = machine("m2").build();
    let gone = machine("gone").build();
    let store = store_of(vec![m1.clone(), m2.clone()]);
    let meter = Metrics::reconcile_meter(Some(&metrics), "machine", &store);

    // m1 succeeds and requeues at once (due), m2 is still running, `gone` fails and its requeue is due, but it
    // left the cache: kube-runtime drops such a requeue, so it does not count.
    meter.start(&m1).finish(Some(&Action::requeue(Duration::ZERO)));
    let running = meter.start(&m2);
    meter.start(&gone).finish(None);
    let policy =
        meter.error_policy(|_: Arc<Machine>, _: &String, _: Arc<()>| Action::requeue(Duration::ZERO));
    let _ = policy(Arc::new(gone.clone()), &"boom".to_owned(), Arc::new(()));
    let text = metrics.encode();
    for expected in [
        r#"mcm_controller_reconcile_total{controller="machine",result="success"} 1"#,
        r#"mcm_controller_reconcile_total{controller="machine",result="error"} 1"#,
        r#"mcm_controller_reconcile_errors_total{controller="machine"} 1"#,
        r#"mcm_controller_reconcile_duration_seconds_count{controller="machine"} 2"#,
        // m2 running, m1's requeue due.
        r#"mcm_workqueue_depth{name="machine"} 2"#,
    ] {
        assert!(text.contains(expected), "{expected}\n{text}");
    }
    assert!(
        lines(
            &text,
            r#"mcm_workqueue_longest_running_processor_seconds{name="machine"}"#
        )
        .len()
            == 1,
        "{text}"
    );

    // m2 finishes and waits for a change; m1's reconcile starts (its requeue is consumed) and finishes with a
    // requeue far away; a reconcile dropped unfinished counts nowhere.
    running.finish(Some(&Action::await_change()));
    meter
        .start(&m1)
        .finish(Some(&Action::requeue(Duration::from_mins(10))));
    drop(meter.start(&m2));
    let text = metrics.encode();
    for expected in [
        r#"mcm_controller_reconcile_total{controller="machine",result="success"} 3"#,
        r#"mcm_workqueue_depth{name="machine"} 0"#,
        r#"mcm_workqueue_unfinished_work_seconds{name="machine"} 0.0"#,
    ] {
        assert!(text.contains(expected), "{expected}\n{text}");
    }

    // Without metrics the meter does nothing.
    let idle = Metrics::reconcile_meter(None, "machine", &store);
    idle.start(&m1).finish(None);
}

#[tokio::test]
async fn the_wrapped_reconciler_is_metered() {
    let metrics = Arc::new(Metrics::new());
    let m1 = machine("m1").build();
    let store = store_of(vec![m1.clone()]);
    let meter = Metrics::reconcile_meter(Some(&metrics), "machineset", &store);
    let mut reconcile = meter.reconcile(|machine: Arc<Machine>, _: Arc<()>| async move {
        if machine.name_any() == "m1" {
            Ok(Action::await_change())
        } else {
            Err(crate::Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded))
        }
    });
    assert!(reconcile(Arc::new(m1), Arc::new(())).await.is_ok());
    let other = machine("m2").build();
    assert!(reconcile(Arc::new(other), Arc::new(())).await.is_err());
    let text = metrics.encode();
    assert!(
        text.contains(r#"mcm_controller_reconcile_total{controller="machineset",result="success"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"mcm_controller_reconcile_errors_total{controller="machineset"} 1"#),
        "{text}"
    );
}
