//! The authorization attributes of a request to the kubelet API: the verb from the method, the
//! `nodes` subresources from the path.
//!
//! Upstream: `pkg/kubelet/server/auth.go` `nodeAuthorizerAttributesGetter.GetRequestAttributes`
//! and `isSubpath`, with `KubeletFineGrainedAuthz` on (GA and locked on since 1.36, so there is
//! no switch here): `/pods` and `/runningpods/` try `pods`, `/healthz` `healthz`, `/configz`
//! `configz`, `/statusz` `statusz`, each then `proxy`; `/stats/` is `stats`, `/metrics`
//! `metrics`, `/logs/` `log`, `/checkpoint/` `checkpoint`, everything else `proxy`. The
//! attributes of one request differ only in the subresource; any allow is enough.

/// `apiVersion` of every attribute.
pub const API_VERSION: &str = "v1";
/// `resource` of every attribute.
pub const RESOURCE: &str = "nodes";

const PODS_PATH: &str = "/pods";
const RUNNING_PODS_PATH: &str = "/runningpods/";
const HEALTHZ_PATH: &str = "/healthz";
const CONFIGZ_PATH: &str = "/configz";
const STATUSZ_PATH: &str = "/statusz";
const STATS_PATH: &str = "/stats/";
const METRICS_PATH: &str = "/metrics";
const LOGS_PATH: &str = "/logs/";
const CHECKPOINT_PATH: &str = "/checkpoint/";

/// What a request asks of the node: `verb` on `nodes/<subresource>` named after the node, for
/// each subresource in order (fine-grained first, then the fallback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRequestAttributes {
    /// The API verb (`""` for a method upstream does not map, such as HEAD).
    pub verb: &'static str,
    /// The subresources to try, in order.
    pub subresources: Vec<&'static str>,
    /// The node's name (the attribute's `name`).
    pub node_name: String,
    /// The request's (decoded) path.
    pub path: String,
}

/// Upstream's `isSubpath`: `subpath` is `path` (without its trailing slash) or below it.
pub fn is_subpath(subpath: &str, path: &str) -> bool {
    let path = path.strip_suffix('/').unwrap_or(path);
    subpath == path
        || (subpath.starts_with(path) && subpath.as_bytes().get(path.len()) == Some(&b'/'))
}

/// The API verb of an HTTP method, as upstream maps it.
pub fn api_verb(method: &http::Method) -> &'static str {
    match *method {
        http::Method::POST => "create",
        http::Method::GET => "get",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "",
    }
}

/// The attributes of `method` on `path` (already percent-decoded, as Go's `URL.Path`) for the
/// node `node_name`. Upstream: `GetRequestAttributes`.
pub fn request_attributes(
    node_name: &str,
    method: &http::Method,
    path: &str,
) -> NodeRequestAttributes {
    let mut subresources = Vec::with_capacity(2);
    // The fine-grained subresource first (upstream's order, `runningpods` last).
    if is_subpath(path, PODS_PATH) {
        subresources.push("pods");
    } else if is_subpath(path, HEALTHZ_PATH) {
        subresources.push("healthz");
    } else if is_subpath(path, CONFIGZ_PATH) {
        subresources.push("configz");
    } else if is_subpath(path, STATUSZ_PATH) {
        subresources.push("statusz");
    } else if is_subpath(path, RUNNING_PODS_PATH) {
        subresources.push("pods");
    }
    subresources.push(if is_subpath(path, STATS_PATH) {
        "stats"
    } else if is_subpath(path, METRICS_PATH) {
        "metrics"
    } else if is_subpath(path, LOGS_PATH) {
        // "log" to match the other log subresources (pods/log).
        "log"
    } else if is_subpath(path, CHECKPOINT_PATH) {
        "checkpoint"
    } else {
        "proxy"
    });
    NodeRequestAttributes {
        verb: api_verb(method),
        subresources,
        node_name: node_name.to_owned(),
        path: path.to_owned(),
    }
}

