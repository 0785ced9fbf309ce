//! [`SharedLease`]: a cloneable, type-erased [`Lease`], for leases chosen at run time.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::group::{GroupError, GroupWatch};
use crate::lease::{Lease, LeaseError, LeaseLost, LostSubscription};
use crate::settings::LeaseSettings;
use crate::tenure::TenureWatch;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
type BoxHandler = Box<dyn Fn(&LeaseLost) + Send + Sync + 'static>;

/// The object-safe twin of [`Lease`], implemented for every lease.
trait DynLease: Send + Sync + 'static {
    fn settings(&self) -> &LeaseSettings;
    fn acquire(&self) -> BoxFuture<'_, Result<bool, LeaseError>>;
    fn acquire_within(&self, timeout: Duration) -> BoxFuture<'_, Result<bool, LeaseError>>;
    fn release(&self) -> BoxFuture<'_, Result<bool, LeaseError>>;
    fn release_to<'a>(&'a self, target: &'a str) -> BoxFuture<'a, Result<bool, LeaseError>>;
    fn hand_over<'a>(&'a self, target: &'a str) -> BoxFuture<'a, Result<bool, LeaseError>>;
    fn retire(&self) -> BoxFuture<'_, Result<bool, LeaseError>>;
    fn retire_handing(
        &self,
        handed: Vec<crate::HandedShard>,
    ) -> BoxFuture<'_, Result<bool, LeaseError>>;
    fn plan_hand_on(&self, ended: &crate::Binding, handed: Vec<crate::HandedShard>);
    fn mark_leaving(&self);
    fn records_preference(&self) -> bool;
    fn tenure(&self) -> &TenureWatch;
    fn on_lost(&self, handler: BoxHandler) -> LostSubscription;
    fn observed_holder(&self) -> Option<String>;
    fn watch_group(&self, prefix: &str) -> Result<GroupWatch, GroupError>;
    fn binding_anchor(&self) -> Option<crate::BindingAnchor>;
    fn bind_to(&self, anchor: &crate::BindingAnchor) -> Result<(), LeaseError>;
    fn bound_to(&self) -> Option<String>;
}

impl<L: Lease> DynLease for L {
    fn settings(&self) -> &LeaseSettings {
        Lease::settings(self)
    }
    fn acquire(&self) -> BoxFuture<'_, Result<bool, LeaseError>> {
        Box::pin(Lease::acquire(self))
    }
    fn acquire_within(&self, timeout: Duration) -> BoxFuture<'_, Result<bool, LeaseError>> {
        Box::pin(Lease::acquire_within(self, timeout))
    }
    fn release(&self) -> BoxFuture<'_, Result<bool, LeaseError>> {
        Box::pin(Lease::release(self))
    }
    fn release_to<'a>(&'a self, target: &'a str) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(Lease::release_to(self, target))
    }
    fn hand_over<'a>(&'a self, target: &'a str) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(Lease::hand_over(self, target))
    }
    fn retire(&self) -> BoxFuture<'_, Result<bool, LeaseError>> {
        Box::pin(Lease::retire(self))
    }
    fn retire_handing(
        &self,
        handed: Vec<crate::HandedShard>,
    ) -> BoxFuture<'_, Result<bool, LeaseError>> {
        Box::pin(Lease::retire_handing(self, handed))
    }
    fn plan_hand_on(&self, ended: &crate::Binding, handed: Vec<crate::HandedShard>) {
        Lease::plan_hand_on(self, ended, handed)
    }
    fn mark_leaving(&self) {
        Lease::mark_leaving(self)
    }
    fn records_preference(&self) -> bool {
        Lease::records_preference(self)
    }
    fn tenure(&self) -> &TenureWatch {
        Lease::tenure(self)
    }
    fn on_lost(&self, handler: BoxHandler) -> LostSubscription {
        Lease::on_lost(self, handler)
    }
    fn observed_holder(&self) -> Option<String> {
        Lease::observed_holder(self)
    }
    fn watch_group(&self, prefix: &str) -> Result<GroupWatch, GroupError> {
        Lease::watch_group(self, prefix)
    }
    fn binding_anchor(&self) -> Option<crate::BindingAnchor> {
        Lease::binding_anchor(self)
    }
    fn bind_to(&self, anchor: &crate::BindingAnchor) -> Result<(), LeaseError> {
        Lease::bind_to(self, anchor)
    }
    fn bound_to(&self) -> Option<String> {
        Lease::bound_to(self)
    }
}

