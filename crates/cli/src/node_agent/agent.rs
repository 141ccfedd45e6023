//! The running agent after the join: registers the Node (or adopts it after a restart), then heartbeats: the Lease
//! renewed every interval, the status written when it changed and at least every few intervals.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo},
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use mcm_api::keys::kubernetes::{ARCH_LABEL, HOSTNAME_LABEL, NODE_LEASE_NAMESPACE, OS_LABEL};
use mcm_core::{
    in_place_update,
    node_report::{self, DEFAULT_LEASE_DURATION, MAX_PODS, NodeLease, StatusReport},
};
use serde_json::{Value, json};

use super::{
    Backoff,
    conditions::{
        CONDITIONS_DIR, FileCondition, merged_conditions, read_condition_files, reported_conditions,
    },
    host::{go_arch, go_os, os_image, read_trimmed},
    in_place::Applied,
    settings::Settings,
};

/// The node status is written when it changed and at least every 4 heartbeats, as kubelet does.
const STATUS_REPORT: StatusReport = StatusReport::AtLeastEvery(4);

/// What happened in one heartbeat.
enum Beat {
    /// The Node is alive.
    Alive,
    /// The Node is gone: heartbeats stop.
    NodeGone,
}

/// The running agent, after the join.
pub(super) struct Agent {
    name: String,
    nodes: Api<Node>,
    leases: Api<Lease>,
    interval: Duration,
    conditions_dir: PathBuf,
    machine_dir: PathBuf,
    provider_id: Option<String>,
    labels: BTreeMap<String, String>,
    resources: BTreeMap<String, Quantity>,
    addresses: Vec<NodeAddress>,
    node_info: NodeSystemInfo,
    /// Heartbeats since the last status write.
    beats_since_status: u32,
    /// The status needs writing at the next heartbeat (after a conflict, or an adopted Node).
    force_status: bool,
    /// The reported fields as the server returned them after the last status write (the server may normalize
    /// quantities): a Node whose fields differ gets them again.
    written: Option<Value>,
    /// The condition files of the last heartbeat, to log changes.
    files: BTreeMap<String, FileCondition>,
    /// Ignored files already warned about, with why.
    warned: BTreeMap<PathBuf, String>,
    /// The answer to an in-place update, sent once the status shows what the update changed.
    pending_result: Option<Value>,
}

