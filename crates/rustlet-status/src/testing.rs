//! Fakes for tests (behind `test-util`): a stateful API client that records every action, with
//! reactors, and a pod manager (upstream `status/testing`, client-go's `fake.Clientset`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use rustlet_core::patch::apply_status_patch;
use rustlet_core::pod::{is_mirror_pod, is_static_pod};
use rustlet_core::{ChangeLog, PodChanges, PodUid};
use serde_json::Value;

use crate::manager::StatusManager;
use crate::seams::{ClientError, PodManager, PodStatusClient, UidTranslations};
use crate::sync::{BatchKind, Syncer};

/// Drives a manager's sync task by hand, batch by batch (upstream tests call `syncBatch`
/// directly). Takes the task out of the manager: `start` then returns `None`.
pub struct ManualSync {
    syncer: Syncer,
}

impl ManualSync {
    /// Takes the sync task of a manager that has a client and was not started.
    pub fn take(manager: &StatusManager) -> Self {
        Self {
            syncer: manager.take_syncer(),
        }
    }

    /// Drains pending kicks, one kick batch per kick; returns the pods synced.
    pub async fn kick_batches(&mut self) -> usize {
        let mut count = 0;
        while self.syncer.kick_rx.try_recv().is_ok() {
            count += self.syncer.sync_batch(BatchKind::Kick).await;
        }
        count
    }

    /// One full batch (the 10 s one); returns the pods synced.
    pub async fn full_batch(&mut self) -> usize {
        self.syncer.sync_batch(BatchKind::Full).await
    }
}

/// The verb of a recorded action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// GET of a pod.
    Get,
    /// PATCH of the status subresource.
    Patch,
    /// DELETE of a pod.
    Delete,
}

/// One request the fake received.
#[derive(Clone, Debug, PartialEq)]
pub struct Action {
    /// The verb.
    pub verb: Verb,
    /// `Some("status")` for the status subresource.
    pub subresource: Option<&'static str>,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Request body: the patch, or the DELETE's UID precondition as `{"preconditions":{"uid":..}}`.
    pub body: Option<Value>,
}

impl Action {
    /// `get pods`, `patch pods/status`, `delete pods` (upstream `verifyActions` notation).
    pub fn short(&self) -> &'static str {
        match self.verb {
            Verb::Get => "get",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }
}

/// What a reactor answers instead of the fake's normal behaviour.
#[derive(Clone, Debug, PartialEq)]
pub enum Reaction {
    /// 404.
    NotFound,
    /// 409.
    Conflict,
    /// Any other status code.
    Error(u16),
    /// 422 with this message (the API server's validation errors).
    Invalid(String),
    /// GET returns the stored pod with this UID (the pod was deleted and recreated).
    RecreatedUid(String),
    /// No answer ever (a half-open connection); only the caller's deadline ends the call.
    Hang,
}

#[derive(Clone, Debug)]
struct Reactor {
    verb: Option<Verb>,
    /// Only requests for a pod of this name (any pod when `None`).
    name: Option<String>,
    reaction: Reaction,
    remaining: Option<usize>,
}

#[derive(Debug, Default)]
struct FakeState {
    pods: BTreeMap<(String, String), Pod>,
    actions: Vec<Action>,
    reactors: Vec<Reactor>,
    resource_version: u64,
    latency: Option<Duration>,
    in_flight: HashMap<(String, String), usize>,
    max_in_flight_per_pod: usize,
    in_flight_total: usize,
    max_in_flight_total: usize,
}

/// A stateful fake API server for pods: GET, status PATCH (strategic merge, UID and
/// resourceVersion preconditions), DELETE (UID precondition). Cloning shares the state.
#[derive(Clone, Debug, Default)]
pub struct FakePodStatusClient {
    state: Arc<Mutex<FakeState>>,
}

fn key(namespace: &str, name: &str) -> (String, String) {
    (namespace.to_owned(), name.to_owned())
}

