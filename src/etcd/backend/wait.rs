//! How a contender of an etcd lease waits for the key it saw held to change: on the session's
//! group watch when one holds the key (the records it keeps show the key's next version), else
//! on a watch of the key's own.

use std::sync::atomic::Ordering;

use etcd_client::EventType;
use tokio::time::{sleep_until, Instant};

use super::super::group::KeyChange;
use super::super::value::KeyContent;
use super::super::watch::HubEvent;
use super::{EtcdBackend, Handed, KeyNow, Observed};
use crate::settings::LeaseSettings;

impl EtcdBackend {
    /// Waits until the key changed from how the last attempt saw it, or until `not_after`: see
    /// [`LeaseBackend::wait_for_change`].
    pub(super) async fn wait_for_key_change(&self, settings: &LeaseSettings, not_after: Instant) {
        // Left to a preferred holder: try again when that window ends, or when the key changes.
        let deferred = self
            .deferred_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let not_after = deferred.map_or(not_after, |until| until.min(not_after));
        // Without a working watch, try again after the retry delay, not only at `not_after`
        // (which is the caller's whole deadline when it relies on the notification).
        let retry_at = not_after.min(Instant::now() + settings.acquire_retry_delay());
        // The store's revision at which the key was seen held.
        let Some(Observed {
            revision: seen,
            key_revision,
        }) = self.lock_observed().take()
        else {
            tracing::trace!(key = %self.key_lossy(), "no revision seen: waiting for the retry delay");
            return sleep_until(retry_at).await;
        };
        // Where this session watches a group that holds the key (sharded workers do), its
        // records show the key's next version: no watch of the key's own, and no read.
        let in_group = key_revision.and_then(|r| self.inner().wait_for_key(&self.key, r));
        if let Some(in_group) = in_group {
            tokio::select! {
                // `None`: the group watch ended; the key's own watch below.
                change = in_group => if let Some(change) = change {
                    tracing::trace!(key = %self.key_lossy(), ?change, "the group watch saw the key change");
                    self.changes_seen_in_group.fetch_add(1, Ordering::Relaxed);
                    if change == KeyChange::Deleted {
                        self.seen_deleted.store(true, Ordering::Relaxed);
                    }
                    return;
                },
                _ = sleep_until(not_after) => return,
            }
        }
        // The watch starts from "now", not from `seen + 1`: etcd delivers the events of a watch
        // that starts in the past (once anything was written after its start revision) only when
        // its watcher catch-up loop next runs, every 100 ms, so that a release came up to 100 ms
        // late to a contender of a busy store (a planned move of 16 shards: 95 ms per shard). A
        // deletion between `seen` and the watch's start is found by one read, made only when the
        // store was written meanwhile (the watch's creation reports the revision it starts at).
        let wait = async {
            // Puts too: a release to a preferred holder overwrites the key instead of deleting
            // it (claims are the only other puts; renewals do not write the key).
            let Ok(mut watch) = self.inner().watch(self.key.clone(), 0, false).await else {
                return sleep_until(retry_at).await;
            };
            loop {
                match watch.next().await {
                    Some(HubEvent::Created { revision }) if revision > seen => {
                        match self.key_now(settings.owner()).await {
                            Ok(KeyNow::HandedHere(handed)) => {
                                self.seen_handed(handed);
                                return;
                            }
                            Ok(KeyNow::Preferred) => {
                                tracing::trace!(key = %self.key_lossy(), seen, revision, "the key was released to a preferred holder before its watch started");
                                return;
                            }
                            Ok(KeyNow::Absent) => {
                                tracing::trace!(key = %self.key_lossy(), seen, revision, "the key was deleted before its watch started");
                                self.seen_deleted.store(true, Ordering::Relaxed);
                                return;
                            }
                            // Still held by another owner: its deletion comes through the watch.
                            Ok(KeyNow::Held) => {}
                            Err(_) => return sleep_until(retry_at).await,
                        }
                    }
                    Some(HubEvent::Created { .. }) => {}
                    // Deleted (released, expired): try again now, without reading first. Released to
                    // a preferred holder: try again now. Claimed by another owner: wait on.
                    Some(HubEvent::Events(events)) => {
                        let deleted = events.iter().any(|e| e.event_type() == EventType::Delete);
                        if deleted {
                            tracing::trace!(key = %self.key_lossy(), "the key was deleted");
                            self.seen_deleted.store(true, Ordering::Relaxed);
                            return;
                        }
                        let preferred = events.iter().filter_map(|e| e.kv()).find_map(|kv| {
                            match KeyContent::parse(kv.value()) {
                                KeyContent::Preferred { target, .. } => {
                                    Some((target == settings.owner(), kv.mod_revision()))
                                }
                                KeyContent::Holder(_) => None,
                            }
                        });
                        // Handed to this owner (see `hand_over`): take it up now.
                        let handed = events
                            .iter()
                            .filter(|e| e.event_type() == EventType::Put)
                            .filter_map(|e| e.kv())
                            .find(|kv| {
                                KeyContent::holder(kv.value()).as_deref() == Some(settings.owner())
                            });
                        if let Some(kv) = handed {
                            self.seen_handed(Handed::of(kv));
                            return;
                        }
                        if let Some((here, revision)) = preferred {
                            if here {
                                *self
                                    .preferred_here
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner()) = Some(revision);
                            }
                            tracing::trace!(key = %self.key_lossy(), "the key was released to a preferred holder");
                            return;
                        }
                    }
                    other @ (Some(HubEvent::Canceled { .. } | HubEvent::Broken(_)) | None) => {
                        tracing::trace!(key = %self.key_lossy(), ?other, "the key's watch ended: waiting for the retry delay");
                        return sleep_until(retry_at).await;
                    }
                }
            }
        };
        tokio::select! {
            _ = wait => {}
            _ = sleep_until(not_after) => {}
        }
    }
}
