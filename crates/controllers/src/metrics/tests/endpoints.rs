//! What `/metrics` and `/readyz` answer: families added by others, and readiness while caches sync and checks fail.

use std::sync::Arc;

use mcm_api::Machine;
use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use crate::metrics::{Metrics, labels::FailedLabels};

#[test]
fn added_families_are_served_before_the_one_closing_eof() {
    let metrics = Metrics::new();
    let mut other = Registry::with_prefix("mcm");
    let requests = Family::<FailedLabels, Counter>::default();
    other.register("cloud_api_requests", "Requests to a cloud", requests.clone());
    requests
        .get_or_create(&FailedLabels {
            provider: "aws".into(),
            operation: "x".into(),
            error_code: "y".into(),
        })
        .inc();
    metrics.add_families(Box::new(move |out| {
        prometheus_client::encoding::text::encode_registry(out, &other)
    }));
    let text = metrics.encode();
    assert!(
        text.contains(r#"mcm_cloud_api_requests_total{provider="aws",operation="x",error_code="y"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("# TYPE mcm_machine_items_total"),
        "ours still there: {text}"
    );
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn readyz_fails_until_the_machine_cache_syncs_and_while_a_check_fails() {
    let metrics = Metrics::new();
    assert!(metrics.readiness().0, "nothing to wait for yet");
    let cache = crate::shared_cache::SharedCache::<Machine>::fixed(Vec::new(), false);
    metrics.attach_machines(&cache);
    let (ready, text) = metrics.readiness();
    assert!(!ready);
    assert!(text.contains("[-]machine-cache failed"), "{text}");
    cache.mark_synced();
    assert!(metrics.readiness().0, "synced");
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = healthy.clone();
    metrics.add_readiness_check("provider", move || {
        if seen.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err("unreachable".into())
        }
    });
    let (ready, text) = metrics.readiness();
    assert!(!ready);
    assert!(text.contains("[-]provider failed: unreachable"), "{text}");
    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ready, text) = metrics.readiness();
    assert!(ready, "{text}");
    assert!(text.contains("[+]provider ok"), "{text}");
}