impl FakePodStatusClient {
    /// An empty fake.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every call waits this long (tokio time) before answering.
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = Some(latency);
    }

    /// Stores (or replaces) a pod, giving it a new resourceVersion; returns the stored copy.
    pub fn put_pod(&self, mut pod: Pod) -> Pod {
        let mut state = self.state();
        state.resource_version += 1;
        pod.metadata.resource_version = Some(state.resource_version.to_string());
        let k = key(
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or(""),
        );
        state.pods.insert(k, pod.clone());
        pod
    }

    /// A stored pod.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.state().pods.get(&key(namespace, name)).cloned()
    }

    /// Another writer changes a stored pod's status (bumping its resourceVersion).
    pub fn update_status(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut PodStatus),
    ) -> Option<Pod> {
        let mut pod = self.pod(namespace, name)?;
        change(pod.status.get_or_insert_with(PodStatus::default));
        Some(self.put_pod(pod))
    }

    /// Answers the next `times` calls of `verb` (any verb when `None`; forever when `times` is
    /// `None`) with `reaction`.
    pub fn react(&self, verb: Option<Verb>, reaction: Reaction, times: Option<usize>) {
        self.state().reactors.push(Reactor {
            verb,
            name: None,
            reaction,
            remaining: times,
        });
    }

    /// As [`Self::react`], for the requests about the pod named `name` only.
    pub fn react_for(
        &self,
        name: &str,
        verb: Option<Verb>,
        reaction: Reaction,
        times: Option<usize>,
    ) {
        self.state().reactors.push(Reactor {
            verb,
            name: Some(name.to_owned()),
            reaction,
            remaining: times,
        });
    }

    /// Removes every reactor.
    pub fn clear_reactors(&self) {
        self.state().reactors.clear();
    }

    /// The actions so far.
    pub fn actions(&self) -> Vec<Action> {
        self.state().actions.clone()
    }

    /// Returns and clears the actions.
    pub fn take_actions(&self) -> Vec<Action> {
        std::mem::take(&mut self.state().actions)
    }

    /// The short names of the actions so far (`["get", "patch"]`), clearing them.
    pub fn take_verbs(&self) -> Vec<&'static str> {
        self.take_actions().iter().map(Action::short).collect()
    }

    /// The most requests ever in flight at once for one pod.
    pub fn max_in_flight_per_pod(&self) -> usize {
        self.state().max_in_flight_per_pod
    }

    /// The most requests ever in flight at once, all pods together.
    pub fn max_in_flight_total(&self) -> usize {
        self.state().max_in_flight_total
    }

    async fn begin(&self, action: Action) -> Option<Reaction> {
        let k = key(&action.namespace, &action.name);
        let latency = {
            let mut state = self.state();
            state.actions.push(action.clone());
            let in_flight = state.in_flight.entry(k.clone()).or_insert(0);
            *in_flight += 1;
            let now = *in_flight;
            state.max_in_flight_per_pod = state.max_in_flight_per_pod.max(now);
            state.in_flight_total += 1;
            state.max_in_flight_total = state.max_in_flight_total.max(state.in_flight_total);
            state.latency
        };
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        let reaction = {
            let mut state = self.state();
            if let Some(in_flight) = state.in_flight.get_mut(&k) {
                *in_flight -= 1;
            }
            state.in_flight_total -= 1;
            let index = state.reactors.iter().position(|r| {
                r.verb.is_none_or(|v| v == action.verb)
                    && r.name.as_deref().is_none_or(|n| n == action.name)
            })?;
            let reactor = &mut state.reactors[index];
            let reaction = reactor.reaction.clone();
            if let Some(remaining) = &mut reactor.remaining {
                *remaining -= 1;
                if *remaining == 0 {
                    state.reactors.remove(index);
                }
            }
            reaction
        };
        if reaction == Reaction::Hang {
            std::future::pending::<()>().await;
        }
        Some(reaction)
    }
}

