//! What the API server does to an object before the local store keeps it, for the kinds the
//! store serves: decode it as its type (a malformed document is a 422 that names the field),
//! fold a Secret's `stringData` into `data`, apply the defaults the node agent reads (upstream
//! `SetDefaults_*`: a pod's restart policy, grace period, volume `defaultMode` 0644, projected
//! token expiration, container pull policy, ...), and validate what would otherwise reach the
//! node's disk: object names, ConfigMap and Secret keys, volume item paths and modes, `subPath`
//! and hostPath backsteps; and upstream's API validation ([`super::validation`]) of labels,
//! annotations, pod specs and typed Secrets. A pod being created starts `Pending`.
//!
//! Unknown fields are dropped, as the API server drops them. Admission is deterministic, so
//! applying the same manifest twice stores the same object (no spurious MODIFIED event).

use std::collections::BTreeSet;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, Node, NodeStatus, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimStatus, PersistentVolumeStatus, Pod, PodSpec, PodStatus, Secret, Volume,
};
use k8s_openapi::api::events::v1::Event;
use serde::Serialize;
use serde::de::{Deserialize, DeserializeOwned};
use serde_json::{Value, json};

use super::pod_status::{compute_pod_qos, default_pod_status, validate_pod_status_update};
use super::store::{Kind, ObjectRef, StoreError};
use super::validation::{
    FieldErrors, field_path, is_dns_label, is_dns_subdomain, nulls_to_empty_strings,
    validate_base64_map, validate_metadata, validate_secret_type,
};

/// Whether the object is being created or replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// POST.
    Create,
    /// PUT (and the result of a PATCH).
    Update,
}

/// The largest ConfigMap or Secret payload the API server accepts (1 MiB).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// `0644`, the API's default file mode for configMap, secret, downwardAPI and projected volumes.
pub const DEFAULT_MODE: i32 = 0o644;

/// Decode, default and validate `object` of `reference`'s kind; the object to store.
pub fn admit(
    reference: &ObjectRef,
    mut object: Value,
    operation: Operation,
) -> Result<Value, StoreError> {
    let mut errors = FieldErrors::default();
    validate_name(reference, &mut errors);
    nulls_to_empty_strings(&mut object);
    if let Some(metadata) = object.get("metadata") {
        validate_metadata(metadata, &mut errors);
    }
    // Base64 first, so a bad value is named by key and character, not by the decoder.
    match reference.kind {
        Kind::Secret => validate_base64_map(&object, "data", &mut errors),
        Kind::ConfigMap => validate_base64_map(&object, "binaryData", &mut errors),
        _ => {}
    }
    if !errors.0.is_empty() && matches!(reference.kind, Kind::Secret | Kind::ConfigMap) {
        return errors.into_result(reference).map(|()| Value::Null);
    }
    let admitted = match reference.kind {
        Kind::Pod => {
            let mut pod: Pod = decode(reference, object)?;
            if let Some(spec) = pod.spec.as_mut() {
                default_pod_spec(spec);
                validate_pod_spec(spec, &mut errors);
                super::validation::validate_pod_spec(
                    spec,
                    operation == Operation::Create,
                    &mut errors,
                );
            } else {
                errors.push("spec", "Required value", "a pod needs a spec");
            }
            if operation == Operation::Create {
                let qos = pod.spec.as_ref().map(compute_pod_qos);
                let status = pod.status.get_or_insert_with(PodStatus::default);
                status.phase.get_or_insert_with(|| "Pending".into());
                // upstream `PrepareForCreate`: the QoS class is the API server's (deviation:
                // a status given at creation is kept, and with it a class it names, so that
                // tests can create pods in any state).
                if status.qos_class.as_deref().unwrap_or_default().is_empty() {
                    status.qos_class = qos.map(str::to_owned);
                }
            }
            encode(&pod)
        }
        Kind::ConfigMap => {
            let config_map: ConfigMap = decode(reference, object)?;
            let data = config_map.data.iter().flatten();
            let binary = config_map.binary_data.iter().flatten();
            let mut size = 0;
            // Upstream counts the values only.
            for (key, value) in data {
                validate_key("data", key, &mut errors);
                size += value.len();
            }
            for (key, value) in binary {
                validate_key("binaryData", key, &mut errors);
                if config_map
                    .data
                    .as_ref()
                    .is_some_and(|d| d.contains_key(key))
                {
                    errors.push(
                        &format!("binaryData[{key}]"),
                        "Invalid value",
                        "duplicate of key present in data",
                    );
                }
                size += value.0.len();
            }
            validate_size(size, &mut errors);
            encode(&config_map)
        }
        Kind::Secret => {
            let mut secret: Secret = decode(reference, object)?;
            // The API server's secret strategy: stringData wins over data, then is dropped.
            if let Some(strings) = secret.string_data.take() {
                let data = secret.data.get_or_insert_with(Default::default);
                for (key, value) in strings {
                    data.insert(key, ByteString(value.into_bytes()));
                }
            }
            secret.type_.get_or_insert_with(|| "Opaque".into());
            let mut size = 0;
            for (key, value) in secret.data.iter().flatten() {
                validate_key("data", key, &mut errors);
                size += value.0.len();
            }
            validate_size(size, &mut errors);
            validate_secret_type(
                secret.type_.as_deref().unwrap_or_default(),
                secret.data.as_ref().unwrap_or(&Default::default()),
                secret.metadata.annotations.as_ref(),
                &mut errors,
            );
            encode(&secret)
        }
        Kind::PersistentVolume => {
            let mut volume: PersistentVolume = decode(reference, object)?;
            if let Some(spec) = volume.spec.as_mut() {
                spec.persistent_volume_reclaim_policy
                    .get_or_insert_with(|| "Retain".into());
                spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
                if let Some(path) = spec.host_path.as_ref().map(|h| h.path.clone()) {
                    validate_no_backsteps("spec.hostPath.path", &path, &mut errors);
                }
            }
            encode(&volume)
        }
        Kind::PersistentVolumeClaim => {
            let mut claim: PersistentVolumeClaim = decode(reference, object)?;
            if let Some(spec) = claim.spec.as_mut() {
                spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
            }
            encode(&claim)
        }
        Kind::Node => encode(&decode::<Node>(reference, object)?),
        Kind::Lease => encode(&decode::<Lease>(reference, object)?),
        Kind::Event => encode(&decode::<Event>(reference, object)?),
    };
    errors.into_result(reference)?;
    admitted
}

