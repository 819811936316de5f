//! Downward API values for volumes (upstream `pkg/fieldpath` and `pkg/api/v1/resource`, V94):
//! `fieldRef` (name, namespace, uid, labels, annotations and their subscripted forms) and
//! `resourceFieldRef` (limits and requests of cpu, memory and ephemeral-storage scaled by the
//! divisor, node allocatable when no limit is set). Maps are written as upstream's
//! `FormatMap`: sorted `key="value"` lines, the value quoted as Go's `%q` does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectFieldSelector, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use rustlet_core::quantity::{quantity_ceil, quantity_milli_ceil};

/// Go's `strconv.IsPrint` (= `unicode.IsPrint`): letters, marks, numbers, punctuation and
/// symbols (general categories L, M, N, P, S) and the ASCII space; any other space, format
/// character, control, private-use, surrogate or unassigned code point is not printable.
///
/// Deviation: the categories are those of the `unicode-general-category` crate's Unicode
/// version (16.0); Go's tables follow Go's (15.0.0 up to Go 1.25), so a character first
/// assigned in Unicode 16.0 is written raw here and escaped by such a kubelet.
pub fn go_is_print(c: char) -> bool {
    use unicode_general_category::GeneralCategory as G;
    c == ' '
        || matches!(
            unicode_general_category::get_general_category(c),
            G::UppercaseLetter
                | G::LowercaseLetter
                | G::TitlecaseLetter
                | G::ModifierLetter
                | G::OtherLetter
                | G::NonspacingMark
                | G::SpacingMark
                | G::EnclosingMark
                | G::DecimalNumber
                | G::LetterNumber
                | G::OtherNumber
                | G::ConnectorPunctuation
                | G::DashPunctuation
                | G::OpenPunctuation
                | G::ClosePunctuation
                | G::InitialPunctuation
                | G::FinalPunctuation
                | G::OtherPunctuation
                | G::MathSymbol
                | G::CurrencySymbol
                | G::ModifierSymbol
                | G::OtherSymbol
        )
}

/// Go's `strconv.Quote` (`%q` of a string): `"` and `\` backslashed, printable runes
/// ([`go_is_print`]) as they are, `\a \b \f \n \r \t \v` by name, other runes below
/// U+0080 as `\xNN`, up to U+FFFF as `\uNNNN`, beyond as `\UNNNNNNNN` (upstream:
/// `appendEscapedRune`).
pub fn go_quote(value: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if go_is_print(c) => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x1_0000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// Upstream `FormatMap`: `key="value"` lines, keys sorted, joined by `\n`.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `metadata.labels['key']` → `("metadata.labels", "key")`.
fn subscript(path: &str) -> Option<(&str, &str)> {
    let (field, rest) = path.split_once('[')?;
    let key = rest.strip_suffix(']')?;
    let key = key
        .strip_prefix('\'')
        .and_then(|k| k.strip_suffix('\''))
        .or_else(|| key.strip_prefix('"').and_then(|k| k.strip_suffix('"')))?;
    Some((field, key))
}

/// The value of a `fieldRef` (upstream `ExtractFieldPathAsString`, for what volumes allow).
pub fn field_ref_value(pod: &Pod, selector: &ObjectFieldSelector) -> Result<String, String> {
    let meta = &pod.metadata;
    let path = selector.field_path.as_str();
    if let Some((field, key)) = subscript(path) {
        let map = match field {
            "metadata.labels" => meta.labels.as_ref(),
            "metadata.annotations" => meta.annotations.as_ref(),
            _ => return Err(format!("unsupported fieldPath: {path}")),
        };
        return Ok(map.and_then(|m| m.get(key)).cloned().unwrap_or_default());
    }
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        other => return Err(format!("unsupported fieldPath: {other}")),
    })
}

/// What the node offers when a container sets no limit.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeAllocatable {
    /// CPUs, in thousandths.
    pub cpu_milli: Option<i128>,
    /// Memory in bytes.
    pub memory: Option<i128>,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage: Option<i128>,
}

impl NodeAllocatable {
    /// This host: its CPUs and its memory (`memory`, when the agent knows its allocatable).
    pub fn of_host(memory: Option<u64>) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Self {
            cpu_milli: Some(i128::try_from(cpus).unwrap_or(1) * 1000),
            memory: memory.map(i128::from),
            ephemeral_storage: None,
        }
    }
}