fn error_for(reaction: &Reaction, what: &str) -> Option<ClientError> {
    match reaction {
        Reaction::NotFound => Some(ClientError::NotFound(what.to_owned())),
        Reaction::Conflict => Some(ClientError::Conflict(what.to_owned())),
        Reaction::Error(code) => Some(ClientError::Api {
            code: *code,
            message: format!("injected {code}"),
        }),
        Reaction::Invalid(message) => Some(ClientError::Api {
            code: 422,
            message: message.clone(),
        }),
        Reaction::RecreatedUid(_) | Reaction::Hang => None,
    }
}

#[async_trait]
impl PodStatusClient for FakePodStatusClient {
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ClientError> {
        let action = Action {
            verb: Verb::Get,
            subresource: None,
            namespace: namespace.into(),
            name: name.into(),
            body: None,
        };
        let what = format!("pods \"{name}\"");
        let reaction = self.begin(action).await;
        if let Some(err) = reaction.as_ref().and_then(|r| error_for(r, &what)) {
            return Err(err);
        }
        let mut pod = self
            .pod(namespace, name)
            .ok_or(ClientError::NotFound(what))?;
        if let Some(Reaction::RecreatedUid(uid)) = reaction {
            pod.metadata.uid = Some(uid);
        }
        Ok(pod)
    }

