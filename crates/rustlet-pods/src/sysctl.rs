//! The sysctl admit handler (upstream `pkg/kubelet/sysctl`: `allowlist.go`, `safe_sysctls.go`;
//! `k8s.io/component-helpers/node/util/sysctl` for the namespaces and `NormalizeName`): a pod
//! asking for a sysctl that is neither one of the safe sysctls nor allowed by the kubelet
//! config's `allowedUnsafeSysctls`, or for a sysctl of a namespace it shares with the host, is
//! rejected `SysctlForbidden`. Pure, but for [`read_kernel_version`], which the binary calls
//! once at start.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::Pod;

use crate::admission::Rejection;

/// The reason of a pod rejected for its sysctls (upstream `ForbiddenReason`).
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// The longest sysctl name or pattern (upstream `SysctlMaxLength`).
pub const SYSCTL_MAX_LENGTH: usize = 253;

/// The regex a sysctl pattern must match (upstream `SysctlContainSlashPatternFmt`), for the
/// error message: [`is_valid_sysctl_pattern`] checks it by hand.
pub const SYSCTL_CONTAIN_SLASH_PATTERN_FMT: &str =
    r"([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]";

/// The kernel namespace a sysctl belongs to (upstream `utilsysctl.Namespace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    /// The IPC namespace.
    Ipc,
    /// The network namespace.
    Net,
    /// The UTS namespace.
    Uts,
    /// The user namespace.
    User,
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ipc => "IPC",
            Self::Net => "Net",
            Self::Uts => "UTS",
            Self::User => "User",
        })
    }
}

/// Sysctls known to be namespaced, by exact name (upstream `nameToNamespace`).
const NAME_TO_NAMESPACE: &[(&str, Namespace)] = &[
    ("kernel.domainname", Namespace::Uts),
    ("kernel.sem", Namespace::Ipc),
    ("kernel.shmall", Namespace::Ipc),
    ("kernel.shmmax", Namespace::Ipc),
    ("kernel.shmmni", Namespace::Ipc),
    ("kernel.shm_rmid_forced", Namespace::Ipc),
    // upstream's backward compatibility for `kernel.shm*` and `kernel.msg*`.
    ("kernel.shm", Namespace::Ipc),
    ("kernel.msgmax", Namespace::Ipc),
    ("kernel.msgmnb", Namespace::Ipc),
    ("kernel.msgmni", Namespace::Ipc),
    ("kernel.msg", Namespace::Ipc),
];

/// Sysctl trees known to be namespaced (upstream `prefixToNamespace`), matched with a dot
/// after the prefix.
const PREFIX_TO_NAMESPACE: &[(&str, Namespace)] = &[
    ("net", Namespace::Net),
    ("fs.mqueue", Namespace::Ipc),
    ("user", Namespace::User),
];

