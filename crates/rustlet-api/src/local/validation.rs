//! Upstream's API validation (`pkg/apis/core/validation`, `apimachinery/pkg/util/validation`)
//! for what the local store admits, with upstream's field paths and messages: object metadata
//! (labels, annotations), pod specs (containers, ports, mounts, resources, tolerations, volume
//! sources, hostPath types, restart policy) and typed Secrets. Admission calls it; the test
//! API server shares it through the store.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Container, PodSpec, Toleration, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use rustlet_core::quantity::{is_quantity, quantity_cmp};
use serde_json::Value;

/// The API's field errors, reported together (upstream `field.ErrorList`).
#[derive(Debug, Default)]
pub struct FieldErrors(pub Vec<String>);

/// Go's `%v` of a string value in a field error: quoted.
fn quoted(value: &str) -> String {
    format!("{value:?}")
}

impl FieldErrors {
    /// `field: kind: detail` (an empty detail is left out, as upstream).
    pub fn push(&mut self, field: &str, kind: &str, detail: &str) {
        if detail.is_empty() {
            self.0.push(format!("{field}: {kind}"));
        } else {
            self.0.push(format!("{field}: {kind}: {detail}"));
        }
    }

    /// `field.Required`.
    pub fn required(&mut self, field: &str) {
        self.push(field, "Required value", "");
    }

    /// `field.Invalid` with a value already formatted as Go prints it.
    pub fn invalid(&mut self, field: &str, value: &str, detail: &str) {
        self.push(field, "Invalid value", &format!("{value}: {detail}"));
    }

    /// `field.NotSupported`.
    pub fn not_supported(&mut self, field: &str, value: &str, supported: &[&str]) {
        let list: Vec<String> = supported.iter().map(|s| quoted(s)).collect();
        self.push(
            field,
            "Unsupported value",
            &format!("{}: supported values: {}", quoted(value), list.join(", ")),
        );
    }

    /// `field.Forbidden`.
    pub fn forbidden(&mut self, field: &str, detail: &str) {
        self.push(field, "Forbidden", detail);
    }

    /// Upstream's aggregate: one error as is, several in brackets.
    pub fn message(&self, kind: &str, name: &str) -> Option<String> {
        match self.0.as_slice() {
            [] => None,
            [one] => Some(format!("{kind} {name:?} is invalid: {one}")),
            many => Some(format!("{kind} {name:?} is invalid: [{}]", many.join(", "))),
        }
    }
}

const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;
/// Upstream `TotalAnnotationSizeLimitB`.
const ANNOTATIONS_MAX: usize = 256 * 1024;

fn label_chars(value: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    value.starts_with(alnum)
        && value.ends_with(alnum)
        && value
            .chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

/// RFC 1123 label: at most 63 lowercase alphanumerics or '-', starting and ending alphanumeric
/// ([`rustlet_core::names::is_dns1123_label`]).
pub fn is_dns_label(value: &str) -> bool {
    rustlet_core::names::is_dns1123_label(value)
}

/// RFC 1123 subdomain (upstream `IsDNS1123Subdomain`): at most 253 characters in all, of
/// dot-separated parts that start and end alphanumeric (no per-part limit;
/// [`rustlet_core::names::is_dns1123_subdomain`]).
pub fn is_dns_subdomain(value: &str) -> bool {
    rustlet_core::names::is_dns1123_subdomain(value)
}

const SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
     alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
     (e.g. 'example.com', regex used for validation is \
     '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Upstream `IsQualifiedName`: `[prefix/]name`.
pub(crate) fn qualified_name_problems(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    if value.matches('/').count() > 1 {
        out.push(
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and \
             must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  \
             or '123-abc', regex used for validation is \
             '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix \
             and '/' (e.g. 'example.com/MyName')"
                .to_owned(),
        );
        return out;
    }
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            out.push("prefix part must be non-empty".to_owned());
        } else if !is_dns_subdomain(prefix) {
            out.push(format!("prefix part {SUBDOMAIN_MESSAGE}"));
        }
    }
    if name.is_empty() {
        out.push("name part must be non-empty".to_owned());
    } else if name.len() > QUALIFIED_NAME_MAX {
        out.push(format!(
            "name part must be no more than {QUALIFIED_NAME_MAX} characters"
        ));
    }
    if !name.is_empty() && !label_chars(name) {
        out.push(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
             and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
             '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
                .to_owned(),
        );
    }
    out
}

