//! Mapping lease names to Kubernetes object names; see [`object_name`].

use sha2::{Digest, Sha256};

/// The annotation holding the original lease name on every object this crate creates.
pub const LEASE_NAME_ANNOTATION: &str = "actix-coordination/lease-name";

/// The longest Kubernetes object name (a DNS-1123 subdomain).
pub(crate) const MAX_OBJECT_NAME_LEN: usize = 253;

/// Hex digits of the SHA-256 digest appended to a mapped name (64 bits).
const HASH_HEX_LEN: usize = 16;

/// Whether `name` is a valid DNS-1123 subdomain, usable as a Kubernetes object name as is.
pub fn is_valid_object_name(name: &str) -> bool {
    if name.is_empty() || name.len() > MAX_OBJECT_NAME_LEN {
        return false;
    }
    name.split('.').all(|label| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-'
    })
}

/// The Kubernetes object name of lease `name`.
///
/// A `Lease` object's name must be a DNS-1123 subdomain: at most 253 characters of lowercase ASCII
/// letters, digits, `-` and `.`, in dot-separated labels that each start and end with a letter or
/// a digit. A lease name that already is one is used as is. Any other name is mapped to
///
/// ```text
/// <sanitized prefix>-<first 16 hex digits of SHA-256(full lease name)>
/// ```
///
/// where the prefix is the name lowercased, with every run of characters other than `a-z0-9`
/// replaced by one `-`, trimmed of `-` at both ends and cut so that the whole stays within 253
/// characters (`lease` when nothing readable is left). The hash covers the *full* original name,
/// so two names that sanitize alike (`Jobs/Leader`, `jobs:leader`) or share a long prefix still get
/// different objects, and the mapping is stable across processes and versions of this crate.
/// A mapped name is itself valid, so mapping is idempotent.
///
/// Every object also carries the original name in the annotation [`LEASE_NAME_ANNOTATION`]; the
/// backend refuses to use an object whose annotation names another lease (a valid name chosen to
/// look exactly like another name's mapping), so two lease names never share an object.
pub fn object_name(name: &str) -> String {
    if is_valid_object_name(name) {
        return name.to_owned();
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest
        .iter()
        .take(HASH_HEX_LEN / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut prefix = String::with_capacity(name.len().min(MAX_OBJECT_NAME_LEN));
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            prefix.push(c);
        } else if !prefix.is_empty() && !prefix.ends_with('-') {
            prefix.push('-');
        }
    }
    prefix.truncate(MAX_OBJECT_NAME_LEN - 1 - HASH_HEX_LEN);
    let prefix = prefix.trim_end_matches('-');
    let prefix = if prefix.is_empty() { "lease" } else { prefix };
    format!("{prefix}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_are_kept() {
        for name in [
            "a",
            "jobs",
            "my-lease.v2",
            "0abc-9",
            "a.b.c",
            &"x".repeat(MAX_OBJECT_NAME_LEN),
        ] {
            assert!(is_valid_object_name(name), "{name}");
            assert_eq!(object_name(name), name);
        }
    }

    #[test]
    fn invalid_names_are_recognised() {
        for name in [
            "",
            "Jobs",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a.-b",
            "a_b",
            "a/b",
            "é",
            "a b",
            &"x".repeat(MAX_OBJECT_NAME_LEN + 1),
        ] {
            assert!(!is_valid_object_name(name), "{name:?}");
        }
    }

    #[test]
    fn names_that_sanitize_alike_get_distinct_objects() {
        let names = [
            "Jobs/Leader",
            "jobs:leader",
            "jobs leader",
            "JOBS_LEADER",
            "jobs--leader-",
            "jobs.-leader",
        ];
        let mapped: Vec<String> = names.iter().map(|n| object_name(n)).collect();
        for (i, m) in mapped.iter().enumerate() {
            assert!(is_valid_object_name(m), "{m}");
            assert!(m.starts_with("jobs-leader-"), "readable prefix kept: {m}");
            for other in &mapped[i + 1..] {
                assert_ne!(m, other);
            }
        }
    }

    #[test]
    fn long_names_are_cut_but_stay_distinct() {
        let base = "a".repeat(400);
        let one = object_name(&format!("{base}1"));
        let two = object_name(&format!("{base}2"));
        for m in [&one, &two] {
            assert!(is_valid_object_name(m), "{m}");
            assert_eq!(m.len(), MAX_OBJECT_NAME_LEN);
        }
        assert_ne!(one, two, "the hash covers the full name");
        // A long name of characters that all vanish still maps to something valid.
        let weird = object_name(&"_".repeat(600));
        assert!(is_valid_object_name(&weird), "{weird}");
        assert!(weird.starts_with("lease-"));
        // A cut that lands right after a separator leaves no trailing '-' before the hash.
        let cut = object_name(&format!("{}_{}", "b".repeat(235), "c".repeat(100)));
        assert!(is_valid_object_name(&cut), "{cut}");
    }

    #[test]
    fn mapping_is_stable_and_idempotent() {
        let names = [
            "Jobs/Leader",
            "ünïcödé lease",
            "---",
            "UPPER.case",
            &"Z".repeat(1024),
        ];
        for name in names {
            let mapped = object_name(name);
            assert!(is_valid_object_name(&mapped), "{mapped}");
            assert_eq!(object_name(name), mapped, "stable");
            assert_eq!(object_name(&mapped), mapped, "idempotent");
        }
        // Pinned, so that a change of the mapping (which would split leases across versions)
        // cannot go unnoticed.
        // (`printf 'Jobs/Leader' | sha256sum | cut -c1-16`)
        assert_eq!(object_name("Jobs/Leader"), "jobs-leader-4258851ac722edb3");
        assert_eq!(
            object_name("-Jobs/Leader-"),
            format!(
                "jobs-leader-{}",
                &format!("{:x}", Sha256::digest(b"-Jobs/Leader-"))[..16]
            )
        );
    }
}