/// Go's `URL.Path` of a request target's path: `%XX` escapes decoded (an invalid escape is
/// kept as it is; Go would have refused the request with 400 before any handler).
pub fn decode_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::Method;

    /// Upstream: `TestIsSubPath`.
    #[test]
    fn test_is_sub_path() {
        let cases = [
            ("empty", "", "", true),
            ("match 1", "foo", "foo", true),
            ("match 2", "/foo", "/foo", true),
            ("match 3", "/foo/", "/foo/", true),
            ("match 4", "/foo/bar", "/foo/bar", true),
            ("subpath of root 1", "/foo", "/", true),
            ("subpath of root 2", "/foo/", "/", true),
            ("subpath of root 3", "/foo/bar", "/", true),
            ("subpath of path 1", "/foo", "/foo", true),
            ("subpath of path 2", "/foo/", "/foo", true),
            ("subpath of path 3", "/foo/bar", "/foo", true),
            ("mismatch 1", "/foo", "/bar", false),
            ("mismatch 2", "/foo", "/foobar", false),
            ("mismatch 3", "/foobar", "/foo", false),
        ];
        for (name, subpath, path, expected) in cases {
            assert_eq!(is_subpath(subpath, path), expected, "{name}");
        }
    }

    const NODE: &str = "test";

    /// Upstream: `AuthzTestCases(fineGrained=true)` (auth_test.go), the path table every
    /// registered route of the kubelet server is in (`TestAuthzCoverage`).
    pub(crate) fn authz_test_paths() -> Vec<(&'static str, Vec<&'static str>)> {
        vec![
            (
                "/attach/{podNamespace}/{podID}/{containerName}",
                vec!["proxy"],
            ),
            (
                "/attach/{podNamespace}/{podID}/{uid}/{containerName}",
                vec!["proxy"],
            ),
            (
                "/checkpoint/{podNamespace}/{podID}/{containerName}",
                vec!["checkpoint"],
            ),
            ("/configz", vec!["configz", "proxy"]),
            ("/statusz", vec!["statusz", "proxy"]),
            (
                "/containerLogs/{podNamespace}/{podID}/{containerName}",
                vec!["proxy"],
            ),
            ("/debug/flags/v", vec!["proxy"]),
            ("/debug/pprof/{subpath:*}", vec!["proxy"]),
            (
                "/exec/{podNamespace}/{podID}/{containerName}",
                vec!["proxy"],
            ),
            (
                "/exec/{podNamespace}/{podID}/{uid}/{containerName}",
                vec!["proxy"],
            ),
            ("/healthz", vec!["healthz", "proxy"]),
            ("/healthz/log", vec!["healthz", "proxy"]),
            ("/healthz/ping", vec!["healthz", "proxy"]),
            ("/healthz/syncloop", vec!["healthz", "proxy"]),
            ("/logs/", vec!["log"]),
            ("/logs/{logpath:*}", vec!["log"]),
            ("/metrics", vec!["metrics"]),
            ("/metrics/slis", vec!["metrics"]),
            ("/metrics/cadvisor", vec!["metrics"]),
            ("/metrics/probes", vec!["metrics"]),
            ("/metrics/resource", vec!["metrics"]),
            ("/pods/", vec!["pods", "proxy"]),
            ("/portForward/{podNamespace}/{podID}", vec!["proxy"]),
            ("/portForward/{podNamespace}/{podID}/{uid}", vec!["proxy"]),
            ("/run/{podNamespace}/{podID}/{containerName}", vec!["proxy"]),
            (
                "/run/{podNamespace}/{podID}/{uid}/{containerName}",
                vec!["proxy"],
            ),
            ("/runningpods/", vec!["pods", "proxy"]),
            ("/stats/", vec!["stats"]),
            ("/stats/summary", vec!["stats"]),
        ]
    }

    pub(crate) const METHODS: [(Method, &str); 5] = [
        (Method::POST, "create"),
        (Method::GET, "get"),
        (Method::PUT, "update"),
        (Method::PATCH, "patch"),
        (Method::DELETE, "delete"),
    ];

    /// Upstream: `TestGetRequestAttributes` (fine-grained, the GA behaviour).
    #[test]
    fn test_get_request_attributes() {
        for (path, subresources) in authz_test_paths() {
            for (method, verb) in METHODS {
                let attrs = request_attributes(NODE, &method, path);
                assert_eq!(
                    attrs,
                    NodeRequestAttributes {
                        verb,
                        subresources: subresources.clone(),
                        node_name: NODE.to_owned(),
                        path: path.to_owned(),
                    },
                    "{method}:{path}"
                );
            }
        }
    }

    /// The paths upstream's table leaves implicit: `/pods` without a slash, `/runningpods`
    /// without one, a path that only starts like a guarded one, an unmapped method.
    #[test]
    fn request_attributes_edges() {
        let subs = |path: &str| request_attributes(NODE, &Method::GET, path).subresources;
        assert_eq!(subs("/pods"), ["pods", "proxy"]);
        assert_eq!(subs("/runningpods"), ["pods", "proxy"]);
        assert_eq!(subs("/podsfoo"), ["proxy"]);
        assert_eq!(subs("/stats"), ["stats"]);
        assert_eq!(subs("/metricsfoo"), ["proxy"]);
        assert_eq!(subs("/logs"), ["log"]);
        assert_eq!(subs("/"), ["proxy"]);
        assert_eq!(request_attributes(NODE, &Method::HEAD, "/pods").verb, "");
    }

    #[test]
    fn decode_path_decodes_escapes_as_go_url_path() {
        assert_eq!(decode_path("/st%61ts/summary"), "/stats/summary");
        assert_eq!(decode_path("/a%2Fb"), "/a/b");
        assert_eq!(decode_path("/bad%zz%4"), "/bad%zz%4");
        assert_eq!(
            request_attributes(NODE, &Method::GET, &decode_path("/st%61ts/summary")).subresources,
            ["stats"]
        );
    }
}