/// The longest `metadata.uid` a manifest may choose.
pub const UID_MAX: usize = 128;

/// A `metadata.uid` that a manifest chose (the API server never lets a client choose one; a
/// local manifest and a static pod may, as upstream's file source keeps a manifest's UID). A
/// pod's UID names its directories, so the local store accepts what the API server would give,
/// a UUID, and more generally 1-128 characters of `[A-Za-z0-9._-]` other than `.` and `..`.
/// Deviation: upstream checks nothing here (its paths are built from whatever the file said).
fn validate_uid(uid: &str, errors: &mut FieldErrors) {
    let detail = match rustlet_core::path_component("pod UID", uid) {
        Err(e) => Some(format!("it {}", e.reason)),
        Ok(_) if uid.len() > UID_MAX => Some(format!("must be no more than {UID_MAX} characters")),
        Ok(_)
            if !uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) =>
        {
            Some("must consist of alphanumeric characters, '-', '_' or '.'".to_owned())
        }
        Ok(_) => None,
    };
    if let Some(detail) = detail {
        errors.invalid(
            "metadata.uid",
            &quoted(uid),
            &format!("{detail} (a UID names the object's directories; a UUID is always accepted)"),
        );
    }
}

/// Upstream `ValidateLabels` and `ValidateAnnotations` on `metadata`, and the manifest's own
/// `metadata.uid` (`validate_uid`).
pub fn validate_metadata(metadata: &Value, errors: &mut FieldErrors) {
    if let Some(uid) = metadata.get("uid").and_then(Value::as_str)
        && !uid.is_empty()
    {
        validate_uid(uid, errors);
    }
    if let Some(labels) = metadata.get("labels").and_then(Value::as_object) {
        for (key, value) in labels {
            for problem in qualified_name_problems(key) {
                errors.invalid("metadata.labels", &quoted(key), &problem);
            }
            let value = value.as_str().unwrap_or_default();
            if value.len() > LABEL_VALUE_MAX {
                errors.invalid(
                    "metadata.labels",
                    &quoted(value),
                    &format!("must be no more than {LABEL_VALUE_MAX} characters"),
                );
            }
            if !value.is_empty() && !label_chars(value) {
                errors.invalid(
                    "metadata.labels",
                    &quoted(value),
                    "a valid label must be an empty string or consist of alphanumeric \
                     characters, '-', '_' or '.', and must start and end with an alphanumeric \
                     character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for \
                     validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                );
            }
        }
    }
    if let Some(annotations) = metadata.get("annotations").and_then(Value::as_object) {
        let mut size = 0;
        for (key, value) in annotations {
            for problem in qualified_name_problems(&key.to_lowercase()) {
                errors.invalid("metadata.annotations", &quoted(key), &problem);
            }
            size += key.len() + value.as_str().map_or(0, str::len);
        }
        if size > ANNOTATIONS_MAX {
            errors.push(
                "metadata.annotations",
                "Too long",
                &format!("may not be more than {ANNOTATIONS_MAX} bytes"),
            );
        }
    }
}

/// Go decodes a JSON `null` in a `map[string]string` as `""`: these maps of `object` get `""`
/// for their nulls before the typed decode (which would refuse them).
pub fn nulls_to_empty_strings(object: &mut Value) {
    for pointer in [
        "/metadata/labels",
        "/metadata/annotations",
        "/data",
        "/stringData",
        "/binaryData",
        "/spec/nodeSelector",
    ] {
        if let Some(map) = object.pointer_mut(pointer).and_then(Value::as_object_mut) {
            for value in map.values_mut() {
                if value.is_null() {
                    *value = Value::String(String::new());
                }
            }
        }
    }
}

/// Checks the base64 values of `object[field]` before the typed decode, so a bad one is named
/// by key and character (`data[tls.crt]: ... '.' at offset 3`) instead of a byte code.
pub fn validate_base64_map(object: &Value, field: &str, errors: &mut FieldErrors) {
    let Some(map) = object.get(field).and_then(Value::as_object) else {
        return;
    };
    for (key, value) in map {
        let Some(text) = value.as_str() else { continue };
        if let Some(problem) = base64_problem(text) {
            errors.invalid(
                &format!("{field}[{key}]"),
                "\"<secret contents redacted>\"",
                &problem,
            );
        }
    }
}

/// Why `text` is not standard padded base64 (RFC 4648 section 4), or `None`.
fn base64_problem(text: &str) -> Option<String> {
    let is_alphabet = |c: char| c.is_ascii_alphanumeric() || c == '+' || c == '/';
    let body = text.trim_end_matches('=');
    let padding = text.len() - body.len();
    if let Some((offset, c)) = body.char_indices().find(|(_, c)| !is_alphabet(*c)) {
        return Some(format!(
            "illegal base64 data: character {c:?} at offset {offset}"
        ));
    }
    if padding > 2 || !text.len().is_multiple_of(4) || (padding > 0 && body.len().is_multiple_of(4))
    {
        return Some(format!(
            "illegal base64 data: a length of {} characters with {padding} of padding",
            text.len()
        ));
    }
    None
}

/// The regular expression upstream's quantity parser names.
const QUANTITY_MESSAGE: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

fn validate_resources(field: &str, container: &Container, errors: &mut FieldErrors) {
    let Some(resources) = &container.resources else {
        return;
    };
    let mut valid = |part: &str, list: Option<&BTreeMap<String, Quantity>>| {
        let mut out = BTreeMap::new();
        for (name, quantity) in list.into_iter().flatten() {
            let path = format!("{field}.resources.{part}[{name}]");
            if !is_quantity(&quantity.0) {
                errors.invalid(&path, &quoted(&quantity.0), QUANTITY_MESSAGE);
            } else if quantity_cmp(&quantity.0, "0") == Some(Ordering::Less) {
                errors.invalid(
                    &path,
                    &quoted(&quantity.0),
                    "must be greater than or equal to 0",
                );
            } else {
                out.insert(name.clone(), quantity.0.clone());
            }
        }
        out
    };
    let limits = valid("limits", resources.limits.as_ref());
    let requests = valid("requests", resources.requests.as_ref());
    for (name, request) in &requests {
        if let Some(limit) = limits.get(name)
            && quantity_cmp(request, limit) == Some(Ordering::Greater)
        {
            errors.invalid(
                &format!("{field}.resources.requests[{name}]"),
                &quoted(request),
                &format!("must be less than or equal to {name} limit of {limit}"),
            );
        }
    }
}

/// Upstream `validateMountPropagation`: one of the three modes; `Bidirectional` only for a
/// privileged container.
fn validate_mount_propagation(
    field: &str,
    container: &Container,
    mount: &VolumeMount,
    errors: &mut FieldErrors,
) {
    let Some(mode) = mount.mount_propagation.as_deref() else {
        return;
    };
    let field = format!("{field}.mountPropagation");
    if !matches!(mode, "Bidirectional" | "HostToContainer" | "None") {
        errors.not_supported(&field, mode, &["Bidirectional", "HostToContainer", "None"]);
    }
    let privileged = container
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    if mode == "Bidirectional" && !privileged {
        errors.forbidden(
            &field,
            "Bidirectional mount propagation is available only to privileged containers",
        );
    }
}

/// Upstream `validateMountRecursiveReadOnly`: `Enabled` and `IfPossible` only on a read-only
/// mount without propagation.
fn validate_mount_recursive_read_only(field: &str, mount: &VolumeMount, errors: &mut FieldErrors) {
    let Some(mode) = mount.recursive_read_only.as_deref() else {
        return;
    };
    let field = format!("{field}.recursiveReadOnly");
    match mode {
        "Disabled" => {}
        "Enabled" | "IfPossible" => {
            if !mount.read_only.unwrap_or(false) {
                errors.forbidden(&field, "may only be specified when readOnly is true");
            }
            if mount
                .mount_propagation
                .as_deref()
                .is_some_and(|p| p != "None")
            {
                errors.forbidden(
                    &field,
                    "may only be specified when mountPropagation is None or not specified",
                );
            }
        }
        other => errors.not_supported(&field, other, &["Disabled", "Enabled", "IfPossible"]),
    }
}

fn validate_port(field: &str, port: i32, errors: &mut FieldErrors) {
    if !(1..=65535).contains(&port) {
        errors.invalid(
            field,
            &port.to_string(),
            "must be between 1 and 65535, inclusive",
        );
    }
}

/// Upstream `validateContainers` (common part) for one container.
fn validate_container(field: &str, container: &Container, errors: &mut FieldErrors) {
    if container
        .image
        .as_deref()
        .is_none_or(|i| i.trim().is_empty())
    {
        errors.required(&format!("{field}.image"));
    }
    for (i, port) in container.ports.iter().flatten().enumerate() {
        let port_field = format!("{field}.ports[{i}]");
        validate_port(
            &format!("{port_field}.containerPort"),
            port.container_port,
            errors,
        );
        if let Some(host_port) = port.host_port
            && host_port != 0
        {
            validate_port(&format!("{port_field}.hostPort"), host_port, errors);
        }
        if let Some(protocol) = port.protocol.as_deref()
            && !matches!(protocol, "TCP" | "UDP" | "SCTP")
        {
            errors.not_supported(
                &format!("{port_field}.protocol"),
                protocol,
                &["SCTP", "TCP", "UDP"],
            );
        }
    }
    let mut mount_points = BTreeSet::new();
    for (i, mount) in container.volume_mounts.iter().flatten().enumerate() {
        let mount_field = format!("{field}.volumeMounts[{i}].mountPath");
        if mount.mount_path.is_empty() {
            errors.required(&mount_field);
        } else if !mount_points.insert(mount.mount_path.as_str()) {
            errors.invalid(&mount_field, &quoted(&mount.mount_path), "must be unique");
        }
        // Upstream names these two fields without the mount's index.
        validate_mount_propagation(&format!("{field}.volumeMounts"), container, mount, errors);
        validate_mount_recursive_read_only(&format!("{field}.volumeMounts"), mount, errors);
    }
    validate_resources(field, container, errors);
}

fn validate_tolerations(tolerations: &[Toleration], errors: &mut FieldErrors) {
    for (i, toleration) in tolerations.iter().enumerate() {
        let field = format!("spec.tolerations[{i}]");
        let key = toleration.key.as_deref().unwrap_or_default();
        if !key.is_empty() {
            for problem in qualified_name_problems(key) {
                errors.invalid(&format!("{field}.key"), &quoted(key), &problem);
            }
        }
        let operator = toleration.operator.as_deref().unwrap_or_default();
        let value = toleration.value.as_deref().unwrap_or_default();
        if key.is_empty() && operator != "Exists" {
            errors.invalid(
                &format!("{field}.operator"),
                &quoted(operator),
                "operator must be Exists when `key` is empty, which means \"match all values \
                 and all keys\"",
            );
        }
        match operator {
            "" | "Equal" => {
                if !value.is_empty() && !label_chars(value) {
                    errors.invalid(
                        &format!("{field}.value"),
                        &quoted(value),
                        "a valid label must be an empty string or consist of alphanumeric \
                         characters, '-', '_' or '.', and must start and end with an \
                         alphanumeric character",
                    );
                }
            }
            "Exists" => {
                if !value.is_empty() {
                    errors.invalid(
                        &format!("{field}.operator"),
                        &quoted(value),
                        "value must be empty when `operator` is 'Exists'",
                    );
                }
            }
            // Lt and Gt need a feature gate that is off by default.
            other => {
                errors.not_supported(&format!("{field}.operator"), other, &["Equal", "Exists"])
            }
        }
        let effect = toleration.effect.as_deref().unwrap_or_default();
        if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            errors.not_supported(
                &format!("{field}.effect"),
                effect,
                &["NoExecute", "NoSchedule", "PreferNoSchedule"],
            );
        }
        if toleration.toleration_seconds.is_some() && effect != "NoExecute" {
            errors.invalid(
                &format!("{field}.effect"),
                &quoted(effect),
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            );
        }
    }
}

