//! A planned move in one write ([`Lease::hand_over`](crate::Lease::hand_over)): the holder's
//! compare-and-swap names the target as the holder, and the target takes the object up without a
//! write of its own, when it can prove from its own clock how long the record is valid.
//!
//! # Why the target needs a proof
//!
//! Contenders judge a record's expiry from when they first saw its `resourceVersion` (never from
//! the `renewTime` another machine wrote), so the record handed to the target lasts, for them,
//! at least `leaseDurationSeconds` after it was written. The target must end its tenure no later:
//! it needs an instant of its own monotonic clock *before* the handover was written. The instant
//! it saw the handover is after, and would not do.
//!
//! The handing holder names, in the annotation [`HANDED_OVER_AFTER_ANNOTATION`](super::HANDED_OVER_AFTER_ANNOTATION), a version of an
//! object held by the target that its session's namespace watch had received before it wrote
//! (the newest such version: typically one of the target's own renewals, of a shard's lease or of
//! its member lease). If the target's session wrote that version itself, it knows when it sent
//! that write ([`WriteLog`]): the write landed before the holder saw it, which was before the
//! handover. That send instant is where the target's tenure starts. Anything else (the version is
//! not one of its session's writes, or is too old to leave a useful tenure; the target writes its
//! own metadata; the record is not newer than every tenure this instance had) and the target
//! claims the object with an ordinary compare-and-swap instead, which is always safe: a planned
//! move then costs two writes, as a release and a claim do.
//!
//! The record carries no preference and no holder metadata; the target's first renewal removes
//! the two handover annotations. To client-go it is an ordinary record held by the target.

use std::collections::HashMap;

use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use tokio::time::Instant;

use super::record::{duration_of, handed, handed_after, holder_of, transitions_of};
use super::{KubernetesBackend, KubernetesError};
use crate::settings::LeaseSettings;

/// Objects whose last writes a [`WriteLog`] keeps before it forgets the oldest half.
const MAX_LOGGED_OBJECTS: usize = 8192;

/// When a session sent its latest writes: per object, the two newest `resourceVersion`s its
/// writes produced and when each write was sent. A handover names a version that the handing
/// holder saw moments before; the version before the newest covers a renewal that landed after
/// the holder looked.
#[derive(Debug, Default)]
pub(super) struct WriteLog {
    objects: HashMap<String, [Option<(String, Instant)>; 2]>,
}

impl WriteLog {
    /// The write of `object` sent at `sent` produced `version`.
    pub(super) fn wrote(&mut self, object: &str, version: &str, sent: Instant) {
        if self.objects.len() >= MAX_LOGGED_OBJECTS && !self.objects.contains_key(object) {
            // Forget the objects written longest ago: a proof that old leaves no tenure anyway.
            let mut times: Vec<Instant> = self.objects.values().map(Self::newest).collect();
            times.sort_unstable();
            let cut = times[times.len() / 2];
            self.objects.retain(|_, writes| Self::newest(writes) > cut);
        }
        let writes = self.objects.entry(object.to_owned()).or_default();
        writes[1] = writes[0].take();
        writes[0] = Some((version.to_owned(), sent));
    }

    fn newest(writes: &[Option<(String, Instant)>; 2]) -> Instant {
        writes
            .iter()
            .flatten()
            .map(|(_, sent)| *sent)
            .max()
            .expect("an entry has a write")
    }

    /// When the write that produced `version` of `object` was sent, if it was this session's.
    pub(super) fn sent(&self, object: &str, version: &str) -> Option<Instant> {
        self.objects
            .get(object)?
            .iter()
            .flatten()
            .find(|(v, _)| v == version)
            .map(|(_, sent)| *sent)
    }
}

impl KubernetesBackend {
    /// Where the tenure of `current`, a record handed over to this owner, starts on this
    /// process's clock, if this instance may take it up without a write (see the module docs):
    /// `None` makes the attempt claim it with a compare-and-swap instead.
    pub(super) fn may_take_up(
        &self,
        current: &LeaseObject,
        settings: &LeaseSettings,
    ) -> Option<Instant> {
        if holder_of(current) != Some(settings.owner()) || settings.metadata().is_some() {
            return None;
        }
        let (object, version) = handed_after(current)?;
        // The record must last, for contenders, at least as long as this owner's tenure would.
        if duration_of(current) < settings.ttl() {
            return None;
        }
        {
            let state = self.lock();
            let newer = state
                .highest_token
                .is_none_or(|highest| transitions_of(current) as u64 > highest);
            if !newer || !state.unanswered.is_empty() {
                return None;
            }
        }
        let sent = self.hub.sent(object, version)?;
        // A proof so old that the tenure would end within a renewal interval: claim instead.
        (sent + settings.local_validity() > Instant::now() + settings.renewal_interval())
            .then_some(sent)
    }

    /// The version of an object held by `target` that this session's namespace watch received
    /// last (`(object, resourceVersion)`), while the watch is synced.
    pub(super) fn seen_of(&self, target: &str) -> Option<(String, String)> {
        self.hub.latest_held_by(&self.namespace, target)
    }

