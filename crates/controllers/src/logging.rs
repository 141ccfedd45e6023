//! Every reconcile runs in a span naming its object, so that each line it logs, down to the provider calls and the
//! drain, carries the object as a structured field (`machine`, `set`, `deployment`, `class` or `secret`, and
//! `namespace`), in text and in JSON logs alike. `crates/cli/tests/e2e/secret_leak.rs` checks the fields in JSON logs.
//!
//! [`NoResponseBodies`] keeps response bodies out of the logs: kube's client logs the whole body of a response it
//! cannot decode (`{body}, {error:?}` at WARN), and a Secret that does not decode is logged with its values.

use std::{future::Future, sync::Arc};

use kube::Resource;
use tracing::Instrument as _;

/// What a controller reconciles: names the span's field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `machine = <name>`.
    Machine,
    /// `set = <name>`.
    MachineSet,
    /// `deployment = <name>`.
    MachineDeployment,
    /// `class = <name>`.
    MachineClass,
    /// `secret = <name>`.
    Secret,
}

/// The span of one reconcile of `object`.
pub fn span(kind: Kind, object: &impl Resource) -> tracing::Span {
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    match kind {
        Kind::Machine => tracing::info_span!("reconcile", machine = name, namespace),
        Kind::MachineSet => tracing::info_span!("reconcile", set = name, namespace),
        Kind::MachineDeployment => tracing::info_span!("reconcile", deployment = name, namespace),
        Kind::MachineClass => tracing::info_span!("reconcile", class = name, namespace),
        Kind::Secret => tracing::info_span!("reconcile", secret = name, namespace),
    }
}

/// `reconcile` with each call in its object's span: pass the result to `Controller::run` (or to a meter).
pub fn traced<K, C, Fut>(
    kind: Kind,
    mut reconcile: impl FnMut(Arc<K>, Arc<C>) -> Fut,
) -> impl FnMut(Arc<K>, Arc<C>) -> tracing::instrument::Instrumented<Fut>
where
    K: Resource,
    Fut: Future,
{
    move |object: Arc<K>, context: Arc<C>| {
        let span = span(kind, &*object);
        reconcile(object, context).instrument(span)
    }
}

/// A tracing layer that drops the log lines of kube's client and runtime that can carry a response body or serde's
/// text about it (which can quote a value): kube's client logs the whole body of a response it cannot decode at
/// WARN, so a Secret with non-base64 data was logged with its credentials. The failures themselves are still
/// logged, by the watches (`crate::watch_health`) and the controllers, naming the kind and the object, never the
/// body. Every process's subscriber has it (`mcm run`, `mcm up`, the providers, `mcm capi run`).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoResponseBodies;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for NoResponseBodies {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let target = event.metadata().target();
        if !(target.starts_with("kube_client") || target.starts_with("kube_runtime")) {
            return true;
        }
        let mut text = FieldText::default();
        event.record(&mut text);
        !may_carry_body(&text.0)
    }
}

/// The fields of an event as text.
#[derive(Default)]
struct FieldText(String);

impl tracing::field::Visit for FieldText {
    fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = write!(self.0, "{value:?} ");
    }
}

/// Whether a kube log line can hold a body: JSON text, or serde's error (whose text can quote a value).
fn may_carry_body(text: &str) -> bool {
    text.contains('{') || text.contains("SerdeError") || text.contains("Error(\"")
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn kube_lines_with_a_body_are_dropped_and_the_others_kept() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish()
            .with(NoResponseBodies);
        tracing::subscriber::with_default(subscriber, || {
            let body = r#"{"kind":"SecretList","items":[{"data":{"userData":"AKIA-plain-text"}}]}"#;
            tracing::warn!(target: "kube_client::client", "{}, {:?}", body, "Error(\"Invalid symbol 35\")");
            tracing::debug!(target: "kube_runtime::watcher", "watch list error: SerdeError(Error(\"AKIA-x\"))");
            tracing::warn!(target: "kube_client::client", "timeout in poll: deadline has elapsed");
            tracing::warn!(target: "mcm_controllers::secrets", secret = "aws", "Secret cannot be decoded");
        });
        let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert!(!logs.contains("AKIA"), "{logs}");
        assert!(logs.contains("timeout in poll"), "{logs}");
        assert!(logs.contains("Secret cannot be decoded"), "{logs}");
    }
}