/// The volume sources, in the order upstream's `validateVolumeSource` checks them.
const VOLUME_SOURCES: &[&str] = &[
    "emptyDir",
    "hostPath",
    "gitRepo",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "flocker",
    "persistentVolumeClaim",
    "rbd",
    "quobyte",
    "cinder",
    "cephfs",
    "downwardAPI",
    "fc",
    "flexVolume",
    "configMap",
    "azureFile",
    "vsphereVolume",
    "photonPersistentDisk",
    "portworxVolume",
    "azureDisk",
    "storageos",
    "projected",
    "scaleIO",
    "csi",
    "ephemeral",
    "image",
];

const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];

fn validate_volume_source(field: &str, volume: &Volume, errors: &mut FieldErrors) {
    let Ok(Value::Object(fields)) = serde_json::to_value(volume) else {
        return;
    };
    let mut seen = 0;
    for source in VOLUME_SOURCES {
        if fields.contains_key(*source) {
            if seen > 0 {
                errors.forbidden(
                    &format!("{field}.{source}"),
                    "may not specify more than 1 volume type",
                );
            }
            seen += 1;
        }
    }
    if let Some(host_path) = &volume.host_path {
        let type_ = host_path.type_.as_deref().unwrap_or_default();
        if !HOST_PATH_TYPES.contains(&type_) {
            errors.not_supported(&format!("{field}.hostPath.type"), type_, HOST_PATH_TYPES);
        }
    }
}

