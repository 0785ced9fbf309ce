//! The value of a lease key: its holder, or, after a [`release_to`](crate::Lease::release_to),
//! the preferred next holder.
//!
//! A held key's value is the holder's owner identity, as it always was (peers and operators read
//! it with `etcdctl get`). A release to a preferred holder does not delete the key: it writes
//! `\0preferred-holder\0<window in milliseconds>\0<target>`, still attached to the releasing
//! owner's etcd lease (so it goes when that process does). Owner identities never contain a
//! control character, so no holder's value can be mistaken for a preference.
//!
//! A holder with [metadata](crate::LeaseSettings::metadata) writes `<owner>\0<metadata>`: what
//! precedes the first NUL is the holder (a peer that splits nothing still reads its identity
//! first).
//!
//! A key [handed over](crate::Lease::hand_over) to `<target>` by `<from>` reads
//! `<target>\0\0handed-over-by\0<from>`: held by `<target>`, without metadata (metadata never
//! starts with a control character). No claim writes that form, so a key in an owner's name in
//! that form was written by another owner: the target may take it up as a new tenure.

use std::time::Duration;

/// How a preference value starts.
const TAG: &[u8] = b"\0preferred-holder\0";
/// What follows the target's identity in a handed-over value.
const HANDED: &[u8] = b"\0\0handed-over-by\0";

/// What a key's value says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KeyContent {
    /// Held by this owner.
    Holder(String),
    /// Free, with `target` preferred for `window` after a contender first sees it.
    Preferred {
        /// The preferred next holder.
        target: String,
        /// How long others leave it to `target`.
        window: Duration,
    },
}

impl KeyContent {
    /// Reads a key's value (a malformed preference reads as a holder, which only delays).
    pub(super) fn parse(value: &[u8]) -> Self {
        if let Some(rest) = value.strip_prefix(TAG) {
            let mut parts = rest.splitn(2, |b| *b == 0);
            let window = parts
                .next()
                .and_then(|ms| std::str::from_utf8(ms).ok())
                .and_then(|ms| ms.parse::<u64>().ok());
            let target = parts.next();
            if let (Some(window), Some(target)) = (window, target) {
                return KeyContent::Preferred {
                    target: String::from_utf8_lossy(target).into_owned(),
                    window: Duration::from_millis(window),
                };
            }
        }
        let owner = value.split(|b| *b == 0).next().unwrap_or_default();
        KeyContent::Holder(String::from_utf8_lossy(owner).into_owned())
    }

    /// The value a claim by `owner` writes, with its metadata.
    pub(super) fn held_by(owner: &str, metadata: Option<&str>) -> Vec<u8> {
        let mut value = owner.as_bytes().to_vec();
        if let Some(metadata) = metadata {
            value.push(0);
            value.extend_from_slice(metadata.as_bytes());
        }
        value
    }

    /// The metadata a holder's value carries.
    pub(super) fn metadata(value: &[u8]) -> Option<String> {
        if value.starts_with(TAG) {
            return None;
        }
        let at = value.iter().position(|b| *b == 0)?;
        if value[at..].starts_with(HANDED) {
            return None;
        }
        Some(String::from_utf8_lossy(&value[at + 1..]).into_owned())
    }

    /// The holder a value names; `None` for a preference (the key is free).
    pub(super) fn holder(value: &[u8]) -> Option<String> {
        match Self::parse(value) {
            KeyContent::Holder(holder) => Some(holder),
            KeyContent::Preferred { .. } => None,
        }
    }

    /// The value of a key `from` hands over to `target`.
    pub(super) fn handed(target: &str, from: &str) -> Vec<u8> {
        let mut value = target.as_bytes().to_vec();
        value.extend_from_slice(HANDED);
        value.extend_from_slice(from.as_bytes());
        value
    }

    /// The owner a key was handed over to, if the value is a handover's.
    pub(super) fn handed_to(value: &[u8]) -> Option<String> {
        let at = value.iter().position(|b| *b == 0)?;
        value[at..]
            .starts_with(HANDED)
            .then(|| String::from_utf8_lossy(&value[..at]).into_owned())
    }

    /// The value of a key released to `target`, which others leave to it for `window`.
    pub(super) fn preference(target: &str, window: Duration) -> Vec<u8> {
        let mut value = TAG.to_vec();
        value.extend_from_slice(window.as_millis().to_string().as_bytes());
        value.push(0);
        value.extend_from_slice(target.as_bytes());
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferences_and_holders_round_trip_and_never_mix() {
        let value = KeyContent::preference("node b", Duration::from_millis(3500));
        assert_eq!(
            KeyContent::parse(&value),
            KeyContent::Preferred {
                target: "node b".into(),
                window: Duration::from_millis(3500)
            }
        );
        assert_eq!(KeyContent::holder(&value), None);
        assert_eq!(KeyContent::holder(b"node-a"), Some("node-a".into()));
        let held = KeyContent::held_by("node-a", Some(r#"{"revision":"v2"}"#));
        assert_eq!(KeyContent::holder(&held), Some("node-a".into()));
        assert_eq!(
            KeyContent::metadata(&held).as_deref(),
            Some(r#"{"revision":"v2"}"#)
        );
        assert_eq!(KeyContent::held_by("node-a", None), b"node-a");
        assert_eq!(KeyContent::metadata(b"node-a"), None);
        assert_eq!(KeyContent::metadata(&value), None);
        // Handed over: held by the target, no metadata, and never what a claim writes.
        let handed = KeyContent::handed("node-b", "node-a");
        assert_eq!(KeyContent::holder(&handed), Some("node-b".into()));
        assert_eq!(KeyContent::metadata(&handed), None);
        assert_eq!(KeyContent::handed_to(&handed), Some("node-b".into()));
        assert_eq!(KeyContent::handed_to(b"node-b"), None);
        assert_eq!(KeyContent::handed_to(&held), None);
        assert_eq!(KeyContent::handed_to(&value), None);
        // Malformed: read as a holder (never as free).
        assert_eq!(
            KeyContent::parse(b"\0preferred-holder\0x"),
            KeyContent::Holder(String::new())
        );
    }
}