/// Admit a write of the status subresource: `object` is the stored object with the new status
/// (the rest of it is the stored one, which decoded when it was written), `old_status` the
/// stored status. The status must decode as its kind's; a pod's is defaulted and validated
/// against the stored one as the API server does ([`super::pod_status`]). Only the statuses
/// (and, when a terminated container comes back, the spec) are decoded, and nothing is copied
/// (each of a storm's status writes decoded and deep-copied the whole pod).
pub fn admit_status(
    reference: &ObjectRef,
    old_status: Option<&Value>,
    object: &mut Value,
) -> Result<(), StoreError> {
    let Some(status) = object.get("status") else {
        return Ok(());
    };
    match reference.kind {
        Kind::Pod => {
            let spec = || {
                object
                    .get("spec")
                    .and_then(|s| PodSpec::deserialize(s).ok())
                    .unwrap_or_default()
            };
            let old = old_status
                .and_then(|s| PodStatus::deserialize(s).ok())
                .unwrap_or_default();
            if let Some(defaults) = admit_pod_status(reference, old, status, &spec)? {
                defaults.apply(&mut object["status"]);
            }
            Ok(())
        }
        Kind::PersistentVolume => decode_status::<PersistentVolumeStatus>(reference, status),
        Kind::PersistentVolumeClaim => {
            decode_status::<PersistentVolumeClaimStatus>(reference, status)
        }
        Kind::Node => decode_status::<NodeStatus>(reference, status),
        // No status subresource: refused before any status write gets here.
        Kind::ConfigMap | Kind::Secret | Kind::Lease | Kind::Event => Ok(()),
    }
}

/// What the API server's status strategy sets in a pod status it admits (its IPs and QoS
/// class, defaulted from the old status), when that differs from what was written.
#[derive(Debug)]
pub(crate) struct PodStatusDefaults {
    pod_ip: Option<String>,
    pod_ips: Option<Vec<k8s_openapi::api::core::v1::PodIP>>,
    qos_class: Option<String>,
}

impl PodStatusDefaults {
    /// Sets them in `status` (JSON).
    pub(crate) fn apply(self, status: &mut Value) {
        status["podIP"] = json!(self.pod_ip);
        status["podIPs"] = json!(self.pod_ips);
        status["qosClass"] = json!(self.qos_class);
    }
}