/// Upstream `ValidatePodCreate`/`ValidatePodSpec`, for what this file checks (admission checks
/// names, keys, paths and modes).
pub fn validate_pod_spec(spec: &PodSpec, create: bool, errors: &mut FieldErrors) {
    if spec.containers.is_empty() {
        errors.required("spec.containers");
    }
    for (i, container) in spec.containers.iter().enumerate() {
        validate_container(&format!("spec.containers[{i}]"), container, errors);
    }
    for (i, container) in spec.init_containers.iter().flatten().enumerate() {
        validate_container(&format!("spec.initContainers[{i}]"), container, errors);
    }
    if create
        && spec
            .ephemeral_containers
            .as_ref()
            .is_some_and(|e| !e.is_empty())
    {
        errors.forbidden("spec.ephemeralContainers", "cannot be set on create");
    }
    if let Some(policy) = spec.restart_policy.as_deref()
        && !matches!(policy, "Always" | "OnFailure" | "Never")
    {
        errors.not_supported(
            "spec.restartPolicy",
            policy,
            &["Always", "OnFailure", "Never"],
        );
    }
    validate_tolerations(spec.tolerations.as_deref().unwrap_or_default(), errors);
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        validate_volume_source(&format!("spec.volumes[{i}]"), volume, errors);
    }
    validate_pod_host_name(spec, errors);
}

