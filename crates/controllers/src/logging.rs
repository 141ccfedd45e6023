//! Every reconcile runs in a span naming its object, so that each line it logs, down to the provider calls and the
//! drain, carries the object as a structured field (`machine`, `set`, `deployment`, `class` or `secret`, and
//! `namespace`), in text and in JSON logs alike. `crates/cli/tests/secret_leak.rs` checks the fields in JSON logs.

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