    async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Pod, ClientError> {
        let action = Action {
            verb: Verb::Patch,
            subresource: Some("status"),
            namespace: namespace.into(),
            name: name.into(),
            body: Some(patch.clone()),
        };
        let what = format!("pods \"{name}\"");
        if let Some(err) = self
            .begin(action)
            .await
            .as_ref()
            .and_then(|r| error_for(r, &what))
        {
            return Err(err);
        }
        let pod = self
            .pod(namespace, name)
            .ok_or_else(|| ClientError::NotFound(what.clone()))?;
        // As the API server: a patch has no storage preconditions, so the resourceVersion is
        // compared first (409), then validation finds the immutable UID changed (422).
        let meta = &patch["metadata"];
        if let Some(rv) = meta["resourceVersion"].as_str()
            && pod.metadata.resource_version.as_deref() != Some(rv)
        {
            return Err(ClientError::Conflict(format!(
                "Operation cannot be fulfilled on {what}: the object has been modified"
            )));
        }
        if let Some(uid) = meta["uid"].as_str()
            && pod.metadata.uid.as_deref() != Some(uid)
        {
            return Err(ClientError::Api {
                code: 422,
                message: format!(
                    "Pod \"{name}\" is invalid: metadata.uid: Invalid value: \"{uid}\": field is immutable"
                ),
            });
        }
        let mut status =
            serde_json::to_value(pod.status.clone().unwrap_or_default()).unwrap_or_default();
        apply_status_patch(&mut status, &patch["status"]);
        let status: PodStatus = serde_json::from_value(status).map_err(|e| ClientError::Api {
            code: 422,
            message: e.to_string(),
        })?;
        let mut updated = pod;
        updated.status = Some(status);
        Ok(self.put_pod(updated))
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ClientError> {
        let action = Action {
            verb: Verb::Delete,
            subresource: None,
            namespace: namespace.into(),
            name: name.into(),
            body: Some(serde_json::json!({"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})),
        };
        let what = format!("pods \"{name}\"");
        if let Some(err) = self
            .begin(action)
            .await
            .as_ref()
            .and_then(|r| error_for(r, &what))
        {
            return Err(err);
        }
        let mut state = self.state();
        let k = key(namespace, name);
        match state.pods.get(&k) {
            None => Err(ClientError::NotFound(what)),
            Some(p) if p.metadata.uid.as_deref() != Some(uid) => Err(ClientError::Conflict(
                format!("{what}: UID precondition failed"),
            )),
            Some(_) => {
                state.pods.remove(&k);
                Ok(())
            }
        }
    }
}

#[derive(Debug, Default)]
struct PodManagerState {
    pods: HashMap<PodUid, Arc<Pod>>,
    mirrors: HashMap<(String, String), Arc<Pod>>,
    /// UIDs of the static pods, kept up to date so translations cost O(static pods), as
    /// upstream's basic pod manager keeps its translation maps.
    static_uids: std::collections::HashSet<PodUid>,
    /// Every add, removal and status change, as the agent's pod cache logs them.
    changes: ChangeLog,
}

/// A pod manager holding pods and mirror pods (upstream `kubepod.NewBasicPodManager`). Cloning
/// shares the state.
#[derive(Clone, Debug, Default)]
pub struct FakePodManager {
    state: Arc<Mutex<PodManagerState>>,
}

fn full_name(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

impl FakePodManager {
    /// An empty pod manager.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, PodManagerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds or replaces a pod; a pod with the mirror annotation goes to the mirror table.
    pub fn add_pod(&self, pod: Pod) {
        let mut state = self.state();
        state.changes.record(PodUid::of(&pod));
        if is_mirror_pod(&pod) {
            state.mirrors.insert(full_name(&pod), Arc::new(pod));
        } else {
            let uid = PodUid::of(&pod);
            if is_static_pod(&pod) {
                state.static_uids.insert(uid.clone());
            } else {
                state.static_uids.remove(&uid);
            }
            state.pods.insert(uid, Arc::new(pod));
        }
    }

    /// Removes a pod (or mirror pod) by UID.
    pub fn remove_pod(&self, uid: &PodUid) {
        let mut state = self.state();
        state.changes.record(uid.clone());
        state.pods.remove(uid);
        state.static_uids.remove(uid);
        state.mirrors.retain(|_, m| PodUid::of(m) != *uid);
    }

    /// Replaces the status of a known pod (what the watch delivers after a write).
    pub fn set_status(&self, uid: &PodUid, status: PodStatus) {
        let mut state = self.state();
        state.changes.record(uid.clone());
        if let Some(pod) = state.pods.get_mut(uid) {
            Arc::make_mut(pod).status = Some(status.clone());
        }
        for mirror in state.mirrors.values_mut() {
            if PodUid::of(mirror) == *uid {
                Arc::make_mut(mirror).status = Some(status.clone());
            }
        }
    }

    /// Every non-mirror pod.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.state().pods.values().cloned().collect()
    }
}

impl PodManager for FakePodManager {
    fn pod_by_uid(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.state().pods.get(uid).cloned()
    }

    fn mirror_pod_of(&self, pod: &Pod) -> Option<Arc<Pod>> {
        self.state().mirrors.get(&full_name(pod)).cloned()
    }

    fn translate_pod_uid(&self, uid: &PodUid) -> PodUid {
        let state = self.state();
        for mirror in state.mirrors.values() {
            if PodUid::of(mirror) == *uid {
                let name = full_name(mirror);
                if let Some(static_pod) = state.pods.values().find(|p| full_name(p) == name) {
                    return PodUid::of(static_pod);
                }
            }
        }
        uid.clone()
    }

    fn changes_since(&self, cursor: u64) -> PodChanges {
        self.state().changes.since(cursor)
    }

    fn uid_translations(&self) -> UidTranslations {
        let state = self.state();
        let mut translations = UidTranslations::default();
        for pod in state
            .static_uids
            .iter()
            .filter_map(|uid| state.pods.get(uid))
        {
            let mirror = state
                .mirrors
                .get(&full_name(pod))
                .map(|m| PodUid::of(m))
                .unwrap_or_default();
            if !mirror.is_empty() {
                translations
                    .mirror_to_pod
                    .insert(mirror.clone(), PodUid::of(pod));
            }
            translations.pod_to_mirror.insert(PodUid::of(pod), mirror);
        }
        translations
    }
}