/// Upstream `validatePodHostName`: `spec.hostnameOverride` is an RFC 1123 subdomain of at most
/// 64 characters, and neither `setHostnameAsFQDN` nor `hostNetwork` comes with it.
fn validate_pod_host_name(spec: &PodSpec, errors: &mut FieldErrors) {
    const FIELD: &str = "spec.hostnameOverride";
    let Some(hostname) = spec.hostname_override.as_deref() else {
        return;
    };
    if spec.set_hostname_as_fqdn == Some(true) {
        errors.forbidden(FIELD, "may not be specified when setHostnameAsFQDN is true");
    }
    if spec.host_network == Some(true) {
        errors.forbidden(FIELD, "may not be specified when hostNetwork is true");
    }
    if hostname.len() > 64 {
        errors.push(FIELD, "Too long", "may not be more than 64 bytes");
    }
    for problem in rustlet_core::names::dns1123_subdomain_problems(hostname) {
        errors.invalid(FIELD, &quoted(hostname), &problem);
    }
}

/// Upstream `ValidateSecret`'s per-type rules.
pub fn validate_secret_type(
    type_: &str,
    data: &BTreeMap<String, ByteString>,
    annotations: Option<&BTreeMap<String, String>>,
    errors: &mut FieldErrors,
) {
    let has = |key: &str| data.contains_key(key);
    let json_key = |key: &str, errors: &mut FieldErrors| match data.get(key) {
        None => errors.required(&format!("data[{key}]")),
        Some(bytes) => {
            if let Err(e) = serde_json::from_slice::<serde_json::Map<String, Value>>(&bytes.0) {
                errors.invalid(
                    &format!("data[{key}]"),
                    "\"<secret contents redacted>\"",
                    &e.to_string(),
                );
            }
        }
    };
    match type_ {
        "kubernetes.io/service-account-token" => {
            let name = annotations
                .and_then(|a| a.get("kubernetes.io/service-account.name"))
                .map_or("", String::as_str);
            if name.is_empty() {
                errors.required("metadata.annotations[kubernetes.io/service-account.name]");
            }
        }
        "kubernetes.io/dockercfg" => json_key(".dockercfg", errors),
        "kubernetes.io/dockerconfigjson" => json_key(".dockerconfigjson", errors),
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            errors.required("data[username]");
            errors.required("data[password]");
        }
        "kubernetes.io/ssh-auth" if data.get("ssh-privatekey").is_none_or(|v| v.0.is_empty()) => {
            errors.required("data[ssh-privatekey]");
        }
        "kubernetes.io/tls" => {
            for key in ["tls.crt", "tls.key"] {
                if !has(key) {
                    errors.required(&format!("data[{key}]"));
                }
            }
        }
        _ => {}
    }
}

