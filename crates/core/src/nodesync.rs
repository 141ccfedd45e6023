//! The node template on the node, with three-way semantics (reference §3.6 `syncNodeTemplates`).
//!
//! The machine's `spec.nodeTemplate` labels, annotations and taints are applied to its node; the set last applied is
//! kept as JSON in the node annotation `node.machine.sapcloud.io/last-applied-anno-labels-taints` (the reference's
//! format, `{"metadata":{"labels":…,"annotations":…},"spec":{"taints":[…]}}`, so that either implementation can take
//! over from the other). A key that was applied before and is gone from the template is removed from the node; keys
//! the template never had are left alone, whoever set them. Taints are keyed by (key, effect).
//!
//! The class's `nodeTemplate.virtualCapacity` goes into the node's `status.capacity` the same way, tracked in
//! `node.machine.sapcloud.io/last-applied-virtual-capacity`. The node also gets the label
//! `node.gardener.cloud/machine-name` with its machine's name.
//!
//! The result is the minimal set of JSON merge patches, or nothing when the node already matches, so that the
//! controller writes only on a change. Apply them in order: [`NodeSyncPlan::node_patch`] on the node,
//! [`NodeSyncPlan::status_patch`] on `nodes/<name>/status`, then [`NodeSyncPlan::capacity_annotation_patch`] on the
//! node: the capacity bookkeeping is written only after the capacity itself, so that a failure in between never
//! forgets a resource that is still to be removed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::core::v1::{Node, Taint},
    apimachinery::pkg::api::resource::Quantity,
};
use mcm_api::{
    Machine, MachineClass, NodeTemplateSpec,
    keys::{annotations, labels},
};
use serde_json::{Map, Value, json};

use crate::quantity;

/// What the node should carry from the template.
#[derive(Clone, Debug, Default, PartialEq)]
struct Applied {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    taints: Vec<Taint>,
}

impl Applied {
    fn from_template(template: Option<&NodeTemplateSpec>) -> Self {
        let Some(template) = template else {
            return Self::default();
        };
        let metadata = template.metadata.as_ref();
        Self {
            labels: metadata.and_then(|m| m.labels.clone()).unwrap_or_default(),
            annotations: metadata.and_then(|m| m.annotations.clone()).unwrap_or_default(),
            taints: dedup_taints(
                template
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default(),
            ),
        }
    }

    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty() && self.taints.is_empty()
    }

    /// Same template, taints compared as sets by (key, effect) and value.
    fn same_as(&self, other: &Self) -> bool {
        let taints = |a: &Self| {
            a.taints
                .iter()
                .map(|t| {
                    (
                        t.key.clone(),
                        t.effect.clone(),
                        t.value.clone().unwrap_or_default(),
                    )
                })
                .collect::<BTreeSet<_>>()
        };
        self.labels == other.labels && self.annotations == other.annotations && taints(self) == taints(other)
    }

    /// The reference's JSON form of the applied set.
    fn to_json(&self) -> String {
        let mut metadata = Map::new();
        if !self.labels.is_empty() {
            metadata.insert("labels".into(), json!(self.labels));
        }
        if !self.annotations.is_empty() {
            metadata.insert("annotations".into(), json!(self.annotations));
        }
        let mut spec = Map::new();
        if !self.taints.is_empty() {
            spec.insert(
                "taints".into(),
                serde_json::to_value(&self.taints).unwrap_or(Value::Null),
            );
        }
        json!({"metadata": metadata, "spec": spec}).to_string()
    }
}

fn same_key(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

/// Taints with one entry per (key, effect), the last one winning.
fn dedup_taints(taints: Vec<Taint>) -> Vec<Taint> {
    let mut out: Vec<Taint> = Vec::new();
    for taint in taints {
        if let Some(existing) = out.iter_mut().find(|t| same_key(t, &taint)) {
            *existing = taint;
        } else {
            out.push(taint);
        }
    }
    out
}

/// Something the sync could not read; it went on as if the bookkeeping were absent, and rewrites it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "node annotation {annotation} is not valid JSON ({reason}); keys applied before it cannot be removed"
)]
pub struct NodeSyncWarning {
    /// The annotation.
    pub annotation: &'static str,
    /// The parser's message.
    pub reason: String,
}

