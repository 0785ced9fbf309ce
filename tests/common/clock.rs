//! `CLOCK_MONOTONIC` in nanoseconds: the clock of the `singleton_node` example's events (which
//! keeps its own copy, being standalone). On Linux it is one clock for every process of the
//! machine, whatever network namespace it runs in; it never steps, and libfaketime leaves it alone
//! with `FAKETIME_DONT_FAKE_MONOTONIC=1`. Shared with `benches/handoff.rs` by `#[path]`.

/// Nanoseconds of `CLOCK_MONOTONIC`.
pub fn mono_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}
