//! The reconcile meters: requeues read from actions, reconciles counted and the work queue followed as client-go
//! counts it.

use std::{sync::Arc, time::Duration};

use futures::StreamExt as _;
use kube::{
    ResourceExt as _,
    runtime::{
        controller::{self, Action},
        reflector::ObjectRef,
    },
};
use mcm_api::Machine;

use super::{lines, machine};
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

/// The one sample of `name{name="machine"}` in `text`.
fn queue_value(text: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{name=\"machine\"}} ");
    let found = lines(text, &prefix);
    assert_eq!(found.len(), 1, "{prefix}\n{text}");
    found[0][prefix.len()..].parse().unwrap()
}

fn queue(metrics: &Metrics) -> [f64; 5] {
    let text = metrics.encode();
    [
        "mcm_workqueue_depth",
        "mcm_workqueue_adds_total",
        "mcm_workqueue_retries_total",
        "mcm_workqueue_queue_duration_seconds_count",
        "mcm_workqueue_work_duration_seconds_count",
    ]
    .map(|name| queue_value(&text, name))
}

fn not_found() -> Result<(ObjectRef<Machine>, Action), controller::Error<std::io::Error, std::io::Error>> {
    let gone = ObjectRef::<Machine>::new("gone").within("ns").erase();
    Err(controller::Error::ObjectNotFound(Box::new(gone)))
}

#[test]
#[allow(clippy::float_cmp)] // counts
fn the_meter_follows_the_queue_as_client_go_counts_it() {
    let metrics = Arc::new(Metrics::new());
    let m1 = machine("m1").build();
    let m2 = machine("m2").build();
    let gone = machine("gone").build();
    let meter = Metrics::reconcile_meter(Some(&metrics), "machine");
    // Every family of the queue is there from the start, at 0: [depth, adds, retries, waited, worked].
    assert_eq!(queue(&metrics), [0.0; 5]);
    let text = metrics.encode();
    assert_eq!(queue_value(&text, "mcm_workqueue_unfinished_work_seconds"), 0.0);
    assert_eq!(
        queue_value(&text, "mcm_workqueue_longest_running_processor_seconds"),
        0.0
    );

    // Two objects come from the watch, one of them twice before its reconcile: added once (it is dirty).
    let triggers = futures::executor::block_on(
        meter
            .triggers(futures::stream::iter([
                Ok::<_, std::io::Error>(m1.clone()),
                Ok(m2.clone()),
                Ok(m1.clone()),
            ]))
            .collect::<Vec<_>>(),
    );
    assert_eq!(triggers.len(), 3, "the stream passes through");
    assert_eq!(queue(&metrics), [2.0, 2.0, 0.0, 0.0, 0.0]);

    // m1 is picked up; a mapped trigger for it while it runs makes it dirty again (held, counted in the depth).
    let running = meter.start(&m1);
    assert_eq!(queue(&metrics), [1.0, 2.0, 0.0, 1.0, 0.0]);
    let mapper = meter.mapper(|(): ()| Some(ObjectRef::<Machine>::new("m1").within("ns")));
    assert_eq!(mapper(()).len(), 1);
    assert_eq!(queue(&metrics), [2.0, 3.0, 0.0, 1.0, 0.0]);
    let text = metrics.encode();
    assert_eq!(
        lines(
            &text,
            r#"mcm_workqueue_longest_running_processor_seconds{name="machine"}"#
        )
        .len(),
        1
    );
    // It ends asking for a requeue in 10 minutes: the earlier trigger wins, it stays due.
    running.finish(Some(&Action::requeue(Duration::from_mins(10))));
    assert_eq!(queue(&metrics), [2.0, 3.0, 0.0, 1.0, 1.0]);

    // m2 fails; the error policy's requeue is a retry, added when it comes due (at once here).
    meter.start(&m2).finish(None);
    let policy =
        meter.error_policy(|_: Arc<Machine>, _: &String, _: Arc<()>| Action::requeue(Duration::ZERO));
    let _ = policy(Arc::new(m2.clone()), &"boom".to_owned(), Arc::new(()));
    assert_eq!(queue(&metrics), [2.0, 4.0, 1.0, 2.0, 2.0]);

    // m1 and m2 run again; m1 then waits for a change, m2 asks for a requeue far away: not due, not added.
    meter.start(&m1).finish(Some(&Action::await_change()));
    meter
        .start(&m2)
        .finish(Some(&Action::requeue(Duration::from_mins(10))));
    assert_eq!(queue(&metrics), [0.0, 4.0, 1.0, 4.0, 4.0]);

    // A requeue of an object that has left the cache is due until the scheduler drops it.
    let _ = policy(Arc::new(gone), &"boom".to_owned(), Arc::new(()));
    assert_eq!(queue(&metrics), [1.0, 5.0, 2.0, 4.0, 4.0]);
    meter.outcome(&not_found());
    assert_eq!(queue(&metrics), [0.0, 5.0, 2.0, 4.0, 4.0]);

    // A reconcile dropped unfinished (shutdown) is no work done; the reconcile counters are per result.
    drop(meter.start(&m1));
    let text = metrics.encode();
    for expected in [
        r#"mcm_controller_reconcile_total{controller="machine",result="success"} 3"#,
        r#"mcm_controller_reconcile_total{controller="machine",result="error"} 1"#,
        r#"mcm_controller_reconcile_errors_total{controller="machine"} 1"#,
        r#"mcm_controller_reconcile_duration_seconds_count{controller="machine"} 4"#,
        r#"mcm_workqueue_work_duration_seconds_count{name="machine"} 4"#,
        r#"mcm_workqueue_unfinished_work_seconds{name="machine"} 0.0"#,
    ] {
        assert!(text.contains(expected), "{expected}\n{text}");
    }

    // Without metrics the meter does nothing.
    let idle = Metrics::reconcile_meter(None, "machine");
    idle.start(&m1).finish(None);
}

#[tokio::test]
async fn the_wrapped_reconciler_is_metered() {
    let metrics = Arc::new(Metrics::new());
    let m1 = machine("m1").build();
    let meter = Metrics::reconcile_meter(Some(&metrics), "machineset");
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

#[test]
fn a_pass_of_a_periodic_loop_is_one_add_one_get_one_done() {
    let metrics = Arc::new(Metrics::new());
    let meter = Metrics::reconcile_meter(Some(&metrics), "machinesafetyorphanvms");
    let pass = meter.pass();
    let text = metrics.encode();
    assert!(
        text.contains(r#"mcm_workqueue_adds_total{name="machinesafetyorphanvms"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"mcm_workqueue_depth{name="machinesafetyorphanvms"} 0"#),
        "{text}"
    );
    pass.finish(Some(&Action::await_change()));
    meter.pass().finish(Some(&Action::await_change()));
    let text = metrics.encode();
    for expected in [
        r#"mcm_workqueue_adds_total{name="machinesafetyorphanvms"} 2"#,
        r#"mcm_workqueue_work_duration_seconds_count{name="machinesafetyorphanvms"} 2"#,
        r#"mcm_workqueue_queue_duration_seconds_count{name="machinesafetyorphanvms"} 2"#,
    ] {
        assert!(text.contains(expected), "{expected}\n{text}");
    }
}
