//! One pass of a node drain, the acting half of `mcm_core::drain`: cordon, evict what may go now, wait for what is
//! going, and say how far it got. A pass never blocks a worker for longer than its API calls: the deletion flow
//! calls it again after `evict_retry_interval` until the node is drained (or the drain turns into a force drain at
//! its deadline). What a pass must remember between calls (eviction attempts per pod, the volume pod being moved)
//! is kept in a [`DrainTracker`] per machine; losing it on a restart costs at most a repeated wait, never a repeated
//! harmful action, because every eviction and deletion is idempotent and the pods' own state says what is left (a
//! volume pod found terminating is followed again until its volumes have moved).

use std::collections::BTreeMap;

use futures::future::join_all;
use jiff::Timestamp;
use k8s_openapi::api::{
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    policy::v1::PodDisruptionBudget,
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams},
};
use mcm_core::{
    EffectiveSettings,
    drain::{self, Blocker, DrainMode, DrainOutcome, PodRef},
    timeouts,
};
use mcm_driver::{Driver, GetVolumeIdsRequest};
use serde_json::json;

/// The volume pod being moved: evicted, then waited for until it is gone, its volumes detached from the node and
/// attached elsewhere (or the timeouts passed).
#[derive(Clone, Debug)]
struct Moving {
    pod: PodRef,
    pvs: Vec<String>,
    volume_ids: Vec<String>,
    evicted_at: Timestamp,
    gone_timeout: std::time::Duration,
    detach_timeout: std::time::Duration,
    detached_at: Option<Timestamp>,
}

/// What a drain remembers between passes, per machine.
#[derive(Clone, Debug, Default)]
pub struct DrainTracker {
    /// When the first pass of this drain ran (for `mcm_machine_drain_duration_seconds`).
    pub(crate) started: Option<Timestamp>,
    attempts: BTreeMap<String, u32>,
    moving: Option<Moving>,
    evicted: usize,
    deleted: usize,
}

/// The trackers of the drains under way, by machine name, between passes (the deletion flow's, a preserved node's,
/// an in-place update's). Lost on restart without harm: a drain then starts over.
#[derive(Debug, Default)]
pub struct DrainTrackers(std::sync::Mutex<BTreeMap<String, DrainTracker>>);

impl DrainTrackers {
    /// A copy of the machine's tracker, which stays (a new one when there is none).
    pub(crate) fn get(&self, machine: &str) -> DrainTracker {
        self.0
            .lock()
            .ok()
            .and_then(|m| m.get(machine).cloned())
            .unwrap_or_default()
    }

    /// The machine's tracker, taken out (a new one when there is none).
    pub(crate) fn take(&self, machine: &str) -> DrainTracker {
        self.0
            .lock()
            .ok()
            .and_then(|mut m| m.remove(machine))
            .unwrap_or_default()
    }

    /// Keeps `tracker` for the machine's next pass.
    pub(crate) fn keep(&self, machine: String, tracker: DrainTracker) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(machine, tracker);
        }
    }

    /// Forgets the machine's drain.
    pub(crate) fn forget(&self, machine: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(machine);
        }
    }
}

/// What a pass needs.
pub struct DrainPass<'a> {
    /// The target cluster.
    pub target: &'a Client,
    /// The provider (GetVolumeIDs).
    pub driver: &'a dyn Driver,
    /// The node to drain.
    pub node: &'a str,
    /// The node as the caller's cache holds it: read from the server only when there is none (issue 26: no GET of
    /// what a cache holds). A stale copy costs at most a repeated cordon.
    pub cached: Option<&'a Node>,
    /// Normal or force, with its timeout and evict retries.
    pub mode: &'a DrainMode,
    /// The machine's effective settings (volume timeouts).
    pub settings: &'a EffectiveSettings,
    /// Now.
    pub now: Timestamp,
    /// Whether the pass cordons the node first (the deletion flow); the drain of a preserved node does not: it is
    /// tainted `node.machine.sapcloud.io/preserved` instead, so that a user's own cordon is left alone.
    pub cordon: bool,
}