/// The node writes of a sync; all `None` when the node matches.
#[derive(Clone, Debug, Default, PartialEq)]
#[must_use]
pub struct NodeSyncPlan {
    /// Merge patch of the node: labels, annotations (the last-applied bookkeeping included) and, when they change,
    /// `spec.taints` whole (a list) with `metadata.resourceVersion` so that a concurrent taint change is not lost
    /// (a conflict means: observe again).
    pub node_patch: Option<Value>,
    /// Merge patch of `nodes/<name>/status`: `status.capacity` entries to set or remove.
    pub status_patch: Option<Value>,
    /// Merge patch of the node setting `node.machine.sapcloud.io/last-applied-virtual-capacity`; apply after
    /// `status_patch`.
    pub capacity_annotation_patch: Option<Value>,
    /// Bookkeeping that could not be read.
    pub warnings: Vec<NodeSyncWarning>,
}

impl NodeSyncPlan {
    /// Whether there is nothing to write.
    pub fn is_noop(&self) -> bool {
        self.node_patch.is_none() && self.status_patch.is_none() && self.capacity_annotation_patch.is_none()
    }
}

/// What the sync reads.
#[derive(Clone, Copy, Debug)]
pub struct NodeSyncInput<'a> {
    /// The machine's name (for the `node.gardener.cloud/machine-name` label).
    pub machine_name: &'a str,
    /// The machine's `spec.nodeTemplate`.
    pub node_template: Option<&'a NodeTemplateSpec>,
    /// The class's `nodeTemplate.virtualCapacity`.
    pub virtual_capacity: Option<&'a BTreeMap<String, Quantity>>,
    /// The node as the cache holds it.
    pub node: &'a Node,
}

impl<'a> NodeSyncInput<'a> {
    /// The input for a machine, its class (if known) and its node.
    pub fn new(machine: &'a Machine, class: Option<&'a MachineClass>, node: &'a Node) -> Self {
        Self {
            machine_name: machine.metadata.name.as_deref().unwrap_or_default(),
            node_template: machine.spec.node_template.as_ref(),
            virtual_capacity: class
                .and_then(|c| c.node_template.as_ref())
                .and_then(|t| t.virtual_capacity.as_ref()),
            node,
        }
    }
}

/// The changes of a string map from `current` to `desired`, as merge-patch entries (`null` removes).
fn map_diff(current: &BTreeMap<String, String>, desired: &BTreeMap<String, String>) -> Map<String, Value> {
    let mut diff = Map::new();
    for key in current.keys() {
        if !desired.contains_key(key) {
            diff.insert(key.clone(), Value::Null);
        }
    }
    for (key, value) in desired {
        if current.get(key) != Some(value) {
            diff.insert(key.clone(), json!(value));
        }
    }
    diff
}

