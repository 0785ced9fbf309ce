//! Where a shard runs, asked on any node: [`ShardDirectory`] (and the [`LocateShard`] message),
//! answered from the group watch the node already has, and the address a member advertises
//! ([`ShardedWorkers::advertise`]) in its member record. Why a handle as well as a message, and
//! what an answer means: see [`ShardDirectory`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{check_lease, member_lease_name, shard_lease_name, ShardedError, ShardedWorkers};
use crate::actors::candidacy::Origin;
use crate::entity::{ShardFunction, StableShardFunction};
use crate::group::{GroupSnapshot, GroupWatch};
use crate::lease::{FencingToken, Lease};
use crate::settings::LeaseSettings;
use crate::tenure::{TenureGuard, TenureWatch};
use crate::vocab::BoxError;

/// Where one shard of a group runs, as one node sees it ([`ShardDirectory::locate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardLocation {
    /// The shard id.
    pub shard: String,
    /// The shard's index: its position in the group's list of shards (what a
    /// [`ShardFunction`] answers for an entity of it).
    pub index: usize,
    /// The node that runs it: this node while it holds the shard's tenure, else the live holder
    /// of the shard's record in this node's group watch (a record naming this node whose tenure
    /// is not alive here is over or ending: no holder). `None` while nobody holds it (it is
    /// moving, or its holder's lease expired).
    pub holder: Option<String>,
    /// The fencing token of the holder's tenure (this node's own tenure's when `here`, else the
    /// record's); `None` without a holder.
    pub token: Option<FencingToken>,
    /// Whether the shard runs on this node: this node holds the shard's tenure right now (its
    /// deadline ahead). A request for the shard may be served here, under the worker's guard.
    pub here: bool,
    /// Where the holder can be reached: the address it advertises in its member record
    /// ([`ShardedWorkers::advertise`]), `scheme://host[:port]`, as the store holds it. `None`
    /// without a holder, when the holder advertises none (or its member record is gone), or when
    /// what its record holds is not a valid address (another writer, another version: it is
    /// checked as [`ShardedWorkers::advertise`] checks it, and never passed on otherwise).
    pub address: Option<String>,
}

/// Why a shard could not be located.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocateError {
    /// The group has no shard of this id.
    #[error("group {group:?} has no shard {shard:?}")]
    UnknownShard {
        /// The group.
        group: String,
        /// The shard id asked for.
        shard: String,
    },
    /// The group has no shard at this index.
    #[error("group {group:?} has no shard at index {index}: it has {shards}")]
    NoIndex {
        /// The group.
        group: String,
        /// The index asked for.
        index: usize,
        /// How many shards the group has.
        shards: usize,
    },
    /// The shard function answered an index out of range for an entity.
    #[error("the shard function put entity {entity:?} in shard {index}, but group {group:?} has {shards} shards")]
    ShardOutOfRange {
        /// The group.
        group: String,
        /// The entity id.
        entity: String,
        /// The index the function answered.
        index: usize,
        /// How many shards the group has.
        shards: usize,
    },
    /// The node's group watch has not listed the group yet (the node just started): nothing is
    /// known of any holder. Ask again shortly.
    #[error("the group watch of group {group:?} has not listed the group yet")]
    NotListed {
        /// The group.
        group: String,
    },
}

/// Ask [`ShardedWorkers`] where a shard runs; answered from its [`ShardDirectory`] (no request
/// to the store).
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "Result<ShardLocation, LocateError>")]
pub struct LocateShard {
    /// The shard id.
    pub shard: String,
}

impl LocateShard {
    /// Where shard `shard` runs.
    pub fn new(shard: impl Into<String>) -> Self {
        Self {
            shard: shard.into(),
        }
    }
}

/// Ask [`ShardedWorkers`] for its [`ShardDirectory`] (also [`ShardedWorkers::directory`], before
/// it starts).
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "ShardDirectory")]
pub struct GetShardDirectory;