fn api_error(what: &str, err: &kube::Error) -> DrainOutcome {
    DrainOutcome::Failed {
        message: format!("{what}: {err}"),
    }
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

impl DrainPass<'_> {
    /// Runs one pass; `tracker` carries what earlier passes did.
    pub async fn run(&self, tracker: &mut DrainTracker) -> DrainOutcome {
        let nodes: Api<Node> = Api::all(self.target.clone());
        let fetched;
        let node = match self
            .cached
            .filter(|n| n.metadata.name.as_deref() == Some(self.node))
        {
            Some(node) => node,
            None => match nodes.get_opt(self.node).await {
                Ok(Some(node)) => {
                    fetched = node;
                    &fetched
                }
                Ok(None) => return Self::drained(tracker),
                Err(err) => return api_error("reading the node", &err),
            },
        };
        if self.cordon
            && let Err(err) = self.cordon(&nodes, node).await
            && self.mode.force.is_none()
        {
            return api_error("cordoning the node", &err);
        }
        crash_point!(DrainCordon, self.node);
        let pods: Api<Pod> = Api::all(self.target.clone());
        let listed = match pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node)))
            .await
        {
            Ok(list) => list.items,
            Err(err) => return api_error("listing the node's pods", &err),
        };
        let plan = drain::plan(self.node, &listed);
        if self.mode.force.is_some() {
            return self.force(&listed, &plan, tracker).await;
        }
        let pdbs = if plan.parallel.is_empty() && plan.serial.is_empty() {
            Vec::new()
        } else {
            match Api::<PodDisruptionBudget>::all(self.target.clone())
                .list(&ListParams::default())
                .await
            {
                Ok(list) => list.items,
                Err(err) => return api_error("listing PodDisruptionBudgets", &err),
            }
        };
        let by_ref: BTreeMap<PodRef, &Pod> = listed.iter().map(|p| (PodRef::of(p), p)).collect();
        let mut blocked: Option<Blocker> = None;

        let evictions = plan
            .parallel
            .iter()
            .filter_map(|r| by_ref.get(r).copied())
            .map(|pod| self.evict(pod));
        for (pod, result) in plan
            .parallel
            .iter()
            .filter_map(|r| by_ref.get(r).copied())
            .zip(join_all(evictions).await)
        {
            match self.settle(pod, result, &pdbs, tracker).await {
                Ok(None) => {}
                Ok(Some(refusal)) if refusal.misconfigured => return DrainOutcome::Blocked(refusal),
                Ok(Some(refusal)) => blocked = blocked.or(Some(refusal)),
                Err(outcome) => return outcome,
            }
        }
        crash_point!(DrainEvictions, self.node);

        match self.move_volume_pod(node, &listed, &plan, &pdbs, tracker).await {
            Ok(Some(refusal)) if refusal.misconfigured => return DrainOutcome::Blocked(refusal),
            Ok(Some(refusal)) => blocked = blocked.or(Some(refusal)),
            Ok(None) => {}
            Err(outcome) => return outcome,
        }

        if plan.is_done() && tracker.moving.is_none() {
            return Self::drained(tracker);
        }
        DrainOutcome::InProgress {
            remaining: plan.parallel.len() + plan.serial.len() + plan.wait.len(),
            blocked,
        }
    }

    fn drained(tracker: &DrainTracker) -> DrainOutcome {
        DrainOutcome::Drained {
            evicted: tracker.evicted,
            deleted: tracker.deleted,
        }
    }

    async fn cordon(&self, nodes: &Api<Node>, node: &Node) -> Result<(), kube::Error> {
        if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
            return Ok(());
        }
        nodes
            .patch(
                self.node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "unschedulable": true } })),
            )
            .await
            .map(|_| ())
    }

    /// Force: every pod not left alone is deleted with grace period 0, in parallel, without waiting.
    async fn force(
        &self,
        listed: &[Pod],
        plan: &drain::DrainPlan,
        tracker: &mut DrainTracker,
    ) -> DrainOutcome {
        let deletions = plan.force_deletions();
        let by_ref: BTreeMap<PodRef, &Pod> = listed.iter().map(|p| (PodRef::of(p), p)).collect();
        let results = join_all(
            deletions
                .iter()
                .filter_map(|r| by_ref.get(r).copied())
                .map(|pod| self.delete_now(pod)),
        )
        .await;
        crash_point!(DrainForceDeletions, self.node);
        let mut failed = None;
        for result in results {
            match result {
                Ok(()) => tracker.deleted += 1,
                Err(err) => failed = Some(err),
            }
        }
        match failed {
            Some(err) => api_error("force-deleting pods", &err),
            None => Self::drained(tracker),
        }
    }

    async fn evict(&self, pod: &Pod) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.target.clone(), &pod.namespace().unwrap_or_default());
        match api.evict(&pod.name_any(), &EvictParams::default()).await {
            Ok(_) => Ok(()),
            Err(err) if is_status(&err, 404) => Ok(()),
            Err(err) => Err(err),
        }
    }

    async fn delete_now(&self, pod: &Pod) -> Result<(), kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.target.clone(), &pod.namespace().unwrap_or_default());
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => Ok(()),
            Err(err) if is_status(&err, 404) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// The result of one eviction: counted, or refused by a budget (retried up to the evict retries, then deleted,
    /// as the reference falls back to a deletion), or an error that fails the pass.
    async fn settle(
        &self,
        pod: &Pod,
        result: Result<(), kube::Error>,
        pdbs: &[PodDisruptionBudget],
        tracker: &mut DrainTracker,
    ) -> Result<Option<Blocker>, DrainOutcome> {
        match result {
            Ok(()) => {
                tracker.evicted += 1;
                Ok(None)
            }
            Err(err) if is_status(&err, 429) => {
                let blocker = drain::blocker(pod, pdbs);
                let attempts = tracker.attempts.entry(PodRef::of(pod).uid).or_default();
                *attempts += 1;
                if blocker.misconfigured || *attempts < self.mode.max_evict_retries {
                    return Ok(Some(blocker));
                }
                tracing::warn!(pod = %pod.name_any(), node = %self.node, attempts = *attempts, "evict retries used up; deleting the pod");
                self.delete_now(pod)
                    .await
                    .map_err(|err| api_error("deleting a pod after its evict retries", &err))?;
                tracker.deleted += 1;
                Ok(None)
            }
            Err(err) => Err(api_error(&format!("evicting pod {}", pod.name_any()), &err)),
        }
    }

    /// Pods with volumes go one at a time: the first of the serial order is evicted, then its volumes are awaited
    /// (detached from this node, attached elsewhere) before the next one goes.
    async fn move_volume_pod(
        &self,
        node: &Node,
        listed: &[Pod],
        plan: &drain::DrainPlan,
        pdbs: &[PodDisruptionBudget],
        tracker: &mut DrainTracker,
    ) -> Result<Option<Blocker>, DrainOutcome> {
        if tracker.moving.is_none() {
            tracker.moving = self.adopt_terminating(listed, plan).await?;
        }
        let serial = plan.serial.as_slice();
        if let Some(moving) = tracker.moving.clone() {
            let current = listed.iter().find(|p| {
                p.namespace().as_deref() == Some(moving.pod.namespace.as_str())
                    && p.name_any() == moving.pod.name
            });
            if !drain::pod_gone(&moving.pod, current) {
                if self.now < timeouts::add(moving.evicted_at, moving.gone_timeout) {
                    return Ok(None);
                }
                tracing::warn!(pod = %moving.pod.name, node = %self.node, "pod not gone within its timeout; moving on");
            }
            if moving.detached_at.is_none() {
                let detached = drain::volumes_detached(&moving.volume_ids, Some(node));
                let overdue = self.now >= timeouts::add(moving.evicted_at, moving.detach_timeout);
                if !detached && !overdue {
                    return Ok(None);
                }
                if !detached {
                    tracing::warn!(pod = %moving.pod.name, node = %self.node, "volumes not detached within the timeout; moving on");
                }
                if let Some(m) = tracker.moving.as_mut() {
                    m.detached_at = Some(self.now);
                }
            }
            let detached_at = tracker
                .moving
                .as_ref()
                .and_then(|m| m.detached_at)
                .unwrap_or(self.now);
            if !moving.pvs.is_empty()
                && self.now < timeouts::add(detached_at, self.settings.pv_reattach_timeout)
            {
                let attachments = Api::<VolumeAttachment>::all(self.target.clone())
                    .list(&ListParams::default())
                    .await
                    .map_err(|err| api_error("listing VolumeAttachments", &err))?
                    .items;
                if !moving
                    .pvs
                    .iter()
                    .all(|pv| drain::volume_reattached(pv, self.node, &attachments))
                {
                    return Ok(None);
                }
            }
            tracker.moving = None;
        }
        let Some(next) = serial.first() else {
            return Ok(None);
        };
        let Some(pod) = listed.iter().find(|p| PodRef::of(p) == *next) else {
            return Ok(None);
        };
        let (pvs, volume_ids) = self.volumes_of(pod, listed).await?;
        let result = self.evict(pod).await;
        crash_point!(DrainVolumePod, self.node);
        let evicted = result.is_ok();
        let blocker = self.settle(pod, result, pdbs, tracker).await?;
        if evicted {
            tracker.moving = Some(Moving {
                pod: next.clone(),
                pvs,
                volume_ids,
                evicted_at: self.now,
                gone_timeout: drain::pod_gone_timeout(pod, self.mode.timeout),
                detach_timeout: drain::detach_timeout(pod, self.settings),
                detached_at: None,
            });
        }
        Ok(blocker)
    }

    /// A volume pod that is already terminating while no eviction is followed — evicted before this controller
    /// restarted (the tracker lives in memory only) or deleted by someone else — is followed like one this drain
    /// evicted, from the moment its deletion began: the next volume pod waits until its volumes have detached and
    /// attached elsewhere. Without this, a restart during a volume pod's termination let the next one go at once
    /// (found by `machine_deletion::a_controller_restarted_while_a_volume_pod_terminates_still_waits_for_its_volume_to_move`).
    async fn adopt_terminating(
        &self,
        listed: &[Pod],
        plan: &drain::DrainPlan,
    ) -> Result<Option<Moving>, DrainOutcome> {
        let terminating = plan
            .wait
            .iter()
            .filter(|(_, reason)| *reason == drain::WaitReason::Terminating)
            .filter_map(|(reference, _)| listed.iter().find(|p| PodRef::of(p) == *reference));
        for pod in terminating {
            if drain::claims(pod).is_empty() {
                continue;
            }
            let (pvs, volume_ids) = self.volumes_of(pod, listed).await?;
            if pvs.is_empty() {
                continue;
            }
            let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or_default();
            let evicted_at = pod
                .metadata
                .deletion_timestamp
                .as_ref()
                .map_or(self.now, |at| at.0 - jiff::SignedDuration::from_secs(grace))
                .min(self.now);
            return Ok(Some(Moving {
                pod: PodRef::of(pod),
                pvs,
                volume_ids,
                evicted_at,
                gone_timeout: drain::pod_gone_timeout(pod, self.mode.timeout),
                detach_timeout: drain::detach_timeout(pod, self.settings),
                detached_at: None,
            }));
        }
        Ok(None)
    }

    /// The PersistentVolumes to follow for `pod` and the provider's IDs of them (GetVolumeIDs; volumes the provider
    /// does not know are not waited for).
    async fn volumes_of(
        &self,
        pod: &Pod,
        listed: &[Pod],
    ) -> Result<(Vec<String>, Vec<String>), DrainOutcome> {
        let namespace = pod.namespace().unwrap_or_default();
        let claims = Api::<PersistentVolumeClaim>::namespaced(self.target.clone(), &namespace)
            .list(&ListParams::default())
            .await
            .map_err(|err| api_error("listing PersistentVolumeClaims", &err))?;
        let pv_of_claim: BTreeMap<(String, String), String> = claims
            .items
            .iter()
            .filter_map(|c| {
                let pv = c.spec.as_ref()?.volume_name.clone()?;
                Some(((namespace.clone(), c.name_any()), pv))
            })
            .collect();
        let pvs = drain::pvs_to_track(pod, listed, &pv_of_claim);
        if pvs.is_empty() {
            return Ok((pvs, Vec::new()));
        }
        let volumes = Api::<PersistentVolume>::all(self.target.clone());
        let mut specs = Vec::new();
        for pv in &pvs {
            if let Some(spec) = volumes
                .get_opt(pv)
                .await
                .map_err(|err| api_error("reading a PersistentVolume", &err))?
                .and_then(|v| v.spec)
            {
                specs.push(spec);
            }
        }
        let ids = match self
            .driver
            .get_volume_ids(&GetVolumeIdsRequest { pv_specs: specs })
            .await
        {
            Ok(response) => response.volume_ids,
            Err(err) => {
                tracing::warn!(pod = %pod.name_any(), error = %err.message, "GetVolumeIDs failed; not waiting for the pod's volumes");
                Vec::new()
            }
        };
        Ok((pvs, ids))
    }
}