/// [`admit_status`] of a pod's `status` (JSON) over its old one (decoded; the default when
/// there was none), the spec read only when the validation needs it: a 422 that names the
/// field, or the defaults to set (`None`: none change what was written).
pub(crate) fn admit_pod_status(
    reference: &ObjectRef,
    old: PodStatus,
    status: &Value,
    spec: &dyn Fn() -> PodSpec,
) -> Result<Option<PodStatusDefaults>, StoreError> {
    let mut new: PodStatus = decode_at(reference, "status", status)?;
    let before = (
        new.pod_ip.clone(),
        new.pod_ips.clone(),
        new.qos_class.clone(),
    );
    default_pod_status(&mut new, &old);
    let mut errors = FieldErrors::default();
    validate_pod_status_update(&new, &old, spec, &mut errors);
    errors.into_result(reference)?;
    let after = (new.pod_ip, new.pod_ips, new.qos_class);
    let changed = before != after;
    Ok(changed.then_some(PodStatusDefaults {
        pod_ip: after.0,
        pod_ips: after.1,
        qos_class: after.2,
    }))
}

fn decode_status<K: DeserializeOwned>(
    reference: &ObjectRef,
    status: &Value,
) -> Result<(), StoreError> {
    decode_at::<K>(reference, "status", status).map(drop)
}

fn decode<K: DeserializeOwned>(reference: &ObjectRef, object: Value) -> Result<K, StoreError> {
    decode_at(reference, "", &object)
}

/// Decodes `value`, found at `at` in the object (`""`: the object itself); an error names the
/// field path from the object's root, as the API server's do. The path is tracked only when
/// the plain decode fails: tracking it costs an allocation for every key of the object, and
/// nearly every write decodes.
fn decode_at<K: DeserializeOwned>(
    reference: &ObjectRef,
    at: &str,
    value: &Value,
) -> Result<K, StoreError> {
    if let Ok(decoded) = K::deserialize(value) {
        return Ok(decoded);
    }
    serde_path_to_error::deserialize(value).map_err(|err| {
        let inner = field_path(err.path());
        let inner = if inner == "." { "" } else { inner.as_str() };
        let path = match (at, inner) {
            ("", "") => String::new(),
            (at, "") => format!("{at}: "),
            ("", inner) => format!("{inner}: "),
            (at, inner) => format!("{at}.{inner}: "),
        };
        StoreError::Invalid(format!(
            "{} {:?} is invalid: {path}{}",
            reference.kind.name(),
            reference.name,
            err.inner()
        ))
    })
}

fn encode<K: Serialize>(object: &K) -> Result<Value, StoreError> {
    serde_json::to_value(object).map_err(|e| StoreError::Invalid(format!("encode: {e}")))
}

trait IntoResult {
    fn into_result(self, reference: &ObjectRef) -> Result<(), StoreError>;
}

impl IntoResult for FieldErrors {
    fn into_result(self, reference: &ObjectRef) -> Result<(), StoreError> {
        match self.message(reference.kind.name(), &reference.name) {
            None => Ok(()),
            Some(message) => Err(StoreError::Invalid(message)),
        }
    }
}

