//! The API's name formats that the node checks again, with upstream's messages (apimachinery
//! `validation.IsDNS1123Label`, `IsDNS1123Subdomain`).

/// Upstream `DNS1123LabelMaxLength`.
pub const DNS1123_LABEL_MAX: usize = 63;
/// Upstream `DNS1123SubdomainMaxLength`.
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;

const LABEL_FORMAT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
     characters or '-', and must start and end with an alphanumeric character";
const SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
     alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

fn label_shape(value: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    value.starts_with(alnum)
        && value.ends_with(alnum)
        && value.chars().all(|c| alnum(c) || c == '-')
}

fn subdomain_shape(value: &str) -> bool {
    value.split('.').all(label_shape)
}

/// Upstream `MaxLenError`.
fn max_len(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// Upstream `IsDNS1123Label`: what is wrong with `value` as an RFC 1123 label (at most 63
/// lowercase alphanumerics or `-`, starting and ending alphanumeric); empty when nothing.
pub fn dns1123_label_problems(value: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if value.len() > DNS1123_LABEL_MAX {
        problems.push(max_len(DNS1123_LABEL_MAX));
    }
    if !label_shape(value) {
        problems.push(if subdomain_shape(value) {
            "must not contain dots".to_owned()
        } else {
            format!(
                "{LABEL_MESSAGE} (e.g. 'my-name',  or '123-abc', regex used for validation is \
                 '{LABEL_FORMAT}')"
            )
        });
    }
    problems
}

/// Upstream `IsDNS1123Subdomain`: what is wrong with `value` as an RFC 1123 subdomain (at most
/// 253 characters in all, of dot-separated labels without a per-label limit); empty when
/// nothing.
pub fn dns1123_subdomain_problems(value: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        problems.push(max_len(DNS1123_SUBDOMAIN_MAX));
    }
    if !subdomain_shape(value) {
        problems.push(format!(
            "{SUBDOMAIN_MESSAGE} (e.g. 'example.com', regex used for validation is \
             '{LABEL_FORMAT}(\\.{LABEL_FORMAT})*')"
        ));
    }
    problems
}

/// Whether `value` is an RFC 1123 label ([`dns1123_label_problems`] finds nothing).
pub fn is_dns1123_label(value: &str) -> bool {
    value.len() <= DNS1123_LABEL_MAX && label_shape(value)
}

/// Whether `value` is an RFC 1123 subdomain ([`dns1123_subdomain_problems`] finds nothing).
pub fn is_dns1123_subdomain(value: &str) -> bool {
    value.len() <= DNS1123_SUBDOMAIN_MAX && subdomain_shape(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains_as_upstream() {
        for good in ["a", "ab-c", "0", "a".repeat(63).as_str()] {
            assert!(is_dns1123_label(good), "{good}");
            assert!(dns1123_label_problems(good).is_empty(), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "a".repeat(64).as_str()] {
            assert!(!is_dns1123_label(bad), "{bad}");
            assert!(!dns1123_label_problems(bad).is_empty(), "{bad}");
        }
        for good in [
            "override.example.host",
            "a",
            "a-b.c",
            "a".repeat(253).as_str(),
        ] {
            assert!(is_dns1123_subdomain(good), "{good}");
            assert!(dns1123_subdomain_problems(good).is_empty(), "{good}");
        }
        for bad in [
            "",
            "Not-RFC1123",
            "a..b",
            ".a",
            "a.",
            "a.-b",
            "a".repeat(254).as_str(),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
            assert!(!dns1123_subdomain_problems(bad).is_empty(), "{bad}");
        }
    }

    #[test]
    fn the_messages_are_upstreams() {
        assert_eq!(
            dns1123_label_problems(&"a".repeat(64)),
            ["must be no more than 63 characters"]
        );
        assert_eq!(dns1123_label_problems("a.b"), ["must not contain dots"]);
        assert_eq!(
            dns1123_subdomain_problems("Not-RFC1123"),
            [
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
                 characters, '-' or '.', and must start and end with an alphanumeric character \
                 (e.g. 'example.com', regex used for validation is \
                 '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
    }
}