/// Where each shard of a group runs, on any node of the group: a cheap, cloneable,
/// `Send + Sync` handle for request handlers.
///
/// Get it from [`ShardedWorkers::directory`] (or [`GetShardDirectory`]). Every answer comes from
/// the node's group watch and the tenures this node holds: no request to the store, whatever
/// the number of questions. Every node of a group that sees the same records answers the same
/// holder, token and address for a shard; `here` is `true` on the holder only.
///
/// A request handler (an actix-web worker, on an arbiter of its own) asks where a shard runs for
/// every request it routes. This handle answers without a round trip through the
/// [`ShardedWorkers`] actor's mailbox: it reads the latest snapshot of the node's
/// [`GroupWatch`](crate::GroupWatch) (a clone of the actor's: no request of its own, no new
/// watch) and the tenures of the shards this node holds, which the actor publishes to it as it
/// builds and drops their leases; an answer is never queued behind a reconcile, and it is as
/// fresh as the watch. [`LocateShard`] asks the actor the same question (it answers from the
/// same directory), for callers that have only its address.
///
/// An answer is what this node observed, up to the watch's delay: for routing, never for
/// exclusivity. A request routed to the holder named may arrive after the shard moved; the node
/// that receives it serves it only if [`ShardLocation::here`] is `true` there, under the worker's
/// guard, and routes it again otherwise.
///
/// It keeps the group watch alive while a clone lives; once the node's [`ShardedWorkers`] has
/// stopped, it holds no shard (`here` is `false` everywhere) and answers from the watch alone.
///
/// ```
/// use actix::prelude::*;
/// use actix_coordination::prelude::*;
/// use actix_coordination::{ShardDirectory, ShardInfo, ShardedWorkers};
///
/// struct Partition;
/// impl Actor for Partition {
///     type Context = Context<Self>;
/// }
///
/// # #[actix::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let lease_store = store.clone();
/// let workers = ShardedWorkers::with_count(
///     "orders",
///     8,
///     move |name: &str| lease_store.lease(LeaseSettings::new(name, "node-1").unwrap()),
///     |_: &ShardInfo, _ctx| Partition,
/// )?
/// .advertise("http://10.0.0.1:8080", |settings| Ok::<_, std::convert::Infallible>(store.lease(settings)))?;
/// let directory: ShardDirectory = workers.directory();
/// let workers = workers.start();
/// # tokio::time::sleep(std::time::Duration::from_millis(100)).await;
/// let location = directory.locate_entity("customer-42")?;  // shard_for("customer-42", 8)
/// assert!(location.here);                                   // alone: every shard runs here
/// assert_eq!(location.address.as_deref(), Some("http://10.0.0.1:8080"));
/// workers.send(Shutdown).await??;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ShardDirectory {
    inner: Arc<Directory>,
    function: Arc<dyn ShardFunction>,
}

impl std::fmt::Debug for ShardDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardDirectory")
            .field("group", &self.inner.group)
            .field("node", &self.inner.node)
            .field("shards", &self.inner.ids.len())
            .finish_non_exhaustive()
    }
}

/// What every clone of a [`ShardDirectory`] shares.
struct Directory {
    group: String,
    node: String,
    /// The shard ids, in the group's order (an index is a position here).
    ids: Vec<String>,
    /// The indices of `ids`, in the order of the ids (for a binary search).
    by_id: Vec<u32>,
    watch: GroupWatch,
    /// The tenures of the shards this node has a lease of, by index (kept by the actor).
    tenures: Mutex<std::collections::HashMap<usize, TenureWatch>>,
}

impl ShardDirectory {
    /// The directory of `group`, node `node`, with these shard ids, reading `watch`.
    pub(super) fn new(group: &str, node: &str, ids: Vec<String>, watch: GroupWatch) -> Self {
        let mut by_id: Vec<u32> = (0..ids.len() as u32).collect();
        by_id.sort_unstable_by_key(|&i| ids[i as usize].as_str());
        Self {
            inner: Arc::new(Directory {
                group: group.to_owned(),
                node: node.to_owned(),
                ids,
                by_id,
                watch,
                tenures: Mutex::new(std::collections::HashMap::new()),
            }),
            function: Arc::new(StableShardFunction),
        }
    }

    fn tenures(&self) -> MutexGuard<'_, std::collections::HashMap<usize, TenureWatch>> {
        // Nothing panics while holding it; a poisoned map is still a consistent map.
        self.inner
            .tenures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The actor built the lease of shard `index`: its tenure says whether it runs here.
    pub(super) fn hold(&self, index: usize, tenure: TenureWatch) {
        self.tenures().insert(index, tenure);
    }

