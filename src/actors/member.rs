//! The trivial actor a member lease "runs".

use actix::prelude::*;

/// What a [`ClusterSingletonManager`](crate::ClusterSingletonManager) runs under a lease whose
/// holding *is* the point: a sharded node's member lease (its membership) and a manager's
/// candidacy lease (its candidacy). It does nothing.
pub(crate) struct Member;

impl Actor for Member {
    type Context = Context<Self>;
}