/// A cloneable handle to any [`Lease`]; clones share one lease (one renewal loop, one set of
/// handlers). This is what [`LeaseProvider`](crate::LeaseProvider) hands out.
///
/// Dropping the last clone drops the lease, which stops its renewal without releasing it.
///
/// # Example
///
/// ```
/// use actix_coordination::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = InMemoryStore::new();
/// let lease = SharedLease::new(InMemoryLease::new(LeaseSettings::new("cache", "node-a")?, &store));
/// let for_the_worker = lease.clone();                // the same lease: one tenure, one renewal
///
/// assert!(lease.acquire().await?);
/// assert!(for_the_worker.check_alive());
/// let guard = for_the_worker.tenure().guard().expect("held");
///
/// for_the_worker.release().await?;                   // a release through any clone ends it
/// assert!(!lease.check_alive());
/// assert_eq!(guard.ended().await, TenureEnd::Released);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SharedLease(Arc<dyn DynLease>);

impl SharedLease {
    /// Wraps `lease`.
    pub fn new(lease: impl Lease) -> Self {
        Self(Arc::new(lease))
    }

    /// Whether `self` and `other` are the same lease instance.
    pub fn ptr_eq(&self, other: &SharedLease) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for SharedLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedLease")
            .field("name", &self.0.settings().name())
            .field("owner", &self.0.settings().owner())
            .field("alive", &self.0.tenure().check_alive())
            .finish()
    }
}

impl Lease for SharedLease {
    fn settings(&self) -> &LeaseSettings {
        self.0.settings()
    }
    fn acquire(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.0.acquire()
    }
    // Forwarded, so that the lease's own (watch-based) wait is used, not the trait's polling default.
    fn acquire_within(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.0.acquire_within(timeout)
    }
    fn release(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.0.release()
    }
    fn release_to(&self, target: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        let (lease, target) = (Arc::clone(&self.0), target.to_owned());
        async move { lease.release_to(&target).await }
    }
    fn hand_over(&self, target: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        let (lease, target) = (Arc::clone(&self.0), target.to_owned());
        async move { lease.hand_over(&target).await }
    }
    fn retire(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.0.retire()
    }
    fn retire_handing(
        &self,
        handed: Vec<crate::HandedShard>,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        self.0.retire_handing(handed)
    }
    fn plan_hand_on(&self, ended: &crate::Binding, handed: Vec<crate::HandedShard>) {
        self.0.plan_hand_on(ended, handed)
    }
    fn mark_leaving(&self) {
        self.0.mark_leaving()
    }
    fn records_preference(&self) -> bool {
        self.0.records_preference()
    }
    fn tenure(&self) -> &TenureWatch {
        self.0.tenure()
    }
    fn on_lost(&self, handler: impl Fn(&LeaseLost) + Send + Sync + 'static) -> LostSubscription {
        self.0.on_lost(Box::new(handler))
    }
    fn observed_holder(&self) -> Option<String> {
        self.0.observed_holder()
    }
    fn watch_group(&self, prefix: &str) -> Result<GroupWatch, GroupError> {
        self.0.watch_group(prefix)
    }
    fn binding_anchor(&self) -> Option<crate::BindingAnchor> {
        self.0.binding_anchor()
    }
    fn bind_to(&self, anchor: &crate::BindingAnchor) -> Result<(), LeaseError> {
        self.0.bind_to(anchor)
    }
    fn bound_to(&self) -> Option<String> {
        self.0.bound_to()
    }
}