    /// The actor dropped the lease of shard `index` (`None`: every lease, it stopped).
    pub(super) fn drop_lease(&self, index: Option<usize>) {
        match index {
            Some(index) => {
                self.tenures().remove(&index);
            }
            None => self.tenures().clear(),
        }
    }

    /// The same directory mapping entities with `function` instead of the default
    /// ([`StableShardFunction`], [`shard_for`](crate::shard_for)); every node and client of the
    /// group must use the same one.
    pub fn with_shard_function(mut self, function: impl ShardFunction) -> Self {
        self.function = Arc::new(function);
        self
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.inner.group
    }

    /// This node's owner identity.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The group's shard ids, in order: a shard's index is its position here.
    pub fn shards(&self) -> &[String] {
        &self.inner.ids
    }

    /// The index of shard `shard`, if the group has it.
    pub fn index_of(&self, shard: &str) -> Option<usize> {
        let (ids, by_id) = (&self.inner.ids, &self.inner.by_id);
        by_id
            .binary_search_by(|&i| ids[i as usize].as_str().cmp(shard))
            .ok()
            .map(|at| by_id[at] as usize)
    }

    /// The index of the shard entity `entity_id` belongs to, by the directory's
    /// [`ShardFunction`].
    ///
    /// # Errors
    ///
    /// [`LocateError::ShardOutOfRange`] when the shard function answers an index out of range.
    pub fn shard_of(&self, entity_id: &str) -> Result<usize, LocateError> {
        let shards = self.inner.ids.len();
        let index = self.function.shard_for(entity_id, shards);
        if index >= shards {
            return Err(LocateError::ShardOutOfRange {
                group: self.inner.group.clone(),
                entity: entity_id.to_owned(),
                index,
                shards,
            });
        }
        Ok(index)
    }

    /// Where shard `shard` runs now, as this node sees it (see [`ShardLocation`]). No request to
    /// the store: a read of the latest snapshot of the group watch.
    ///
    /// # Errors
    ///
    /// [`LocateError::UnknownShard`] when the group has no such shard;
    /// [`LocateError::NotListed`] before the group watch has listed the group.
    pub fn locate(&self, shard: &str) -> Result<ShardLocation, LocateError> {
        let index = self
            .index_of(shard)
            .ok_or_else(|| LocateError::UnknownShard {
                group: self.inner.group.clone(),
                shard: shard.to_owned(),
            })?;
        self.locate_index(index)
    }

    /// Where the shard at `index` runs now; see [`locate`](Self::locate).
    ///
    /// # Errors
    ///
    /// [`LocateError::NoIndex`] when the group has no shard at `index`;
    /// [`LocateError::NotListed`] before the group watch has listed the group.
    pub fn locate_index(&self, index: usize) -> Result<ShardLocation, LocateError> {
        self.route(index).map(|route| route.location)
    }

    /// The guard of this node's tenure of the shard at `index` while it runs here: its
    /// [`TenureGuard::check_alive`] turns `false` before any other node can take the shard, and
    /// [`TenureGuard::token`] is the fencing token to write with. `None` when this node holds no
    /// live tenure of it (another node runs it, nobody does, or the group has no such index).
    /// No request to the store.
    pub fn guard(&self, index: usize) -> Option<TenureGuard> {
        self.tenures().get(&index).and_then(TenureWatch::guard)
    }

    /// [`locate_index`](Self::locate_index) with the guard of this node's tenure when `here`
    /// (read once: `here` is `guard.is_some()`), for routing requests (the `web` feature's
    /// `ShardRouting`).
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    pub(crate) fn route(&self, index: usize) -> Result<Route, LocateError> {
        let inner = &*self.inner;
        let Some(id) = inner.ids.get(index) else {
            return Err(LocateError::NoIndex {
                group: inner.group.clone(),
                index,
                shards: inner.ids.len(),
            });
        };
        let snapshot = inner.watch.snapshot();
        if !snapshot.is_synced() {
            return Err(LocateError::NotListed {
                group: inner.group.clone(),
            });
        }
        let guard = self.guard(index);
        let now = Instant::now();
        let (holder, token) = match &guard {
            Some(guard) => (Some(inner.node.as_str()), Some(guard.token())),
            None => {
                let name = shard_lease_name(&inner.group, id);
                // A record naming this node whose tenure is not alive here is over, or ending.
                let holder = snapshot
                    .live_holder(&name, now)
                    .filter(|holder| *holder != inner.node);
                let token = holder.and_then(|_| snapshot.get(&name)?.token);
                (holder, token)
            }
        };
        let location = ShardLocation {
            shard: id.clone(),
            index,
            address: holder.and_then(|holder| advertised(&snapshot, &inner.group, holder)),
            holder: holder.map(str::to_owned),
            token,
            here: guard.is_some(),
        };
        Ok(Route { location, guard })
    }