/// The node's string map after removing keys applied before and no longer desired, and setting the desired ones.
fn three_way(
    current: &BTreeMap<String, String>,
    last: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = current.clone();
    for key in last.keys() {
        if !desired.contains_key(key) {
            out.remove(key);
        }
    }
    out.extend(desired.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

fn taint_matches(a: &Taint, b: &Taint) -> bool {
    same_key(a, b) && a.value.as_deref().unwrap_or("") == b.value.as_deref().unwrap_or("")
}

/// Plans the sync of a node with its machine's template and class.
pub fn plan(input: &NodeSyncInput<'_>) -> NodeSyncPlan {
    let node = input.node;
    let mut warnings = Vec::new();
    let node_labels = node.metadata.labels.clone().unwrap_or_default();
    let node_annotations = node.metadata.annotations.clone().unwrap_or_default();
    let node_taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();

    // The template and what was applied before.
    let desired = Applied::from_template(input.node_template);
    let stored = node_annotations.get(annotations::LAST_APPLIED_ANNO_LABELS_TAINTS);
    let last = match stored.map(|s| serde_json::from_str::<NodeTemplateSpec>(s)) {
        None => Applied::default(),
        Some(Ok(template)) => Applied::from_template(Some(&template)),
        Some(Err(err)) => {
            warnings.push(NodeSyncWarning {
                annotation: annotations::LAST_APPLIED_ANNO_LABELS_TAINTS,
                reason: err.to_string(),
            });
            Applied::default()
        }
    };

    // Labels: three-way, plus the machine-name label.
    let mut want_labels = three_way(&node_labels, &last.labels, &desired.labels);
    want_labels.insert(
        labels::NODE_MACHINE_NAME.to_owned(),
        input.machine_name.to_owned(),
    );

    // Annotations: three-way, plus the bookkeeping of what is applied now.
    let mut want_annotations = three_way(&node_annotations, &last.annotations, &desired.annotations);
    let bookkeeping_current = match stored {
        Some(_) => warnings.is_empty() && last.same_as(&desired),
        None => desired.is_empty(),
    };
    if !bookkeeping_current {
        if desired.is_empty() {
            want_annotations.remove(annotations::LAST_APPLIED_ANNO_LABELS_TAINTS);
        } else {
            want_annotations.insert(
                annotations::LAST_APPLIED_ANNO_LABELS_TAINTS.to_owned(),
                desired.to_json(),
            );
        }
    } else if let Some(stored) = stored {
        // Keep the stored text as it is, even if the template sets this key itself.
        want_annotations.insert(
            annotations::LAST_APPLIED_ANNO_LABELS_TAINTS.to_owned(),
            stored.clone(),
        );
    }

    // Taints by (key, effect): drop those applied before and gone, replace or add the template's.
    let mut want_taints: Vec<Taint> = node_taints
        .iter()
        .filter(|t| {
            let applied_before = last.taints.iter().any(|l| same_key(l, t));
            let wanted = desired.taints.iter().any(|d| same_key(d, t));
            wanted || !applied_before
        })
        .cloned()
        .collect();
    for taint in &desired.taints {
        match want_taints.iter_mut().find(|t| same_key(t, taint)) {
            Some(existing) if taint_matches(existing, taint) => {}
            Some(existing) => *existing = taint.clone(),
            None => want_taints.push(taint.clone()),
        }
    }

    let mut metadata = Map::new();
    let label_diff = map_diff(&node_labels, &want_labels);
    if !label_diff.is_empty() {
        metadata.insert("labels".into(), Value::Object(label_diff));
    }
    let annotation_diff = map_diff(&node_annotations, &want_annotations);
    if !annotation_diff.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotation_diff));
    }
    let mut node_patch = Map::new();
    if want_taints != node_taints {
        if let Some(rv) = &node.metadata.resource_version {
            metadata.insert("resourceVersion".into(), json!(rv));
        }
        node_patch.insert(
            "spec".into(),
            json!({"taints": serde_json::to_value(&want_taints).unwrap_or(Value::Null)}),
        );
    }
    if !metadata.is_empty() {
        node_patch.insert("metadata".into(), Value::Object(metadata));
    }

    let (status_patch, capacity_annotation_patch) = plan_capacity(input, &node_annotations, &mut warnings);

    NodeSyncPlan {
        node_patch: (!node_patch.is_empty()).then_some(Value::Object(node_patch)),
        status_patch,
        capacity_annotation_patch,
        warnings,
    }
}

