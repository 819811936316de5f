//! PersistentVolumeClaim → PersistentVolume for the populator (upstream `createVolumeSpec`'s
//! PVC branch, V20): the claim and its volume are read through the [`VolumeObjects`] seam, off
//! the populator's pass (upstream GETs inline and blocks the loop), and the result is used by
//! the pass that follows. Every check upstream makes is made, with its message, plus the PV's
//! node affinity against this node (upstream checks it in the mount operation, V51).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume};
use tokio::sync::Notify;

use crate::objects::VolumeObjects;

/// This node, as a PV's node affinity sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels` (the agent's: `kubernetes.io/hostname`, `kubernetes.io/os`, ...).
    pub labels: BTreeMap<String, String>,
}

impl NodeIdentity {
    /// A node with the well-known labels the agent registers (the same function makes them).
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            labels: rustlet_core::node::well_known_labels(name),
        }
    }
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(|v| number(v)),
                values.first().and_then(|v| number(v)),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeIdentity) -> bool {
    let expressions = term.match_expressions.iter().flatten();
    let fields = term.match_fields.iter().flatten();
    if term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_ref().is_none_or(Vec::is_empty)
    {
        return false; // an empty term matches nothing
    }
    expressions
        .into_iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key)))
        && fields.into_iter().all(|r| {
            let name = (r.key == "metadata.name").then_some(&node.name);
            requirement_matches(r, name)
        })
}

/// Upstream `CheckNodeAffinity`: the PV's required terms (OR of ANDs) against this node.
pub fn node_affinity_matches(pv: &PersistentVolume, node: &NodeIdentity) -> bool {
    let Some(required) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    required
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, node))
}

/// Reads the claim and its volume and checks them as upstream does.
pub async fn resolve_claim(
    objects: &dyn VolumeObjects,
    namespace: &str,
    claim: &str,
    node: &NodeIdentity,
) -> Result<PersistentVolume, String> {
    let pvc = objects
        .persistent_volume_claim(namespace, claim)
        .await
        .map_err(|e| {
            format!(
                "error processing PVC {namespace}/{claim}: failed to fetch PVC from API server: {e}"
            )
        })?;
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(format!(
            "can't start pod because PVC {namespace}/{claim} is being deleted"
        ));
    }
    let phase = pvc
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let volume_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if phase != "Bound" || volume_name.is_empty() {
        return Err(format!(
            "error processing PVC {namespace}/{claim}: PVC {claim} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume_name:?})"
        ));
    }
    let pv = objects.persistent_volume(&volume_name).await.map_err(|e| {
        format!("error processing PVC {namespace}/{claim}: failed to fetch PV {volume_name} from API server: {e}")
    })?;
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let Some(claim_ref) = claim_ref else {
        return Err(format!(
            "error processing PVC {namespace}/{claim}: found PV object {volume_name:?} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    if claim_ref.uid != pvc.metadata.uid {
        return Err(format!(
            "error processing PVC {namespace}/{claim}: found PV object {volume_name:?} but its pv.Spec.ClaimRef.UID ({}) does not point to claim.UID ({})",
            claim_ref.uid.as_deref().unwrap_or_default(),
            pvc.metadata.uid.as_deref().unwrap_or_default()
        ));
    }
    if pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
        return Err(format!(
            "volume {claim} has volumeMode Block, but is specified in volumeMounts"
        ));
    }
    if !node_affinity_matches(&pv, node) {
        return Err(format!(
            "volume node affinity conflict: PV {volume_name:?} cannot be used on node {:?}",
            node.name
        ));
    }
    Ok(pv)
}

/// Claim lookups in flight and their results, keyed by (namespace, claim).
#[derive(Default)]
pub struct Claims {
    results: Mutex<HashMap<(String, String), Result<PersistentVolume, String>>>,
    in_flight: Mutex<HashSet<(String, String)>>,
    /// Notified when a lookup finished (the manager runs a pass).
    pub resolved: Arc<Notify>,
}

impl std::fmt::Debug for Claims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claims").finish_non_exhaustive()
    }
}

/// What a claim lookup gave the pass.
#[derive(Debug)]
pub enum ClaimLookup {
    /// The bound volume.
    Bound(Box<PersistentVolume>),
    /// Why it cannot be used.
    Failed(String),
    /// Being read; the pass after it ends uses it.
    Pending,
}

impl Claims {
    /// The result for the claim, consumed (the next processing reads it again, as upstream
    /// reads it on every processing); else a lookup is started and `Pending` returned.
    pub fn lookup(
        self: &Arc<Self>,
        objects: &Arc<dyn VolumeObjects>,
        namespace: &str,
        claim: &str,
        node: &NodeIdentity,
        on_done: impl FnOnce() + Send + 'static,
    ) -> ClaimLookup {
        let key = (namespace.to_owned(), claim.to_owned());
        if let Some(result) = self
            .results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
        {
            return match result {
                Ok(pv) => ClaimLookup::Bound(Box::new(pv)),
                Err(e) => ClaimLookup::Failed(e),
            };
        }
        let started = self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone());
        if !started {
            return ClaimLookup::Pending;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            return ClaimLookup::Failed("no runtime to read the claim".into());
        };
        let (claims, objects, node) = (self.clone(), objects.clone(), node.clone());
        handle.spawn(async move {
            let result = resolve_claim(&*objects, &key.0, &key.1, &node).await;
            claims
                .results
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), result);
            claims
                .in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            on_done();
            claims.resolved.notify_one();
        });
        ClaimLookup::Pending
    }
}