    /// The valid address this node advertises in its own member record, as its group watch shows
    /// it now (`None` before the record is listed, or when it advertises none): a redirect there
    /// would come back here.
    #[cfg_attr(not(feature = "web"), allow(dead_code))]
    pub(crate) fn own_address(&self) -> Option<String> {
        let inner = &*self.inner;
        advertised(&inner.watch.snapshot(), &inner.group, &inner.node)
    }

    /// Where the shard of entity `entity_id` runs now: [`shard_of`](Self::shard_of), then
    /// [`locate_index`](Self::locate_index).
    ///
    /// # Errors
    ///
    /// [`LocateError::ShardOutOfRange`] when the shard function answers an index out of range;
    /// [`LocateError::NotListed`] before the group watch has listed the group.
    pub fn locate_entity(&self, entity_id: &str) -> Result<ShardLocation, LocateError> {
        self.locate_index(self.shard_of(entity_id)?)
    }
}

/// A [`ShardLocation`] with what routing a request needs besides ([`ShardDirectory::route`]).
#[cfg_attr(not(feature = "web"), allow(dead_code))]
pub(crate) struct Route {
    /// Where the shard runs.
    pub(crate) location: ShardLocation,
    /// The guard of this node's tenure of the shard: `Some` exactly when `location.here`.
    pub(crate) guard: Option<TenureGuard>,
}

/// What a member writes about itself in its member lease's [metadata](LeaseSettings::metadata)
/// (JSON, as a candidacy's): unknown fields are ignored, so that a later version may add some.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MemberMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    address: Option<String>,
}