impl<L: Lease> Lease for Arc<L> {
    fn settings(&self) -> &LeaseSettings {
        (**self).settings()
    }
    fn acquire(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        (**self).acquire()
    }
    fn acquire_within(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        (**self).acquire_within(timeout)
    }
    fn release(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        (**self).release()
    }
    fn release_to(&self, target: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        (**self).release_to(target)
    }
    fn hand_over(&self, target: &str) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        (**self).hand_over(target)
    }
    fn retire(&self) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        (**self).retire()
    }
    fn retire_handing(
        &self,
        handed: Vec<crate::HandedShard>,
    ) -> impl Future<Output = Result<bool, LeaseError>> + Send {
        (**self).retire_handing(handed)
    }
    fn plan_hand_on(&self, ended: &crate::Binding, handed: Vec<crate::HandedShard>) {
        (**self).plan_hand_on(ended, handed)
    }
    fn mark_leaving(&self) {
        (**self).mark_leaving()
    }
    fn records_preference(&self) -> bool {
        (**self).records_preference()
    }
    fn tenure(&self) -> &TenureWatch {
        (**self).tenure()
    }
    fn on_lost(&self, handler: impl Fn(&LeaseLost) + Send + Sync + 'static) -> LostSubscription {
        (**self).on_lost(handler)
    }
    fn observed_holder(&self) -> Option<String> {
        (**self).observed_holder()
    }
    fn watch_group(&self, prefix: &str) -> Result<GroupWatch, GroupError> {
        (**self).watch_group(prefix)
    }
    fn binding_anchor(&self) -> Option<crate::BindingAnchor> {
        (**self).binding_anchor()
    }
    fn bind_to(&self, anchor: &crate::BindingAnchor) -> Result<(), LeaseError> {
        (**self).bind_to(anchor)
    }
    fn bound_to(&self) -> Option<String> {
        (**self).bound_to()
    }
}

/// A weak handle to a [`SharedLease`]: it does not keep the lease alive (the provider's cache).
#[derive(Clone)]
pub(crate) struct WeakSharedLease(std::sync::Weak<dyn DynLease>);

impl SharedLease {
    /// A handle that does not keep the lease alive.
    pub(crate) fn downgrade(&self) -> WeakSharedLease {
        WeakSharedLease(Arc::downgrade(&self.0))
    }
}

impl WeakSharedLease {
    /// The lease, while any [`SharedLease`] clone of it is alive.
    pub(crate) fn upgrade(&self) -> Option<SharedLease> {
        self.0.upgrade().map(SharedLease)
    }

    /// Whether any [`SharedLease`] clone of the lease is alive.
    pub(crate) fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::SharedLease;
    use crate::{InMemoryStore, Lease, LeaseSettings};

    /// `acquire_within` through a `SharedLease` (what the provider hands out) and through an
    /// `Arc` (what the singleton manager holds) is the lease's own watch-based wait: the waiting
    /// contender makes no periodic attempts and gets the lease as soon as it is released.
    #[tokio::test(start_paused = true)]
    async fn acquire_within_is_forwarded_to_the_lease() {
        let store = InMemoryStore::new();
        let settings = |owner: &str| LeaseSettings::new("forwarded", owner).unwrap();
        let holder = store.lease(settings("a"));
        assert!(holder.acquire().await.unwrap());
        let shared = SharedLease::new(store.lease(settings("b")));
        let arc = Arc::new(SharedLease::new(store.lease(settings("c"))));
        let before = store.stats().acquires;
        let waited = tokio::spawn({
            let shared = shared.clone();
            async move { shared.acquire_within(Duration::from_secs(120)).await }
        });
        tokio::time::sleep(Duration::from_secs(20)).await;
        // The trait's default would have tried every `acquire_retry_delay` (500 ms), each call
        // with `acquire_retries` more attempts: well over a hundred store calls in 20 s.
        assert!(store.stats().acquires - before <= 2, "{:?}", store.stats());
        let released_at = Instant::now();
        assert!(holder.release().await.unwrap());
        assert!(waited.await.unwrap().unwrap());
        assert_eq!(Instant::now(), released_at, "woken by the release itself");

        let before = store.stats().acquires;
        let waited = tokio::spawn({
            let arc = Arc::clone(&arc);
            async move { arc.acquire_within(Duration::from_secs(120)).await }
        });
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(store.stats().acquires - before <= 2, "{:?}", store.stats());
        assert!(shared.release().await.unwrap());
        assert!(waited.await.unwrap().unwrap());
    }
}