fn plan_capacity(
    input: &NodeSyncInput<'_>,
    node_annotations: &BTreeMap<String, String>,
    warnings: &mut Vec<NodeSyncWarning>,
) -> (Option<Value>, Option<Value>) {
    let desired = input.virtual_capacity.cloned().unwrap_or_default();
    let stored = node_annotations.get(annotations::LAST_APPLIED_VIRTUAL_CAPACITY);
    let last: BTreeMap<String, Quantity> = match stored.map(|s| serde_json::from_str(s)) {
        None => BTreeMap::new(),
        Some(Ok(last)) => last,
        Some(Err(err)) => {
            warnings.push(NodeSyncWarning {
                annotation: annotations::LAST_APPLIED_VIRTUAL_CAPACITY,
                reason: err.to_string(),
            });
            BTreeMap::new()
        }
    };
    let capacity = input
        .node
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .unwrap_or_default();

    let mut diff = Map::new();
    for key in last.keys() {
        if !desired.contains_key(key) && capacity.contains_key(key) {
            diff.insert(key.clone(), Value::Null);
        }
    }
    for (key, value) in &desired {
        if !capacity.get(key).is_some_and(|c| quantity::equal(c, value)) {
            diff.insert(key.clone(), json!(value.0));
        }
    }
    let status_patch = (!diff.is_empty()).then(|| json!({"status": {"capacity": diff}}));

    let same = |a: &BTreeMap<String, Quantity>, b: &BTreeMap<String, Quantity>| {
        a.len() == b.len()
            && a.iter()
                .all(|(k, v)| b.get(k).is_some_and(|w| quantity::equal(v, w)))
    };
    let bookkeeping_current = match stored {
        Some(_) => {
            warnings
                .iter()
                .all(|w| w.annotation != annotations::LAST_APPLIED_VIRTUAL_CAPACITY)
                && same(&last, &desired)
        }
        None => desired.is_empty(),
    };
    let annotation_patch = (!bookkeeping_current).then(|| {
        let value = if desired.is_empty() {
            Value::Null
        } else {
            let text: BTreeMap<&str, &str> =
                desired.iter().map(|(k, v)| (k.as_str(), v.0.as_str())).collect();
            json!(json!(text).to_string())
        };
        json!({"metadata": {"annotations": {annotations::LAST_APPLIED_VIRTUAL_CAPACITY: value}}})
    });
    (status_patch, annotation_patch)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{NodeSpec, NodeStatus},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };
    use mcm_api::builders::NodeBuilder;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: (!value.is_empty()).then(|| value.to_owned()),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn template(
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        taints: Vec<Taint>,
    ) -> NodeTemplateSpec {
        NodeTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(map(labels)),
                annotations: Some(map(annotations)),
                ..ObjectMeta::default()
            }),
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..NodeSpec::default()
            }),
        }
    }

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)], taints: Vec<Taint>) -> Node {
        NodeBuilder::new("n")
            .resource_version("7")
            .labels(labels.iter().copied())
            .annotations(annotations.iter().copied())
            .spec(NodeSpec {
                taints: Some(taints),
                ..NodeSpec::default()
            })
            .status(NodeStatus::default())
            .build()
    }

    /// Applies a plan to a node as an API server would (merge patches), dropping the resourceVersion precondition.
    fn apply(node: &Node, plan: &NodeSyncPlan) -> Node {
        let mut value = serde_json::to_value(node).unwrap();
        for patch in [
            &plan.node_patch,
            &plan.status_patch,
            &plan.capacity_annotation_patch,
        ]
        .into_iter()
        .flatten()
        {
            let mut patch = patch.clone();
            if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("resourceVersion");
            }
            json_patch::merge(&mut value, &patch);
        }
        serde_json::from_value(value).unwrap()
    }

    fn input<'a>(
        template: Option<&'a NodeTemplateSpec>,
        capacity: Option<&'a BTreeMap<String, Quantity>>,
        node: &'a Node,
    ) -> NodeSyncInput<'a> {
        NodeSyncInput {
            machine_name: "m-1",
            node_template: template,
            virtual_capacity: capacity,
            node,
        }
    }

    #[test]
    fn a_fresh_node_gets_the_template_and_the_bookkeeping() {
        let t = template(
            &[("role", "worker")],
            &[("team", "a")],
            vec![taint("dedicated", "gpu", "NoSchedule")],
        );
        let n = node(&[("kubernetes.io/hostname", "n")], &[], vec![]);
        let p = plan(&input(Some(&t), None, &n));
        let patch = p.node_patch.clone().unwrap();
        assert_eq!(patch["metadata"]["labels"]["role"], "worker");
        assert_eq!(
            patch["metadata"]["labels"]["node.gardener.cloud/machine-name"],
            "m-1"
        );
        assert!(
            patch["metadata"]["labels"]
                .get("kubernetes.io/hostname")
                .is_none()
        );
        assert_eq!(patch["metadata"]["annotations"]["team"], "a");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(
            patch["spec"]["taints"],
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
        );
        let stored: Value = serde_json::from_str(
            patch["metadata"]["annotations"]["node.machine.sapcloud.io/last-applied-anno-labels-taints"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            stored,
            json!({
                "metadata": {"labels": {"role": "worker"}, "annotations": {"team": "a"}},
                "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}
            })
        );
        let synced = apply(&n, &p);
        assert!(plan(&input(Some(&t), None, &synced)).is_noop());
    }

    #[test]
    fn keys_dropped_from_the_template_are_removed_and_others_stay() {
        let before = template(
            &[("a", "1"), ("b", "2")],
            &[("x", "1")],
            vec![taint("t1", "", "NoSchedule"), taint("t2", "", "NoExecute")],
        );
        let n = node(
            &[("foreign", "yes")],
            &[("foreign", "yes")],
            vec![taint("foreign", "", "NoSchedule")],
        );
        let n = apply(&n, &plan(&input(Some(&before), None, &n)));
        let after = template(&[("a", "1")], &[], vec![taint("t2", "", "NoExecute")]);
        let p = plan(&input(Some(&after), None, &n));
        let synced = apply(&n, &p);
        let labels = synced.metadata.labels.clone().unwrap();
        assert_eq!(labels.get("b"), None);
        assert_eq!(labels.get("a").map(String::as_str), Some("1"));
        assert_eq!(labels.get("foreign").map(String::as_str), Some("yes"));
        let annotations = synced.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.get("x"), None);
        assert_eq!(annotations.get("foreign").map(String::as_str), Some("yes"));
        let taints: Vec<(String, String)> = synced
            .spec
            .clone()
            .unwrap()
            .taints
            .unwrap()
            .into_iter()
            .map(|t| (t.key, t.effect))
            .collect();
        assert_eq!(
            taints,
            [
                ("foreign".to_owned(), "NoSchedule".to_owned()),
                ("t2".to_owned(), "NoExecute".to_owned())
            ]
        );
        assert!(plan(&input(Some(&after), None, &synced)).is_noop());
    }

    #[test]
    fn taints_are_keyed_by_key_and_effect() {
        let t = template(&[], &[], vec![taint("k", "new", "NoSchedule")]);
        let n = node(
            &[("node.gardener.cloud/machine-name", "m-1")],
            &[],
            vec![taint("k", "old", "NoSchedule"), taint("k", "other", "NoExecute")],
        );
        let synced = apply(&n, &plan(&input(Some(&t), None, &n)));
        let taints = synced.spec.unwrap().taints.unwrap();
        assert_eq!(
            taints,
            vec![taint("k", "new", "NoSchedule"), taint("k", "other", "NoExecute")]
        );
    }

    #[test]
    fn a_matching_node_gets_no_patch() {
        let n = node(&[("node.gardener.cloud/machine-name", "m-1")], &[], vec![]);
        assert!(plan(&input(None, None, &n)).is_noop());
        assert!(plan(&input(Some(&NodeTemplateSpec::default()), None, &n)).is_noop());
    }

    #[test]
    fn the_references_bookkeeping_is_read() {
        // As the reference writes it (Go ObjectMeta with a null creationTimestamp).
        let stored = r#"{"metadata":{"creationTimestamp":null,"labels":{"a":"1"}},"spec":{}}"#;
        let n = node(
            &[("a", "1"), ("node.gardener.cloud/machine-name", "m-1")],
            &[(annotations::LAST_APPLIED_ANNO_LABELS_TAINTS, stored)],
            vec![],
        );
        let same = template(&[("a", "1")], &[], vec![]);
        assert!(plan(&input(Some(&same), None, &n)).is_noop());
        let p = plan(&input(None, None, &n));
        let synced = apply(&n, &p);
        assert_eq!(synced.metadata.labels.unwrap().get("a"), None);
        assert!(
            !synced
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(annotations::LAST_APPLIED_ANNO_LABELS_TAINTS)
        );
    }

    #[test]
    fn unreadable_bookkeeping_is_reported_and_rewritten() {
        let n = node(
            &[("node.gardener.cloud/machine-name", "m-1")],
            &[(annotations::LAST_APPLIED_ANNO_LABELS_TAINTS, "{not json")],
            vec![],
        );
        let t = template(&[("a", "1")], &[], vec![]);
        let p = plan(&input(Some(&t), None, &n));
        assert_eq!(p.warnings.len(), 1);
        assert!(
            p.warnings[0]
                .to_string()
                .contains("last-applied-anno-labels-taints")
        );
        let synced = apply(&n, &p);
        let again = plan(&input(Some(&t), None, &synced));
        assert!(again.is_noop() && again.warnings.is_empty());
    }

    #[test]
    fn virtual_capacity_is_merged_and_tracked() {
        let n = node(&[("node.gardener.cloud/machine-name", "m-1")], &[], vec![]);
        let mut n = n;
        n.status.as_mut().unwrap().capacity = Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity("4".into())),
            ("memory".to_owned(), Quantity("16Gi".into())),
        ]));
        let vc = BTreeMap::from([("example.com/dongle".to_owned(), Quantity("1000m".into()))]);
        let p = plan(&input(None, Some(&vc), &n));
        assert_eq!(p.node_patch, None);
        assert_eq!(
            p.status_patch,
            Some(json!({"status": {"capacity": {"example.com/dongle": "1000m"}}}))
        );
        assert_eq!(
            p.capacity_annotation_patch,
            Some(json!({"metadata": {"annotations": {
                "node.machine.sapcloud.io/last-applied-virtual-capacity": "{\"example.com/dongle\":\"1000m\"}"
            }}}))
        );
        let mut synced = apply(&n, &p);
        // The API server canonicalizes 1000m to 1: still the same amount, no rewrite.
        synced
            .status
            .as_mut()
            .unwrap()
            .capacity
            .as_mut()
            .unwrap()
            .insert("example.com/dongle".into(), Quantity("1".into()));
        assert!(plan(&input(None, Some(&vc), &synced)).is_noop());
        // Dropped from the class: removed from the capacity, other resources stay.
        let p = plan(&input(None, None, &synced));
        let removed = apply(&synced, &p);
        let capacity = removed.status.unwrap().capacity.unwrap();
        assert!(!capacity.contains_key("example.com/dongle"));
        assert!(capacity.contains_key("cpu"));
        assert!(
            !removed
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(annotations::LAST_APPLIED_VIRTUAL_CAPACITY)
        );
    }

    #[test]
    fn input_from_machine_and_class() {
        let mut machine = Machine::default();
        machine.metadata.name = Some("m-9".into());
        let n = node(&[], &[], vec![]);
        let i = NodeSyncInput::new(&machine, None, &n);
        assert_eq!(i.machine_name, "m-9");
        assert!(i.virtual_capacity.is_none());
    }

    fn key() -> impl Strategy<Value = String> {
        proptest::sample::select(vec!["a", "b", "c", "d", "e"]).prop_map(str::to_owned)
    }

    fn string_map() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(key(), "[xyz]{0,2}", 0..4)
    }

    fn taints() -> impl Strategy<Value = Vec<Taint>> {
        proptest::collection::vec(
            (
                key(),
                "[xy]{0,1}",
                proptest::sample::select(vec!["NoSchedule", "NoExecute", "PreferNoSchedule"]),
            )
                .prop_map(|(k, v, e)| taint(&k, &v, e)),
            0..4,
        )
        .prop_map(dedup_taints)
    }

    fn template_strategy() -> impl Strategy<Value = NodeTemplateSpec> {
        (string_map(), string_map(), taints()).prop_map(|(labels, annotations, taints)| NodeTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            }),
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..NodeSpec::default()
            }),
        })
    }

    fn foreign_node() -> impl Strategy<Value = Node> {
        (
            proptest::collection::btree_map("f[a-c]", "[xyz]{0,2}", 0..3),
            proptest::collection::btree_map("f[a-c]", "[xyz]{0,2}", 0..3),
            proptest::collection::vec(
                (
                    "f[a-c]",
                    proptest::sample::select(vec!["NoSchedule", "NoExecute"]),
                )
                    .prop_map(|(k, e)| taint(&k, "", e)),
                0..3,
            )
            .prop_map(dedup_taints),
        )
            .prop_map(|(labels, annotations, taints)| Node {
                metadata: ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(annotations),
                    resource_version: Some("1".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(NodeSpec {
                    taints: Some(taints),
                    ..NodeSpec::default()
                }),
                status: Some(NodeStatus::default()),
            })
    }

    proptest! {
        #[test]
        fn applying_twice_is_a_no_op_and_foreign_keys_survive(
            first in template_strategy(),
            second in template_strategy(),
            start in foreign_node(),
        ) {
            // Apply one template, then another: the result holds the second template exactly, nothing of the
            // first that the second dropped, and every key the templates never had.
            let once = apply(&start, &plan(&input(Some(&first), None, &start)));
            prop_assert!(plan(&input(Some(&first), None, &once)).is_noop());
            let twice = apply(&once, &plan(&input(Some(&second), None, &once)));
            prop_assert!(plan(&input(Some(&second), None, &twice)).is_noop());

            let node_labels = twice.metadata.labels.clone().unwrap_or_default();
            let annotations = twice.metadata.annotations.clone().unwrap_or_default();
            let node_taints = twice.spec.clone().unwrap().taints.unwrap_or_default();
            let desired = Applied::from_template(Some(&second));
            for (k, v) in &desired.labels {
                prop_assert_eq!(node_labels.get(k), Some(v));
            }
            for (k, v) in &desired.annotations {
                prop_assert_eq!(annotations.get(k), Some(v));
            }
            for t in &desired.taints {
                prop_assert!(node_taints.iter().any(|n| taint_matches(n, t)));
            }
            let first = Applied::from_template(Some(&first));
            for k in first.labels.keys() {
                if !desired.labels.contains_key(k) {
                    prop_assert!(!node_labels.contains_key(k));
                }
            }
            for t in &first.taints {
                if !desired.taints.iter().any(|d| same_key(d, t)) {
                    prop_assert!(!node_taints.iter().any(|n| same_key(n, t)));
                }
            }
            // Foreign keys (prefix f, never in a template) survive both syncs.
            for (k, v) in start.metadata.labels.as_ref().unwrap() {
                prop_assert_eq!(node_labels.get(k), Some(v));
            }
            for (k, v) in start.metadata.annotations.as_ref().unwrap() {
                prop_assert_eq!(annotations.get(k), Some(v));
            }
            for t in start.spec.as_ref().unwrap().taints.as_ref().unwrap() {
                prop_assert!(node_taints.contains(t));
            }
            prop_assert_eq!(node_labels.get(labels::NODE_MACHINE_NAME).map(String::as_str), Some("m-1"));
        }
    }
}