/// The valid address `holder` advertises in its member record of `group` in `snapshot`.
fn advertised(snapshot: &GroupSnapshot, group: &str, holder: &str) -> Option<String> {
    let record = snapshot.get(&member_lease_name(group, holder))?;
    if record.holder.as_deref() != Some(holder) {
        return None;
    }
    let metadata: MemberMetadata = serde_json::from_str(record.metadata.as_deref()?).ok()?;
    let address = metadata.address?;
    match Origin::parse(&address) {
        Ok(_) => Some(address),
        Err(error) => {
            tracing::debug!(
                group,
                holder,
                address,
                error = &error as &dyn std::error::Error,
                "a member advertises an invalid address: not passed on"
            );
            None
        }
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> ShardedWorkers<A, L> {
    /// Advertises where the other nodes reach this one (for example `http://10.1.2.3:8080`): its
    /// member lease carries the address as [metadata](LeaseSettings::metadata), the way a
    /// candidacy does ([`Candidate::address`](crate::Candidate::address)), and every node's
    /// [`ShardDirectory`] answers it as [`ShardLocation::address`] for the shards this node runs.
    ///
    /// The address is an absolute `http` or `https` URL with a host (a DNS name, an IPv4 address
    /// or a bracketed IPv6 address) and an optional port, and nothing else: no path but `/`, no
    /// query, fragment or user information, no whitespace (nothing is trimmed), checked here
    /// once. `lease_for(settings)` builds the member lease again from `settings` (the member
    /// lease's own, with the metadata in place of any it had) on the same store and session as
    /// the node's other leases:
    /// `move |s| Ok::<_, Infallible>(store.lease(s))` (with a clone of the store),
    /// `move |s| provider.lease_with_settings("ingest", s)` (with a clone of the provider). Call
    /// it before the node starts.
    ///
    /// # Errors
    ///
    /// [`ShardedError::InvalidAddress`] naming the address and what is wrong with it;
    /// [`ShardedError::MemberLease`] when the settings cannot carry it or `lease_for` fails;
    /// [`ShardedError::WrongLease`] when `lease_for` builds another lease than the member lease.
    pub fn advertise<E: Into<BoxError>>(
        mut self,
        address: impl Into<String>,
        lease_for: impl FnOnce(LeaseSettings) -> Result<L, E>,
    ) -> Result<Self, ShardedError> {
        let address = address.into();
        if let Err(source) = Origin::parse(&address) {
            return Err(ShardedError::InvalidAddress { address, source });
        }
        let name = self.member_lease.name().to_owned();
        let metadata = MemberMetadata {
            address: Some(address),
        };
        let metadata = serde_json::to_string(&metadata).expect("member metadata serializes");
        let member_lease = |source: BoxError| ShardedError::MemberLease {
            name: name.clone(),
            source,
        };
        let settings = (self.member_lease.settings())
            .with_metadata(Some(metadata))
            .map_err(|e| member_lease(e.into()))?;
        let lease = lease_for(settings).map_err(|e| member_lease(e.into()))?;
        check_lease(&name, &lease, &self.node)?;
        self.member_lease = Arc::new(lease);
        Ok(self)
    }

    /// Where each shard of the group runs, for request handlers: a cheap, cloneable handle that
    /// answers from this node's group watch (see [`ShardDirectory`]).
    pub fn directory(&self) -> ShardDirectory {
        self.directory.clone()
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> Handler<LocateShard> for ShardedWorkers<A, L> {
    type Result = Result<ShardLocation, LocateError>;

    fn handle(&mut self, message: LocateShard, _: &mut Context<Self>) -> Self::Result {
        self.directory.locate(&message.shard)
    }
}

impl<A: Actor<Context = Context<A>>, L: Lease> Handler<GetShardDirectory> for ShardedWorkers<A, L> {
    type Result = MessageResult<GetShardDirectory>;

    fn handle(&mut self, _: GetShardDirectory, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.directory.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::group::GroupRecord;

    fn snapshot(records: &[(&str, Option<&str>, Option<&str>)]) -> GroupSnapshot {
        let records = records.iter().map(|(name, holder, metadata)| {
            let record = GroupRecord::new(holder.map(str::to_owned), None, None)
                .with_metadata(metadata.map(str::to_owned));
            ((*name).to_owned(), record)
        });
        GroupSnapshot::new(records.collect::<BTreeMap<_, _>>(), true)
    }

    #[test]
    fn an_advertised_address_is_read_only_from_the_holders_own_valid_record() {
        let s = snapshot(&[
            (
                "g.member.a",
                Some("a"),
                Some(r#"{"address":"http://a:80"}"#),
            ),
            (
                "g.member.b",
                Some("b"),
                Some(r#"{"address":"http://b/path"}"#),
            ),
            (
                "g.member.c",
                Some("x"),
                Some(r#"{"address":"http://c:80"}"#),
            ),
            ("g.member.d", Some("d"), Some("not json")),
            (
                "g.member.e",
                Some("e"),
                Some(r#"{"address":"https://e","later":1}"#),
            ),
            ("g.member.f", Some("f"), None),
        ]);
        assert_eq!(advertised(&s, "g", "a").as_deref(), Some("http://a:80"));
        assert_eq!(advertised(&s, "g", "b"), None, "a path");
        assert_eq!(advertised(&s, "g", "c"), None, "another holder's record");
        assert_eq!(advertised(&s, "g", "d"), None, "not this crate's metadata");
        assert_eq!(advertised(&s, "g", "e").as_deref(), Some("https://e"));
        assert_eq!(advertised(&s, "g", "f"), None, "no metadata");
        assert_eq!(advertised(&s, "g", "z"), None, "no record");
    }

    #[test]
    fn the_metadata_is_the_candidacys_shape() {
        let metadata = MemberMetadata {
            address: Some("http://a:1".into()),
        };
        assert_eq!(
            serde_json::to_string(&metadata).unwrap(),
            r#"{"address":"http://a:1"}"#
        );
        assert_eq!(
            serde_json::to_string(&MemberMetadata::default()).unwrap(),
            "{}"
        );
    }
}