/// The keys of the fields that are maps in the API (a decode error's path shows their keys as
/// `[key]`, as upstream's field paths do).
const MAP_FIELDS: &[&str] = &[
    "data",
    "binaryData",
    "stringData",
    "labels",
    "annotations",
    "nodeSelector",
    "limits",
    "requests",
    "capacity",
    "allocatable",
    "overhead",
];

/// A decode error's path in upstream's style: `spec.containers[0].ports[0].containerPort`,
/// `data[tls.crt]`.
pub fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    let mut previous: Option<String> = None;
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => {
                if previous.as_deref().is_some_and(|p| MAP_FIELDS.contains(&p)) {
                    out.push_str(&format!("[{key}]"));
                } else {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                }
                previous = Some(key.clone());
                continue;
            }
            Segment::Enum { variant } => out.push_str(&format!(".{variant}")),
            Segment::Unknown => out.push_str(".?"),
        }
        previous = None;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn base64_problems_name_the_character() {
        assert_eq!(base64_problem("aGVsbG8="), None);
        assert_eq!(base64_problem(""), None);
        assert_eq!(
            base64_problem("aGV.bG8="),
            Some("illegal base64 data: character '.' at offset 3".into())
        );
        assert!(base64_problem("aGVsbG8").is_some(), "unpadded");
    }

    /// Issue 24 item 1: a manifest's own UID names the pod's directories: a UUID and the
    /// other short names of `[A-Za-z0-9._-]` pass, `..`, `/`, NUL and the rest are named.
    #[test]
    fn a_manifest_uid_must_be_one_safe_path_component() {
        let check = |uid: &str| {
            let mut errors = FieldErrors::default();
            validate_metadata(&serde_json::json!({ "uid": uid }), &mut errors);
            errors.0
        };
        for uid in [
            "6d1a5e36-0c4b-4c59-9a43-5a2f0f1c7d01",
            "p",
            "uid_1.a",
            "",
            "...",
        ] {
            assert!(check(uid).is_empty(), "{uid:?}: {:?}", check(uid));
        }
        assert_eq!(
            check(".."),
            [
                "metadata.uid: Invalid value: \"..\": it is `.` or `..` (a UID names the \
              object's directories; a UUID is always accepted)"
            ]
        );
        for uid in ["a/b", "a\0b", "é", "a b", &"a".repeat(UID_MAX + 1)] {
            let errors = check(uid);
            assert_eq!(errors.len(), 1, "{uid:?}: {errors:?}");
            assert!(
                errors[0].starts_with("metadata.uid: Invalid value: "),
                "{errors:?}"
            );
        }
    }

    /// Upstream e2e "Override hostname of Pod" "a pod with setHostnameAsFQDN and
    /// hostnameOverride fields will fail to be created", "a pod with hostNetwork and
    /// hostnameOverride fields ..." and "a pod with non-RFC1123 subdomain string for
    /// hostnameOverride field ..." (upstream `validatePodHostName`), in local mode.
    #[test]
    fn a_pod_with_hostname_override_and_fqdn_host_network_or_a_bad_name_is_refused() {
        let check = |json: serde_json::Value| {
            let mut spec: PodSpec = serde_json::from_value(json).unwrap();
            spec.containers = vec![Container {
                name: "c".into(),
                image: Some("busybox".into()),
                ..Container::default()
            }];
            let mut errors = FieldErrors::default();
            validate_pod_spec(&spec, true, &mut errors);
            errors.0
        };
        assert!(
            check(
                serde_json::json!({"hostnameOverride": "override.example.host",
                                          "hostname": "h", "subdomain": "t"})
            )
            .is_empty()
        );
        assert_eq!(
            check(serde_json::json!({"hostnameOverride": "override-host",
                                     "setHostnameAsFQDN": true})),
            [
                "spec.hostnameOverride: Forbidden: may not be specified when setHostnameAsFQDN \
              is true"
            ]
        );
        assert_eq!(
            check(serde_json::json!({"hostnameOverride": "override-host", "hostNetwork": true})),
            ["spec.hostnameOverride: Forbidden: may not be specified when hostNetwork is true"]
        );
        let errors = check(serde_json::json!({"hostnameOverride": "Not-RFC1123"}));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(
                "spec.hostnameOverride: Invalid value: \"Not-RFC1123\": a lowercase RFC 1123 \
                 subdomain must consist of"
            ),
            "{errors:?}"
        );
        assert_eq!(
            check(serde_json::json!({"hostnameOverride": "a".repeat(65)})),
            ["spec.hostnameOverride: Too long: may not be more than 64 bytes"]
        );
    }

    proptest! {
        /// Upstream's subdomain rule: any length up to 253 in all, no per-part limit.
        #[test]
        fn subdomains_up_to_253_characters(len in 1usize..300) {
            let name = "a".repeat(len);
            prop_assert_eq!(is_dns_subdomain(&name), len <= 253);
        }

        /// Label values: up to 63 characters of the label alphabet.
        #[test]
        fn label_values(value in "[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,70}[a-zA-Z0-9])?") {
            let mut errors = FieldErrors::default();
            validate_metadata(&serde_json::json!({"labels": {"k": value}}), &mut errors);
            prop_assert_eq!(errors.0.is_empty(), value.len() <= 63, "{:?}", errors.0);
        }

        /// Label keys: a name part of up to 63 characters, with an optional subdomain prefix.
        #[test]
        fn label_keys(prefix in proptest::option::of("[a-z0-9]{1,10}(\\.[a-z0-9]{1,10}){0,2}"), name in "[a-zA-Z0-9]{1,70}") {
            let key = match &prefix { Some(p) => format!("{p}/{name}"), None => name.clone() };
            prop_assert_eq!(qualified_name_problems(&key).is_empty(), name.len() <= 63);
        }
    }
}