/// Upstream `namespaceOf`: the namespace of a sysctl (or of the prefix of a pattern), if it
/// is known to be namespaced.
fn namespace_of(name: &str) -> Option<Namespace> {
    if let Some((_, ns)) = NAME_TO_NAMESPACE.iter().find(|(n, _)| *n == name) {
        return Some(*ns);
    }
    PREFIX_TO_NAMESPACE
        .iter()
        .find(|(p, _)| {
            name.strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .map(|(_, ns)| *ns)
}

/// Upstream `NormalizeName`: a name whose first separator is a slash
/// (`net/ipv4/conf/eno2.100/rp_filter`) has its dots and slashes swapped
/// (`net.ipv4.conf.eno2/100.rp_filter`); any other is returned as is.
pub fn normalize_name(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// Upstream `GetNamespace`: of a sysctl or a pattern, the namespace (`None`: not known to be
/// namespaced), the normalized name up to its first `*`, and whether it had a `*`.
pub fn get_namespace(sysctl: &str) -> (Option<Namespace>, String, bool) {
    let mut name = normalize_name(sysctl);
    let prefixed = match name.find('*') {
        Some(i) => {
            name.truncate(i);
            true
        }
        None => false,
    };
    (namespace_of(&name), name, prefixed)
}

/// Whether `segment` matches upstream's `SysctlSegmentFmt`, `[a-z0-9]([-_a-z0-9]*[a-z0-9])?`.
fn is_segment(segment: &[u8]) -> bool {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match segment {
        [] => false,
        [only] => alnum(only),
        [first, middle @ .., last] => {
            alnum(first)
                && alnum(last)
                && middle.iter().all(|b| alnum(b) || *b == b'-' || *b == b'_')
        }
    }
}

/// Whether `segment` matches upstream's last pattern segment,
/// `([a-z0-9][-_a-z0-9]*)?[a-z0-9*]`.
fn is_pattern_segment(segment: &[u8]) -> bool {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match segment {
        [] => false,
        [only] => alnum(only) || *only == b'*',
        [first, middle @ .., last] => {
            alnum(first)
                && (alnum(last) || *last == b'*')
                && middle.iter().all(|b| alnum(b) || *b == b'-' || *b == b'_')
        }
    }
}

/// Upstream `IsValidSysctlPattern`: at most [`SYSCTL_MAX_LENGTH`] characters matching
/// [`SYSCTL_CONTAIN_SLASH_PATTERN_FMT`] (segments separated by `.` or `/`, the last one may end
/// in `*`).
pub fn is_valid_sysctl_pattern(pattern: &str) -> bool {
    if pattern.len() > SYSCTL_MAX_LENGTH {
        return false;
    }
    let mut segments: Vec<&[u8]> = pattern
        .as_bytes()
        .split(|b| *b == b'.' || *b == b'/')
        .collect();
    let Some(last) = segments.pop() else {
        return false;
    };
    segments.into_iter().all(is_segment) && is_pattern_segment(last)
}

/// A kernel version as upstream's `version.ParseGeneric` reads it: at least two numeric
/// components (`6.18.44` of `6.18.44-fc-v1147`); what follows them is ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelVersion(Vec<u64>);

/// A kernel version that does not parse, or could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KernelVersionError {
    /// Not `<n>.<n>[...]`.
    #[error("could not parse {0:?} as a kernel version")]
    Parse(String),
    /// `/proc/sys/kernel/osrelease` could not be read.
    #[error("failed to read {path}: {source}")]
    Read {
        /// The file.
        path: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

impl FromStr for KernelVersion {
    type Err = KernelVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || KernelVersionError::Parse(s.to_owned());
        let text = s.trim_start();
        let text = text.strip_prefix('v').unwrap_or(text);
        // `[0-9]+(\.[0-9]+)*`: the longest run of digit groups joined by single dots.
        let mut components = Vec::new();
        let mut rest = text;
        loop {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                break;
            }
            let (number, tail) = rest.split_at(digits);
            if components.is_empty() && number.len() > 1 && number.starts_with('0') {
                return Err(bad());
            }
            components.push(number.parse::<u64>().map_err(|_| bad())?);
            match tail.strip_prefix('.') {
                Some(next) if next.starts_with(|c: char| c.is_ascii_digit()) => rest = next,
                _ => break,
            }
        }
        if components.len() < 2 {
            return Err(bad());
        }
        Ok(Self(components))
    }
}

impl KernelVersion {
    /// Upstream `Version.AtLeast` of two generic versions: component by component, missing
    /// components counting as zeros.
    pub fn at_least(&self, min: &KernelVersion) -> bool {
        let len = self.0.len().max(min.0.len());
        let component = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
        (0..len)
            .map(|i| component(&self.0, i).cmp(&component(&min.0, i)))
            .find(|o| o.is_ne())
            .is_none_or(|o| o.is_gt())
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// Where upstream's `kernel.GetVersion` reads the running kernel's version.
pub const KERNEL_VERSION_FILE: &str = "/proc/sys/kernel/osrelease";

/// Upstream `kernel.GetVersion`: the running kernel's version, from [`KERNEL_VERSION_FILE`].
pub fn read_kernel_version() -> Result<KernelVersion, KernelVersionError> {
    let text = std::fs::read_to_string(KERNEL_VERSION_FILE).map_err(|source| {
        KernelVersionError::Read {
            path: KERNEL_VERSION_FILE,
            source,
        }
    })?;
    text.trim().parse()
}

/// Upstream `safeSysctls`: each safe sysctl and the kernel version from which it is
/// namespaced (`None`: always).
const SAFE_SYSCTLS: &[(&str, Option<&str>)] = &[
    ("kernel.shm_rmid_forced", None),
    ("net.ipv4.ip_local_port_range", None),
    ("net.ipv4.tcp_syncookies", None),
    ("net.ipv4.ping_group_range", None),
    ("net.ipv4.ip_unprivileged_port_start", None),
    ("net.ipv4.ip_local_reserved_ports", Some("3.16")),
    ("net.ipv4.tcp_keepalive_time", Some("4.5")),
    ("net.ipv4.tcp_fin_timeout", Some("4.6")),
    ("net.ipv4.tcp_keepalive_intvl", Some("4.5")),
    ("net.ipv4.tcp_keepalive_probes", Some("4.5")),
    ("net.ipv4.tcp_rmem", Some("4.15")),
    ("net.ipv4.tcp_wmem", Some("4.15")),
    ("net.ipv4.tcp_slow_start_after_idle", Some("4.15")),
    ("net.ipv4.tcp_notsent_lowat", Some("4.6")),
];

/// Upstream `getSafeSysctlAllowlist`: the safe sysctls available on a kernel of this version
/// (`None`: unknown, only those with no kernel condition), in upstream's order.
pub fn safe_sysctl_allowlist(kernel: Option<&KernelVersion>) -> Vec<&'static str> {
    SAFE_SYSCTLS
        .iter()
        .filter(|(_, min)| match min {
            None => true,
            Some(min) => kernel.is_some_and(|k| {
                min.parse::<KernelVersion>()
                    .is_ok_and(|min| k.at_least(&min))
            }),
        })
        .map(|(name, _)| *name)
        .collect()
}

/// A pattern the allowlist refuses (upstream `NewAllowlist`'s errors).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    /// Not a sysctl name or pattern.
    #[error(
        "sysctl {0:?} must have at most {SYSCTL_MAX_LENGTH} characters and match regex {SYSCTL_CONTAIN_SLASH_PATTERN_FMT}"
    )]
    Invalid(String),
    /// Not known to be namespaced (so it would change the node for every pod).
    #[error("the sysctls {0:?} are not known to be namespaced")]
    NotNamespaced(String),
}