fn validate_name(reference: &ObjectRef, errors: &mut FieldErrors) {
    if !is_dns_subdomain(&reference.name) {
        errors.push(
            "metadata.name",
            "Invalid value",
            &format!(
                "{:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
                 characters, '-' or '.', and must start and end with an alphanumeric character \
                 (e.g. 'example.com', regex used for validation is \
                 '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                reference.name
            ),
        );
    }
    if reference.kind.is_namespaced() && !is_dns_label(&reference.namespace) {
        errors.push(
            "metadata.namespace",
            "Invalid value",
            &format!(
                "{:?}: must be a lowercase RFC 1123 label",
                reference.namespace
            ),
        );
    }
}

/// Upstream `IsConfigMapKey`: `[-._a-zA-Z0-9]+`, at most 253 characters, not `.` or `..`,
/// not starting with `..`.
fn validate_key(field: &str, key: &str, errors: &mut FieldErrors) {
    let charset = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let problem = if key.is_empty() || key.len() > 253 || !charset {
        Some("a valid config key must consist of alphanumeric characters, '-', '_' or '.'")
    } else if key == "." || key == ".." {
        Some("must not be '.' or '..'")
    } else if key.starts_with("..") {
        Some("must not start with '..'")
    } else {
        None
    };
    if let Some(problem) = problem {
        errors.push(
            &format!("{field}[{key}]"),
            "Invalid value",
            &format!("{key:?}: {problem}"),
        );
    }
}

fn validate_size(size: usize, errors: &mut FieldErrors) {
    if size > MAX_PAYLOAD_BYTES {
        errors.push(
            "data",
            "Too long",
            &format!("{size} bytes; must have at most {MAX_PAYLOAD_BYTES} bytes"),
        );
    }
}

/// Upstream `validatePathNoBacksteps`: no `..` element.
fn validate_no_backsteps(field: &str, path: &str, errors: &mut FieldErrors) {
    if path.split('/').any(|element| element == "..") {
        errors.push(
            field,
            "Invalid value",
            &format!("{path:?}: must not contain '..'"),
        );
    }
}

/// Upstream `validateLocalDescendingPath`: relative, no `..` element.
fn validate_descending_path(field: &str, path: &str, errors: &mut FieldErrors) {
    if path.starts_with('/') {
        errors.push(
            field,
            "Invalid value",
            &format!("{path:?}: must be a relative path"),
        );
    }
    validate_no_backsteps(field, path, errors);
}

fn validate_mode(field: &str, mode: Option<i32>, errors: &mut FieldErrors) {
    if let Some(mode) = mode
        && !(0..=0o777).contains(&mode)
    {
        errors.push(
            field,
            "Invalid value",
            &format!("{mode}: must be a number between 0 and 0777 (octal), both inclusive"),
        );
    }
}

/// Upstream `validateVolumeSourcePath`: required, relative, no `..` element, and no leading
/// `..` (reserved for the atomic writer's `..data`).
fn validate_item_path(field: &str, path: &str, errors: &mut FieldErrors) {
    if path.is_empty() {
        errors.push(field, "Required value", "");
    }
    validate_descending_path(field, path, errors);
    if path.starts_with("..") {
        errors.push(
            field,
            "Invalid value",
            &format!("{path:?}: must not start with '..'"),
        );
    }
}

fn validate_items(field: &str, items: Option<&Vec<KeyToPath>>, errors: &mut FieldErrors) {
    for (i, item) in items.into_iter().flatten().enumerate() {
        let field = format!("{field}.items[{i}]");
        validate_item_path(&format!("{field}.path"), &item.path, errors);
        validate_mode(&format!("{field}.mode"), item.mode, errors);
    }
}

fn image_pull_policy(image: &str) -> &'static str {
    // The tag is after the last ':' of the last path element; a digest pins the image.
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        return "IfNotPresent";
    }
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn default_container(container: &mut Container) {
    container
        .termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".into());
    container
        .termination_message_policy
        .get_or_insert_with(|| "File".into());
    if container.image_pull_policy.is_none() {
        let policy = image_pull_policy(container.image.as_deref().unwrap_or(""));
        container.image_pull_policy = Some(policy.into());
    }
    for port in container.ports.iter_mut().flatten() {
        port.protocol.get_or_insert_with(|| "TCP".into());
    }
    // upstream `SetDefaults_Pod`: a resource with a limit and no request requests its limit.
    if let Some(resources) = container.resources.as_mut()
        && let Some(limits) = &resources.limits
    {
        let requests = resources.requests.get_or_insert_with(Default::default);
        for (name, limit) in limits {
            requests
                .entry(name.clone())
                .or_insert_with(|| limit.clone());
        }
    }
}

fn default_volume(volume: &mut Volume) {
    let mode = Some(DEFAULT_MODE);
    if let Some(source) = volume.config_map.as_mut() {
        source.default_mode = source.default_mode.or(mode);
    }
    if let Some(source) = volume.secret.as_mut() {
        source.default_mode = source.default_mode.or(mode);
    }
    if let Some(source) = volume.downward_api.as_mut() {
        source.default_mode = source.default_mode.or(mode);
        for item in source.items.iter_mut().flatten() {
            if let Some(field) = item.field_ref.as_mut() {
                field.api_version.get_or_insert_with(|| "v1".into());
            }
        }
    }
    if let Some(source) = volume.projected.as_mut() {
        source.default_mode = source.default_mode.or(mode);
        for projection in source.sources.iter_mut().flatten() {
            if let Some(token) = projection.service_account_token.as_mut() {
                token.expiration_seconds.get_or_insert(3600);
            }
            if let Some(downward) = projection.downward_api.as_mut() {
                for item in downward.items.iter_mut().flatten() {
                    if let Some(field) = item.field_ref.as_mut() {
                        field.api_version.get_or_insert_with(|| "v1".into());
                    }
                }
            }
        }
    }
    if let Some(source) = volume.host_path.as_mut() {
        source.type_.get_or_insert_with(String::new);
    }
    // Upstream `SetDefaults_Volume`: a volume with no source is an emptyDir.
    let probe = Volume {
        name: volume.name.clone(),
        ..Default::default()
    };
    if *volume == probe {
        volume.empty_dir = Some(Default::default());
    }
}