impl Agent {
    pub(super) fn new(settings: &Settings, client: Client) -> Self {
        let name = settings.node_name.clone();
        let mut resources = BTreeMap::from([
            ("cpu".to_owned(), Quantity(settings.cpu.clone())),
            ("memory".to_owned(), Quantity(settings.memory.clone())),
            ("pods".to_owned(), Quantity(MAX_PODS.to_string())),
        ]);
        let mut labels = BTreeMap::from([
            (HOSTNAME_LABEL.to_owned(), name.clone()),
            (OS_LABEL.to_owned(), go_os().to_owned()),
            (ARCH_LABEL.to_owned(), go_arch().to_owned()),
        ]);
        // An in-place update applied before a restart outlives the flags, which say what the machine booted as.
        match Applied::load(&settings.machine_dir) {
            Ok(Some(applied)) => {
                tracing::info!(class = %applied.class, "reporting the in-place update applied earlier");
                resources.extend(applied.resources);
                labels.extend(applied.labels);
            }
            Ok(None) => {}
            Err(err) => tracing::warn!(error = %err, "the in-place update record is ignored"),
        }
        let addresses = vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.clone(),
            },
        ];
        let node_info = NodeSystemInfo {
            architecture: go_arch().into(),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            container_runtime_version: String::new(),
            kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
            kube_proxy_version: String::new(),
            kubelet_version: format!("mcm-node-agent/{}", env!("CARGO_PKG_VERSION")),
            machine_id: String::new(),
            operating_system: go_os().into(),
            os_image: os_image(),
            swap: None,
            system_uuid: String::new(),
        };
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            name,
            interval: settings.heartbeat_interval,
            conditions_dir: settings.machine_dir.join(CONDITIONS_DIR),
            machine_dir: settings.machine_dir.clone(),
            provider_id: settings.provider_id.clone(),
            labels,
            resources,
            addresses,
            node_info,
            beats_since_status: 0,
            force_status: false,
            written: None,
            files: BTreeMap::new(),
            warned: BTreeMap::new(),
            pending_result: None,
        }
    }

    /// Registers the Node (retrying until it works), then heartbeats until the Node is gone; never returns
    /// otherwise (the caller stops it on a signal).
    pub(super) async fn run(&mut self) {
        let mut backoff = Backoff::new();
        loop {
            let files = self.condition_files();
            match tokio::time::timeout(self.request_timeout(), self.register(&files)).await {
                Ok(Ok(())) => break,
                Ok(Err(err)) => {
                    let delay = backoff.next();
                    tracing::warn!(error = %err, retry_in = ?delay, "registering the node failed");
                    tokio::time::sleep(delay).await;
                }
                Err(_) => tracing::warn!("registering the node timed out; retrying"),
            }
        }
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match tokio::time::timeout(self.request_timeout(), self.beat()).await {
                Ok(Ok(Beat::Alive)) => {}
                Ok(Ok(Beat::NodeGone)) => {
                    tracing::warn!(
                        "the node was deleted: heartbeats stop (it is not registered again); waiting for SIGTERM"
                    );
                    std::future::pending::<()>().await;
                }
                Ok(Err(err)) => tracing::warn!(error = %err, "heartbeat failed"),
                Err(_) => tracing::warn!(timeout = ?self.request_timeout(), "heartbeat timed out"),
            }
        }
    }

    /// How long the requests of one heartbeat may take.
    fn request_timeout(&self) -> Duration {
        self.interval.max(Duration::from_secs(10))
    }

    /// The condition files now; logs what changed since the last look and newly ignored files.
    fn condition_files(&mut self) -> BTreeMap<String, FileCondition> {
        let mut problems = BTreeMap::new();
        let files = read_condition_files(&self.conditions_dir, &mut problems);
        for (path, why) in &problems {
            if self.warned.get(path) != Some(why) {
                tracing::warn!(file = %path.display(), reason = %why, "condition file ignored");
            }
        }
        self.warned = problems;
        for (type_, file) in &files {
            if self.files.get(type_) != Some(file) {
                tracing::info!(condition = %type_, status = %file.status, file = %file.path.display(), "condition set by file");
            }
        }
        for (type_, file) in &self.files {
            if !files.contains_key(type_) {
                tracing::info!(condition = %type_, file = %file.path.display(), "condition file removed");
            }
        }
        self.files.clone_from(&files);
        files
    }

    /// The reported fields besides the conditions, as JSON (to compare with what the server has).
    fn reported_fields(status: &NodeStatus) -> Value {
        json!({
            "capacity": status.capacity,
            "allocatable": status.allocatable,
            "addresses": status.addresses,
            "nodeInfo": status.node_info,
        })
    }

    fn status(&self, conditions: Vec<NodeCondition>) -> NodeStatus {
        NodeStatus {
            capacity: Some(self.resources.clone()),
            allocatable: Some(self.resources.clone()),
            addresses: Some(self.addresses.clone()),
            node_info: Some(self.node_info.clone()),
            conditions: Some(conditions),
            ..NodeStatus::default()
        }
    }

    /// Creates the Node with its full status, or brings an existing one's labels and providerID up to date (its
    /// status follows at the first heartbeat).
    async fn register(&mut self, files: &BTreeMap<String, FileCondition>) -> anyhow::Result<()> {
        let now = Timestamp::now();
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(self.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: self.provider_id.clone(),
                ..NodeSpec::default()
            }),
            status: Some(self.status(merged_conditions(&[], &reported_conditions(files), now))),
        };
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(created) => {
                tracing::info!(
                    provider_id = self.provider_id.as_deref().unwrap_or_default(),
                    "node registered"
                );
                self.written = created.status.as_ref().map(Self::reported_fields);
                self.beats_since_status = 0;
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => return Err(err.into()),
        }
        let existing = self.nodes.get(&self.name).await?;
        if existing.metadata.deletion_timestamp.is_some() {
            anyhow::bail!("a Node of this name exists and is being deleted");
        }
        let mut patch = serde_json::Map::new();
        let labels = existing.metadata.labels.clone().unwrap_or_default();
        let missing: BTreeMap<&String, &String> = self
            .labels
            .iter()
            .filter(|(k, v)| labels.get(*k) != Some(*v))
            .collect();
        if !missing.is_empty() {
            patch.insert("metadata".into(), json!({ "labels": missing }));
        }
        let current_id = existing.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        match (current_id.filter(|id| !id.is_empty()), &self.provider_id) {
            (None, Some(wanted)) => {
                patch.insert("spec".into(), json!({ "providerID": wanted }));
            }
            (Some(current), Some(wanted)) if current != wanted => tracing::warn!(
                current,
                wanted = %wanted,
                "the existing node has another providerID, which cannot change; it is kept"
            ),
            _ => {}
        }
        if !patch.is_empty() {
            self.nodes
                .patch(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Merge(Value::Object(patch)),
                )
                .await?;
        }
        tracing::info!("node exists already (agent restart): updated, status follows");
        self.force_status = true;
        Ok(())
    }

    /// One heartbeat: the Lease, then the status when it changed or is due.
    async fn beat(&mut self) -> anyhow::Result<Beat> {
        let files = self.condition_files();
        let Some(node) = self.nodes.get_opt(&self.name).await? else {
            return Ok(Beat::NodeGone);
        };
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let lease = self.renew_lease(&uid).await;
        self.beats_since_status = self.beats_since_status.saturating_add(1);
        self.apply_in_place_update(&node);
        let status = self.write_status_if_needed(&node, &files).await;
        let update = self.report_in_place_update().await;
        lease?;
        status?;
        update?;
        Ok(Beat::Alive)
    }

    /// Applies the in-place update the node asks for (`InPlaceUpdate` condition `ReadyForUpdate`, no `update-result`
    /// yet): the target's resources and labels become the agent's, saved for restarts, and the status is to be
    /// written; the answer (`update-result`) waits until it is. A target that cannot be applied is answered
    /// `failed` with why, at once rather than at the machine's in-place update timeout.
    fn apply_in_place_update(&mut self, node: &Node) {
        if self.pending_result.is_some() || !in_place_update::agent_should_update(node) {
            return;
        }
        let applied = Applied::of(node)
            .map_err(|err| err.to_string())
            .and_then(|applied| {
                applied
                    .save(&self.machine_dir)
                    .map(|()| applied)
                    .map_err(|err| format!("cannot save the update record in the machine directory: {err}"))
            });
        let patch = match applied {
            Ok(applied) => {
                tracing::info!(class = %applied.class, resources = ?applied.resources, "in-place update applied");
                self.resources.extend(applied.resources);
                self.labels.extend(applied.labels.clone());
                self.force_status = true;
                in_place_update::result_patch(Ok(()), &applied.labels)
            }
            Err(reason) => {
                tracing::warn!(reason = %reason, "in-place update refused");
                in_place_update::result_patch(Err(&reason), &BTreeMap::new())
            }
        };
        self.pending_result = Some(patch);
    }

    /// Sends the answer of an in-place update once the status written shows the update (`force_status` is cleared
    /// by a successful status write).
    async fn report_in_place_update(&mut self) -> anyhow::Result<()> {
        let Some(patch) = self.pending_result.as_ref().filter(|_| !self.force_status) else {
            return Ok(());
        };
        self.nodes
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|err| anyhow::Error::new(err).context("reporting the in-place update result"))?;
        tracing::info!("in-place update result reported");
        self.pending_result = None;
        Ok(())
    }

    async fn renew_lease(&self, uid: &str) -> anyhow::Result<()> {
        let lease = NodeLease::new(&self.name, uid, DEFAULT_LEASE_DURATION, Timestamp::now());
        match self
            .leases
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(&lease.renewal_patch()),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                match self.leases.create(&PostParams::default(), &lease.lease()).await {
                    Ok(_) => {
                        tracing::info!("lease created");
                        Ok(())
                    }
                    // Created meanwhile (another agent of this name would be a misconfiguration).
                    Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
                    Err(err) => Err(anyhow::Error::new(err).context("creating the lease")),
                }
            }
            Err(err) => Err(anyhow::Error::new(err).context("renewing the lease")),
        }
    }

    async fn write_status_if_needed(
        &mut self,
        node: &Node,
        files: &BTreeMap<String, FileCondition>,
    ) -> anyhow::Result<()> {
        let current = node.status.clone().unwrap_or_default();
        let current_conditions = current.conditions.clone().unwrap_or_default();
        let now = Timestamp::now();
        let conditions = merged_conditions(&current_conditions, &reported_conditions(files), now);
        let changed = node_report::fingerprint(&conditions) != node_report::fingerprint(&current_conditions)
            || self.written.as_ref() != Some(&Self::reported_fields(&current));
        if !self.force_status && !STATUS_REPORT.is_due(changed, self.beats_since_status) {
            return Ok(());
        }
        let patch = json!({
            "metadata": { "resourceVersion": node.metadata.resource_version },
            "status": self.status(conditions),
        });
        match self
            .nodes
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                if changed {
                    tracing::debug!("node status updated");
                }
                self.written = written.status.as_ref().map(Self::reported_fields);
                self.beats_since_status = 0;
                self.force_status = false;
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Changed meanwhile: the next heartbeat reads it again.
                self.force_status = true;
                Ok(())
            }
            Err(err) => {
                self.force_status = true;
                Err(anyhow::Error::new(err).context("writing the node status"))
            }
        }
    }
}
