//! An early return from `main` tears the actix `System` down while a singleton manager competes
//! or leads (issue 28, item 3): the common case is `HttpServer::bind(...)?` failing on a busy port
//! right after `ClusterSingletonManager::...start()`. The teardown must not panic, whatever the
//! manager was doing.

#[allow(unused_macros)]
#[macro_use]
mod common;

use std::net::TcpListener;
use std::time::Duration;

use actix::prelude::*;
use actix_coordination::{
    ClusterSingletonManager, GetStatus, InMemoryLease, InMemoryStore, LeaseSettings, SingletonInfo,
    SingletonSettings, SingletonState,
};

struct Job;

impl Actor for Job {
    type Context = Context<Self>;
}

fn settings(owner: &str) -> LeaseSettings {
    LeaseSettings::builder("teardown", owner)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// What `main` does: start a manager, wait for `until` to hold, then bind a port that is taken
/// and return the error with `?`.
fn main_with_a_busy_port(
    store: &InMemoryStore,
    until: Option<SingletonState>,
    handle_signals: bool,
) -> std::io::Result<()> {
    let taken = TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    let store = store.clone();
    actix_rt::System::new().block_on(async move {
        let manager = ClusterSingletonManager::new(
            InMemoryLease::new(settings("a"), &store),
            |_: &SingletonInfo, _: &mut Context<Job>| Job,
        )
        .settings(SingletonSettings {
            handle_signals,
            ..SingletonSettings::default()
        })
        .start();
        if let Some(state) = until {
            let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
            while manager.send(GetStatus).await.unwrap().state != state {
                assert!(
                    tokio::time::Instant::now() < give_up,
                    "never reached {state:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let _listener = TcpListener::bind(("127.0.0.1", port))?;
        Ok(())
    })
}

#[test]
fn a_system_dropped_at_once_after_a_manager_started_does_not_panic() {
    let store = InMemoryStore::new();
    let outcome = std::panic::catch_unwind(|| main_with_a_busy_port(&store, None, false));
    let error = outcome
        .expect("no panic while the System is torn down")
        .expect_err("the bind fails");
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
}

#[test]
fn a_system_dropped_while_its_manager_leads_does_not_panic_and_warns_of_the_held_lease() {
    let (logs, _capture) = common::logs::CapturedLogs::install();
    let store = InMemoryStore::new();
    let outcome = std::panic::catch_unwind(|| {
        main_with_a_busy_port(&store, Some(SingletonState::Running), true)
    });
    let error = outcome
        .expect("no panic while the System is torn down")
        .expect_err("the bind fails");
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
    // Nothing released the lease: the log says so, naming it (the successor waits a TTL).
    let text = logs.text();
    assert!(
        text.lines().any(|line| line.contains("WARN")
            && line.contains("lease=teardown")
            && (line.contains("lease dropped while held") || line.contains("lease lost"))),
        "{text}"
    );
    assert_eq!(
        store.record("teardown").and_then(|r| r.holder),
        Some("a".to_owned()),
        "still recorded as held (a crash-like exit)"
    );
}

#[test]
fn a_system_dropped_while_its_manager_waits_for_a_hung_store_does_not_panic() {
    let store = InMemoryStore::new();
    // Every call hangs: the manager's attempt is in flight when the System goes.
    store.pause("a");
    let outcome = std::panic::catch_unwind(|| main_with_a_busy_port(&store, None, true));
    let error = outcome
        .expect("no panic while the System is torn down")
        .expect_err("the bind fails");
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
}