/// Upstream `SetDefaults_PodSpec` and its containers' and volumes' defaults.
fn default_pod_spec(spec: &mut PodSpec) {
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.enable_service_links.get_or_insert(true);
    spec.security_context.get_or_insert_with(Default::default);
    let init = spec.init_containers.iter_mut().flatten();
    for container in spec.containers.iter_mut().chain(init) {
        default_container(container);
    }
    for volume in spec.volumes.iter_mut().flatten() {
        default_volume(volume);
    }
}

/// A name that must be an RFC 1123 label, unique among `seen`.
fn validate_unique_label<'a>(
    field: &str,
    name: &'a str,
    seen: &mut BTreeSet<&'a str>,
    errors: &mut FieldErrors,
) {
    if !is_dns_label(name) {
        errors.push(
            field,
            "Invalid value",
            &format!("{name:?}: must be a lowercase RFC 1123 label"),
        );
    }
    if !seen.insert(name) {
        errors.push(field, "Duplicate value", &format!("{name:?}"));
    }
}

fn validate_pod_spec(spec: &PodSpec, errors: &mut FieldErrors) {
    let mut volume_names = BTreeSet::new();
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}]");
        validate_unique_label(
            &format!("{field}.name"),
            &volume.name,
            &mut volume_names,
            errors,
        );
        if let Some(source) = &volume.config_map {
            let field = format!("{field}.configMap");
            validate_mode(&format!("{field}.defaultMode"), source.default_mode, errors);
            validate_items(&field, source.items.as_ref(), errors);
        }
        if let Some(source) = &volume.secret {
            let field = format!("{field}.secret");
            validate_mode(&format!("{field}.defaultMode"), source.default_mode, errors);
            validate_items(&field, source.items.as_ref(), errors);
        }
        if let Some(source) = &volume.downward_api {
            validate_mode(
                &format!("{field}.downwardAPI.defaultMode"),
                source.default_mode,
                errors,
            );
            for (j, item) in source.items.iter().flatten().enumerate() {
                let item_field = format!("{field}.downwardAPI.items[{j}]");
                validate_item_path(&format!("{item_field}.path"), &item.path, errors);
                validate_mode(&format!("{item_field}.mode"), item.mode, errors);
            }
        }
        if let Some(source) = &volume.projected {
            validate_mode(
                &format!("{field}.projected.defaultMode"),
                source.default_mode,
                errors,
            );
            for (j, projection) in source.sources.iter().flatten().enumerate() {
                let source_field = format!("{field}.projected.sources[{j}]");
                if let Some(p) = &projection.config_map {
                    validate_items(
                        &format!("{source_field}.configMap"),
                        p.items.as_ref(),
                        errors,
                    );
                }
                if let Some(p) = &projection.secret {
                    validate_items(&format!("{source_field}.secret"), p.items.as_ref(), errors);
                }
                if let Some(p) = &projection.service_account_token {
                    validate_descending_path(
                        &format!("{source_field}.serviceAccountToken.path"),
                        &p.path,
                        errors,
                    );
                    if p.expiration_seconds.is_some_and(|s| s < 600) {
                        errors.push(
                            &format!("{source_field}.serviceAccountToken.expirationSeconds"),
                            "Invalid value",
                            "may not specify a duration less than 10 minutes",
                        );
                    }
                }
                if let Some(p) = &projection.downward_api {
                    for (k, item) in p.items.iter().flatten().enumerate() {
                        validate_item_path(
                            &format!("{source_field}.downwardAPI.items[{k}].path"),
                            &item.path,
                            errors,
                        );
                    }
                }
            }
        }
        if let Some(source) = &volume.host_path {
            validate_no_backsteps(&format!("{field}.hostPath.path"), &source.path, errors);
        }
    }
    let mut container_names = BTreeSet::new();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("initContainers", c));
    let plain = spec.containers.iter().map(|c| ("containers", c));
    let mut index = std::collections::BTreeMap::<&str, usize>::new();
    for (list, container) in plain.chain(init) {
        let i = index.entry(list).or_default();
        let field = format!("spec.{list}[{i}]");
        *i += 1;
        validate_unique_label(
            &format!("{field}.name"),
            &container.name,
            &mut container_names,
            errors,
        );
        for (j, mount) in container.volume_mounts.iter().flatten().enumerate() {
            let mount_field = format!("{field}.volumeMounts[{j}]");
            if !volume_names.contains(mount.name.as_str()) {
                errors.push(
                    &format!("{mount_field}.name"),
                    "Not found",
                    &format!("{:?}", mount.name),
                );
            }
            if let Some(sub_path) = &mount.sub_path {
                validate_descending_path(&format!("{mount_field}.subPath"), sub_path, errors);
            }
        }
    }
}

#[cfg(test)]
mod tests;