/// The sysctls a pod may ask for (upstream `patternAllowlist`): exact names and prefixes (of
/// patterns ending in `*`), each with its namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    sysctls: BTreeMap<String, Namespace>,
    prefixes: BTreeMap<String, Namespace>,
}

impl Allowlist {
    /// Upstream `NewAllowlist`: from sysctl names and patterns ending in `*`, each valid and
    /// known to be namespaced.
    pub fn new<I>(patterns: I) -> Result<Self, AllowlistError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut list = Self::default();
        for pattern in patterns {
            let pattern = pattern.as_ref();
            if !is_valid_sysctl_pattern(pattern) {
                return Err(AllowlistError::Invalid(pattern.to_owned()));
            }
            let (ns, name, prefixed) = get_namespace(pattern);
            let Some(ns) = ns else {
                return Err(AllowlistError::NotNamespaced(name));
            };
            if prefixed {
                list.prefixes.insert(name, ns);
            } else {
                list.sysctls.insert(name, ns);
            }
        }
        Ok(list)
    }

    /// Upstream `validateSysctl`: whether a pod sharing the host's network, IPC or user
    /// namespace as said may set this sysctl; the error is the rejection's message after
    /// "forbidden sysctl: ".
    fn validate_sysctl(
        &self,
        sysctl: &str,
        host_net: bool,
        host_ipc: bool,
        host_users: bool,
    ) -> Result<(), String> {
        let sysctl = normalize_name(sysctl);
        let ns = self.sysctls.get(&sysctl).or_else(|| {
            self.prefixes
                .iter()
                .find(|(prefix, _)| sysctl.starts_with(prefix.as_str()))
                .map(|(_, ns)| ns)
        });
        let Some(&ns) = ns else {
            return Err(format!("{sysctl:?} not allowlisted"));
        };
        let shared = match ns {
            Namespace::Ipc => host_ipc,
            Namespace::Net => host_net,
            Namespace::User => host_users,
            Namespace::Uts => false,
        };
        if shared {
            return Err(format!("{sysctl:?} not allowed with host {ns} enabled"));
        }
        Ok(())
    }

    /// Upstream `patternAllowlist.Admit`: the first of the pod's sysctls it may not set
    /// rejects it `SysctlForbidden`.
    pub fn admit(&self, pod: &Pod) -> Option<Rejection> {
        let spec = pod.spec.as_ref()?;
        let sysctls = spec.security_context.as_ref()?.sysctls.as_ref()?;
        // A pod without `hostUsers` shares the host's user namespace.
        let host_users = spec.host_users.unwrap_or(true);
        sysctls.iter().find_map(|s| {
            self.validate_sysctl(
                &s.name,
                spec.host_network.unwrap_or(false),
                spec.host_ipc.unwrap_or(false),
                host_users,
            )
            .err()
            .map(|e| Rejection {
                reason: FORBIDDEN_REASON,
                message: format!("forbidden sysctl: {e}"),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(text: &str) -> KernelVersion {
        text.parse().unwrap()
    }

    fn with_safe(extra: &[&str]) -> Vec<String> {
        safe_sysctl_allowlist(Some(&kernel("6.1.0")))
            .into_iter()
            .chain(extra.iter().copied())
            .map(str::to_owned)
            .collect()
    }

    /// Upstream `TestNewAllowlist`: valid patterns with dots or slashes; leading or trailing
    /// spaces, a bad segment, a `*` not at the end and a sysctl not known to be namespaced
    /// are refused.
    #[test]
    fn test_new_allowlist() {
        for ok in [
            &["kernel.msg*", "kernel.sem"][..],
            &["kernel/msg*", "kernel/sem"],
        ] {
            assert!(Allowlist::new(with_safe(ok)).is_ok(), "{ok:?}");
        }
        for bad in [
            " kernel.msg*",
            "kernel.msg* ",
            "net.-",
            "net.*.foo",
            "net.*/foo",
            "foo",
            "foo*",
        ] {
            assert!(Allowlist::new(with_safe(&[bad])).is_err(), "{bad:?}");
        }
        assert_eq!(
            Allowlist::new(["foo*"]).unwrap_err().to_string(),
            r#"the sysctls "foo" are not known to be namespaced"#
        );
        assert_eq!(
            Allowlist::new(["net.*.foo"]).unwrap_err().to_string(),
            r#"sysctl "net.*.foo" must have at most 253 characters and match regex ([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]"#
        );
    }

    fn pod(sysctls: &[&str], host_net: bool, host_ipc: bool, host_users: Option<bool>) -> Pod {
        let sysctls: Vec<_> = sysctls
            .iter()
            .map(|n| serde_json::json!({"name": n, "value": "1"}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"hostNetwork": host_net, "hostIPC": host_ipc, "hostUsers": host_users,
                     "securityContext": {"sysctls": sysctls},
                     "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .unwrap()
    }

    /// Upstream `TestAllowlist`: with the safe sysctls and `kernel.msg*`, `kernel.sem`,
    /// `net.b.*`, `user.*`, what is allowlisted is admitted (unless its namespace is the
    /// host's), and anything else is not.
    #[test]
    fn test_allowlist() {
        let w = Allowlist::new(with_safe(&[
            "kernel.msg*",
            "kernel.sem",
            "net.b.*",
            "user.*",
        ]))
        .unwrap();
        // (sysctl, hostNetwork, hostIPC, hostUsers)
        let valid = [
            ("kernel.shm_rmid_forced", false, false, false),
            ("kernel/shm_rmid_forced", false, false, false),
            ("net.ipv4.ip_local_port_range", false, false, false),
            ("kernel.msgmax", false, false, false),
            ("kernel.sem", false, false, false),
            ("kernel/sem", false, false, false),
            ("user.max_user_namespaces", false, false, false),
        ];
        let invalid = [
            ("kernel.shm_rmid_forced", false, true, false),
            ("net.ipv4.ip_local_port_range", true, false, false),
            ("user.max_user_namespaces", false, false, true),
            ("foo", false, false, false),
            ("net.a.b.c", false, false, false),
            ("net.ipv4.ip_local_port_range.a.b.c", false, false, false),
            ("kernel.msgmax", false, true, false),
            ("kernel.sem", false, true, false),
            ("net.b.c", true, false, false),
        ];
        for (name, net, ipc, users) in valid {
            assert_eq!(w.validate_sysctl(name, net, ipc, users), Ok(()), "{name}");
            assert_eq!(
                w.admit(&pod(&[name], net, ipc, Some(users))),
                None,
                "{name}"
            );
        }
        for (name, net, ipc, users) in invalid {
            assert!(w.validate_sysctl(name, net, ipc, users).is_err(), "{name}");
            let rejection = w.admit(&pod(&[name], net, ipc, Some(users)));
            assert_eq!(
                rejection.map(|r| r.reason),
                Some(FORBIDDEN_REASON),
                "{name}"
            );
        }
        assert_eq!(w.admit(&pod(&[], false, false, Some(false))), None);
        // A pod without `hostUsers` shares the host's user namespace.
        assert!(
            w.admit(&pod(&["user.max_user_namespaces"], false, false, None))
                .is_some()
        );
    }

    /// Upstream e2e "Sysctls [LinuxOnly] should not launch unsafe, but not explicitly enabled
    /// sysctls on the node": `kernel.msgmax` with only the safe sysctls is rejected with
    /// upstream's message; a net sysctl of a host-network pod with upstream's `nsErrorFmt`.
    #[test]
    fn should_not_launch_unsafe_but_not_explicitly_enabled_sysctls_on_the_node() {
        let w = Allowlist::new(safe_sysctl_allowlist(None)).unwrap();
        assert_eq!(
            w.admit(&pod(&["kernel.msgmax"], false, false, None)),
            Some(Rejection {
                reason: "SysctlForbidden",
                message: r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#.to_owned(),
            })
        );
        assert_eq!(
            w.admit(&pod(&["net/ipv4/ip_local_port_range"], true, false, None))
                .map(|r| r.message),
            Some(
                r#"forbidden sysctl: "net.ipv4.ip_local_port_range" not allowed with host Net enabled"#
                    .to_owned()
            )
        );
        assert_eq!(
            w.admit(&pod(&["kernel/shm_rmid_forced"], false, false, None)),
            None
        );
    }

    /// Upstream `Test_getSafeSysctlAllowlist`: an unknown kernel gets only the unconditional
    /// safe sysctls; 3.18 adds `ip_local_reserved_ports`; 5.15 gets them all.
    #[test]
    fn test_get_safe_sysctl_allowlist() {
        let base = [
            "kernel.shm_rmid_forced",
            "net.ipv4.ip_local_port_range",
            "net.ipv4.tcp_syncookies",
            "net.ipv4.ping_group_range",
            "net.ipv4.ip_unprivileged_port_start",
        ];
        assert_eq!(safe_sysctl_allowlist(None), base);
        let mut v318 = base.to_vec();
        v318.push("net.ipv4.ip_local_reserved_ports");
        assert_eq!(
            safe_sysctl_allowlist(Some(&kernel("3.18.0-957.27.2.el7.x86_64"))),
            v318
        );
        let mut all = v318.clone();
        all.extend([
            "net.ipv4.tcp_keepalive_time",
            "net.ipv4.tcp_fin_timeout",
            "net.ipv4.tcp_keepalive_intvl",
            "net.ipv4.tcp_keepalive_probes",
            "net.ipv4.tcp_rmem",
            "net.ipv4.tcp_wmem",
            "net.ipv4.tcp_slow_start_after_idle",
            "net.ipv4.tcp_notsent_lowat",
        ]);
        assert_eq!(
            safe_sysctl_allowlist(Some(&kernel("5.15.0-75-generic"))),
            all
        );
        // 4.5 has the keepalive ones but not `tcp_fin_timeout` (4.6).
        let v45 = safe_sysctl_allowlist(Some(&kernel("4.5")));
        assert!(v45.contains(&"net.ipv4.tcp_keepalive_time"));
        assert!(!v45.contains(&"net.ipv4.tcp_fin_timeout"));
    }

    /// Upstream `version.ParseGeneric` as `kernel.GetVersion` uses it, and `AtLeast`.
    #[test]
    fn kernel_versions_parse_as_parse_generic() {
        assert_eq!(kernel("6.18.44-fc-v1147").to_string(), "6.18.44");
        assert_eq!(kernel(" v5.4").to_string(), "5.4");
        assert_eq!(kernel("5.4.0.").to_string(), "5.4.0");
        for bad in ["6", "", "x.1", "01.2", "-1.2"] {
            assert!(bad.parse::<KernelVersion>().is_err(), "{bad:?}");
        }
        assert!(kernel("4.15").at_least(&kernel("4.15.0")));
        assert!(kernel("4.15.1").at_least(&kernel("4.15")));
        assert!(!kernel("4.9.300").at_least(&kernel("4.15")));
        assert!(kernel("10.0").at_least(&kernel("4.15")));
    }

    /// Upstream `TestConvertSysctlVariableToDotsSeparator` (component-helpers'
    /// `NormalizeName`).
    #[test]
    fn test_convert_sysctl_variable_to_dots_separator() {
        for (name, normalized) in [
            ("kernel.shm_rmid_forced", "kernel.shm_rmid_forced"),
            ("kernel/shm_rmid_forced", "kernel.shm_rmid_forced"),
            (
                "net.ipv4.conf.eno2/100.rp_filter",
                "net.ipv4.conf.eno2/100.rp_filter",
            ),
            (
                "net/ipv4/conf/eno2.100/rp_filter",
                "net.ipv4.conf.eno2/100.rp_filter",
            ),
            (
                "net/ipv4/ip_local_port_range",
                "net.ipv4.ip_local_port_range",
            ),
            ("kernel/msgmax", "kernel.msgmax"),
            ("kernel/sem", "kernel.sem"),
        ] {
            assert_eq!(normalize_name(name), normalized, "{name}");
        }
    }

    /// Upstream `TestNamespacedOf` (component-helpers), and `GetNamespace`'s examples.
    #[test]
    fn test_namespaced_of() {
        for (name, ns) in [
            ("kernel.shm_rmid_forced", Some(Namespace::Ipc)),
            ("net.a.b.c", Some(Namespace::Net)),
            ("fs.mqueue.a.b.c", Some(Namespace::Ipc)),
            ("kernel.domainname", Some(Namespace::Uts)),
            ("user.max_user_namespaces", Some(Namespace::User)),
            ("foo", None),
            ("net", None),
        ] {
            assert_eq!(namespace_of(name), ns, "{name}");
        }
        assert_eq!(
            get_namespace("net.ipv6.neigh.*"),
            (Some(Namespace::Net), "net.ipv6.neigh.".to_owned(), true)
        );
        assert_eq!(
            get_namespace("net.ipv6.conf.all.disable_ipv6"),
            (
                Some(Namespace::Net),
                "net.ipv6.conf.all.disable_ipv6".to_owned(),
                false
            )
        );
        assert_eq!(
            get_namespace("kernel/shm*"),
            (Some(Namespace::Ipc), "kernel.shm".to_owned(), true)
        );
        assert_eq!(get_namespace("net*").0, None);
    }
}
