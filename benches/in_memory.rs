//! In-memory acquire + release throughput, through the `Lease` trait and through the `LeaseActor`
//! mailbox. Run with `cargo bench --bench in_memory`.

use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_coordination::{Acquire, InMemoryStore, Lease, LeaseActor, LeaseSettings, Release};
use criterion::{criterion_group, criterion_main, Criterion};

fn settings(owner: &str) -> LeaseSettings {
    LeaseSettings::builder("bench", owner)
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid settings")
}

fn through_the_trait(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = InMemoryStore::new();
    let lease = store.lease(settings("trait"));
    c.bench_function("in_memory/acquire+release/trait", |b| {
        b.to_async(&runtime).iter(|| async {
            assert!(lease.acquire().await.unwrap());
            assert!(lease.release().await.unwrap());
        })
    });
    c.bench_function("in_memory/check_alive", |b| {
        runtime.block_on(async { assert!(lease.acquire().await.unwrap()) });
        b.iter(|| assert!(std::hint::black_box(&lease).check_alive()));
        runtime.block_on(async { assert!(lease.release().await.unwrap()) });
    });
}

fn through_the_mailbox(c: &mut Criterion) {
    let system = actix_rt::System::new();
    let store = InMemoryStore::new();
    let actor = system.block_on(async { LeaseActor::new(store.lease(settings("actor"))).start() });
    c.bench_function("in_memory/acquire+release/actor", |b| {
        b.iter_custom(|iterations| {
            system.block_on(async {
                let start = Instant::now();
                for _ in 0..iterations {
                    assert!(actor.send(Acquire).await.unwrap().unwrap());
                    assert!(actor.send(Release).await.unwrap().unwrap());
                }
                start.elapsed()
            })
        })
    });
}

criterion_group!(benches, through_the_trait, through_the_mailbox);
criterion_main!(benches);