/// The value of a `resourceFieldRef` (upstream `ExtractResourceValueByContainerName`): CPU
/// rounded up in units of the divisor, memory and storage rounded up likewise.
pub fn resource_field_value(
    pod: &Pod,
    selector: &ResourceFieldSelector,
    allocatable: NodeAllocatable,
) -> Result<String, String> {
    let container_name = selector
        .container_name
        .as_deref()
        .ok_or("resourceFieldRef needs a containerName in a volume")?;
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let container = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == container_name)
        .ok_or_else(|| format!("container {container_name:?} not found"))?;
    let resources = container.resources.as_ref();
    let (part, name) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported resource {:?}", selector.resource))?;
    let list = match part {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => return Err(format!("unsupported resource {:?}", selector.resource)),
    };
    let set = list.and_then(|l| l.get(name));
    // upstream `ExtractContainerResourceValue`: a zero divisor is 1. The API server serves an
    // unset one as "0", so a pod from the API always has one.
    let one = Quantity("1".into());
    let divisor = selector
        .divisor
        .as_ref()
        .filter(|d| quantity_milli_ceil(d) != Some(0))
        .unwrap_or(&one);
    let fallback = |value: Option<i128>| {
        // Upstream: an unset limit is node allocatable; an unset request is the limit (or 0).
        if part == "limits" {
            value.ok_or_else(|| format!("no {name} limit and no node allocatable {name} known"))
        } else {
            Ok(0)
        }
    };
    let ceil_div = |value: i128, divisor: i128| -> Result<String, String> {
        if divisor <= 0 {
            return Err(format!("invalid divisor {:?}", divisor));
        }
        Ok(((value + divisor - 1).div_euclid(divisor)).to_string())
    };
    match name {
        "cpu" => {
            let value = match set {
                Some(q) => quantity_milli_ceil(q).ok_or("unparsable quantity")?,
                None => fallback(allocatable.cpu_milli)?,
            };
            ceil_div(
                value,
                quantity_milli_ceil(divisor).ok_or("unparsable divisor")?,
            )
        }
        "memory" | "ephemeral-storage" => {
            let node = if name == "memory" {
                allocatable.memory
            } else {
                allocatable.ephemeral_storage
            };
            let value = match set {
                Some(q) => quantity_ceil(q).ok_or("unparsable quantity")?,
                None => fallback(node)?,
            };
            ceil_div(value, quantity_ceil(divisor).ok_or("unparsable divisor")?)
        }
        other => Err(format!("unsupported resource {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([
                    ("app".into(), "web".into()),
                    ("tier".into(), "front \"end\"\n".into()),
                ])),
                annotations: Some(BTreeMap::from([("builder".into(), "jane".into())])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(BTreeMap::from([
                            ("cpu".into(), Quantity("1500m".into())),
                            ("memory".into(), Quantity("64Mi".into())),
                        ])),
                        requests: Some(BTreeMap::from([("cpu".into(), Quantity("250m".into()))])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn field(path: &str) -> Result<String, String> {
        field_ref_value(
            &pod(),
            &ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            },
        )
    }

    #[test]
    fn field_refs_and_upstreams_map_format() {
        assert_eq!(field("metadata.name").unwrap(), "web");
        assert_eq!(field("metadata.namespace").unwrap(), "ns");
        assert_eq!(field("metadata.uid").unwrap(), "u-1");
        assert_eq!(
            field("metadata.labels").unwrap(),
            "app=\"web\"\ntier=\"front \\\"end\\\"\\n\""
        );
        assert_eq!(field("metadata.annotations").unwrap(), "builder=\"jane\"");
        assert_eq!(field("metadata.labels['app']").unwrap(), "web");
        assert_eq!(field("metadata.annotations['missing']").unwrap(), "");
        assert!(field("spec.nodeName").is_err());
    }

    #[test]
    fn go_quote_escapes_as_go_does() {
        assert_eq!(go_quote("a\tb\u{1}é"), "\"a\\tb\\x01é\"");
        assert_eq!(go_quote("back\\slash"), "\"back\\\\slash\"");
        // Item 19: every rune Go does not consider printable is escaped.
        assert_eq!(go_quote("a\u{a0}b\u{200b}c"), r#""a\u00a0b\u200bc""#);
        assert_eq!(
            go_quote("\u{ad}\u{2028}\u{e000}\u{feff}\u{1f600}\u{e0001}"),
            r#""\u00ad\u2028\ue000\ufeff😀\U000e0001""#
        );
        assert_eq!(go_quote("\u{80}\u{9f}"), r#""\u0080\u009f""#);
    }

    /// Go's `strconv` `TestQuote` (its `quotetests`, but the one with invalid UTF-8, which a
    /// Kubernetes string cannot hold).
    #[test]
    fn test_quote() {
        for (input, want) in [
            ("\u{7}\u{8}\u{c}\r\n\t\u{b}", r#""\a\b\f\r\n\t\v""#),
            ("\\", r#""\\""#),
            ("\u{263a}", "\"☺\""),
            ("\u{10ffff}", r#""\U0010ffff""#),
            ("\u{4}", r#""\x04""#),
            ("!\u{a0}!\u{2000}!\u{3000}!", r#""!\u00a0!\u2000!\u3000!""#),
            ("\u{7f}", r#""\x7f""#),
        ] {
            assert_eq!(go_quote(input), want, "{input:?}");
        }
    }

    /// Upstream `pkg/fieldpath` `TestFormatMap`.
    #[test]
    fn test_format_map() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        // "nil"
        assert_eq!(format_map(None), "");
        // "label"
        let labels = map(&[
            ("beta.kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("kubernetes.io/hostname", "master01"),
            ("kubernetes.io/os", "linux"),
            ("node-role.kubernetes.io/control-plane", "true"),
            ("node-role.kubernetes.io/master", "true"),
        ]);
        assert_eq!(
            format_map(Some(&labels)),
            r#"beta.kubernetes.io/os="linux"
kubernetes.io/arch="amd64"
kubernetes.io/hostname="master01"
kubernetes.io/os="linux"
node-role.kubernetes.io/control-plane="true"
node-role.kubernetes.io/master="true""#
        );
        // "annotation"
        let annotations = map(&[
            (
                "flannel.alpha.coreos.com/backend-data",
                r#"{"VNI":1,"VtepMAC":"ce:f9:c7:a4:de:64"}"#,
            ),
            ("flannel.alpha.coreos.com/backend-type", "vxlan"),
            ("flannel.alpha.coreos.com/kube-subnet-manager", "true"),
            ("flannel.alpha.coreos.com/public-ip", "192.168.19.160"),
            (
                "management.cattle.io/pod-limits",
                r#"{"cpu":"11400m","memory":"7965Mi"}"#,
            ),
            (
                "management.cattle.io/pod-requests",
                r#"{"cpu":"2482m","memory":"7984Mi","pods":"26"}"#,
            ),
            ("node.alpha.kubernetes.io/ttl", "0"),
            (
                "volumes.kubernetes.io/controller-managed-attach-detach",
                "true",
            ),
        ]);
        assert_eq!(
            format_map(Some(&annotations)),
            r#"flannel.alpha.coreos.com/backend-data="{\"VNI\":1,\"VtepMAC\":\"ce:f9:c7:a4:de:64\"}"
flannel.alpha.coreos.com/backend-type="vxlan"
flannel.alpha.coreos.com/kube-subnet-manager="true"
flannel.alpha.coreos.com/public-ip="192.168.19.160"
management.cattle.io/pod-limits="{\"cpu\":\"11400m\",\"memory\":\"7965Mi\"}"
management.cattle.io/pod-requests="{\"cpu\":\"2482m\",\"memory\":\"7984Mi\",\"pods\":\"26\"}"
node.alpha.kubernetes.io/ttl="0"
volumes.kubernetes.io/controller-managed-attach-detach="true""#
        );
    }

    fn resource(resource: &str, divisor: Option<&str>) -> Result<String, String> {
        resource_field_value(
            &pod(),
            &ResourceFieldSelector {
                container_name: Some("c".into()),
                resource: resource.into(),
                divisor: divisor.map(|d| Quantity(d.into())),
            },
            NodeAllocatable {
                cpu_milli: Some(4000),
                memory: Some(1 << 30),
                ephemeral_storage: None,
            },
        )
    }

    #[test]
    fn resource_fields_round_up_by_the_divisor() {
        assert_eq!(
            resource("limits.cpu", None).unwrap(),
            "2",
            "1.5 cores round up"
        );
        assert_eq!(resource("limits.cpu", Some("1m")).unwrap(), "1500");
        assert_eq!(resource("requests.cpu", Some("1m")).unwrap(), "250");
        assert_eq!(resource("limits.memory", Some("1Mi")).unwrap(), "64");
        assert_eq!(resource("limits.memory", None).unwrap(), "67108864");
        assert_eq!(resource("requests.memory", None).unwrap(), "0");
        // The API server serves an unset divisor as "0": upstream takes it as 1 (conformance's
        // Downward API volume specs met `invalid divisor 0`).
        assert_eq!(resource("limits.cpu", Some("0")).unwrap(), "2");
        assert_eq!(resource("limits.memory", Some("0")).unwrap(), "67108864");
        assert!(resource("limits.ephemeral-storage", None).is_err());
        assert!(resource("limits.gpu", None).is_err());
    }
}