    /// `tenure`'s object handed over to `target`, or `None` when it cannot be (this session has
    /// seen no object held by `target`: the caller releases plainly).
    pub(super) fn handed_to(
        &self,
        lease: LeaseObject,
        settings: &LeaseSettings,
        target: &str,
    ) -> Result<Option<LeaseObject>, KubernetesError> {
        let Some((object, version)) = self.seen_of(target) else {
            return Ok(None);
        };
        handed(
            lease,
            settings.owner(),
            target,
            (&object, &version),
            settings.ttl(),
        )
        .map(Some)
        .ok_or_else(|| KubernetesError::InvalidRecord {
            object: self.object.clone(),
            reason: "leaseTransitions cannot grow any more".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::record::{clear_handed, HANDED_OVER_BY_ANNOTATION};
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_log_keeps_the_two_newest_writes_of_an_object() {
        let mut log = WriteLog::default();
        let t0 = Instant::now();
        log.wrote("a", "1", t0);
        log.wrote("a", "2", t0 + Duration::from_secs(1));
        assert_eq!(log.sent("a", "1"), Some(t0));
        log.wrote("a", "3", t0 + Duration::from_secs(2));
        assert_eq!(log.sent("a", "1"), None);
        assert_eq!(log.sent("a", "2"), Some(t0 + Duration::from_secs(1)));
        assert_eq!(log.sent("a", "3"), Some(t0 + Duration::from_secs(2)));
        assert_eq!(log.sent("b", "3"), None, "another object's version");
    }

    #[tokio::test(start_paused = true)]
    async fn the_log_forgets_the_objects_written_longest_ago() {
        let mut log = WriteLog::default();
        let t0 = Instant::now();
        for i in 0..MAX_LOGGED_OBJECTS {
            log.wrote(&format!("o{i}"), "1", t0 + Duration::from_millis(i as u64));
        }
        log.wrote("new", "1", t0 + Duration::from_secs(3600));
        assert!(log.objects.len() <= MAX_LOGGED_OBJECTS / 2 + 1);
        assert!(log.sent("o0", "1").is_none());
        let last = format!("o{}", MAX_LOGGED_OBJECTS - 1);
        assert!(log.sent(&last, "1").is_some());
        assert!(log.sent("new", "1").is_some());
    }

    /// `a`'s object with token 4 handed over to `b`, naming version 17 of `m-b`.
    fn handed_to_b() -> LeaseObject {
        let a_holds = crate::kubernetes::record::tests::object(Some("a"), Some(4));
        handed(a_holds, "a", "b", ("m-b", "17"), Duration::from_secs(15)).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_target_takes_up_only_a_handover_it_can_date_from_its_own_write() {
        let backend = KubernetesBackend::with_client_for_tests("mine");
        let b = LeaseSettings::builder("mine", "b")
            .ttl(Duration::from_secs(15))
            .build()
            .unwrap();
        let record = handed_to_b();
        assert_eq!(backend.may_take_up(&record, &b), None, "no write of m-b@17");
        let sent = Instant::now();
        backend.hub.wrote("m-b", "16", sent);
        assert_eq!(backend.may_take_up(&record, &b), None, "another version");
        backend.hub.wrote("m-b", "17", sent);
        assert_eq!(
            backend.may_take_up(&record, &b),
            Some(sent),
            "valid from its send"
        );
        // Not for another owner, nor one that writes metadata.
        let c = LeaseSettings::new("mine", "c").unwrap();
        assert_eq!(backend.may_take_up(&record, &c), None);
        let with_metadata = b.with_metadata(Some("zone-a".into())).unwrap();
        assert_eq!(backend.may_take_up(&record, &with_metadata), None);
        // Not a record shorter than this owner's TTL: contenders would wait less.
        let longer = b.to_builder().ttl(Duration::from_secs(20)).build().unwrap();
        assert_eq!(backend.may_take_up(&record, &longer), None);
        // Not while a claim of this instance is unanswered (the record may be older).
        backend
            .lock()
            .unanswered
            .push(crate::kubernetes::record::now_micro());
        assert_eq!(backend.may_take_up(&record, &b), None);
        backend.lock().unanswered.clear();
        // Not a record no newer than a tenure this instance had.
        backend.lock().highest_token = Some(5);
        assert_eq!(backend.may_take_up(&record, &b), None);
        backend.lock().highest_token = Some(4);
        assert_eq!(backend.may_take_up(&record, &b), Some(sent));
        // Not once the write is so old that the tenure would end within a renewal interval.
        tokio::time::advance(b.local_validity() - b.renewal_interval()).await;
        assert_eq!(backend.may_take_up(&record, &b), None);
    }

    #[test]
    fn a_handed_record_names_its_target_and_the_version_seen() {
        let lease = LeaseObject {
            spec: Some(LeaseSpec {
                holder_identity: Some("a".into()),
                lease_transitions: Some(4),
                ..LeaseSpec::default()
            }),
            ..LeaseObject::default()
        };
        let handed = handed(lease, "a", "b", ("m-b", "17"), Duration::from_secs(15)).unwrap();
        assert_eq!(holder_of(&handed), Some("b"));
        assert_eq!(transitions_of(&handed), 5);
        assert_eq!(handed_after(&handed), Some(("m-b", "17")));
        let mut renewed = handed.clone();
        clear_handed(&mut renewed);
        assert_eq!(handed_after(&renewed), None);
        // Only a record handed by another owner counts.
        let mut own = handed;
        own.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(HANDED_OVER_BY_ANNOTATION.into(), "b".into());
        assert_eq!(handed_after(&own), None);
    }
}
