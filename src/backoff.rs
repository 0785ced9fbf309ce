//! How the actors compete for a lease: one acquire round, jitter between rounds and exponential
//! backoff after errors.

use std::time::Duration;

use crate::lease::{Lease, LeaseError};

/// The shortest acquire round.
pub(crate) const MIN_ROUND: Duration = Duration::from_millis(10);
/// The shortest pause after an acquire error.
pub(crate) const MIN_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// One acquire round: a single attempt first, so that an error goes straight to the caller's
/// backoff; only when the lease is held elsewhere (and `window` is not zero) a wait of up to
/// `window` on the backend's change notification.
pub(crate) async fn acquire_round<L: Lease>(
    lease: &L,
    window: Duration,
) -> Result<bool, LeaseError> {
    match lease.acquire_within(Duration::ZERO).await {
        Ok(false) if !window.is_zero() => lease.acquire_within(window).await,
        result => result,
    }
}

/// `delay` ± 20 %, so that nodes do not retry in lockstep.
pub(crate) fn jitter(delay: Duration) -> Duration {
    delay.mul_f64(0.8 + 0.4 * fastrand::f64())
}

/// The pause after the `errors`-th error in a row (`errors >= 1`): `max(base, 100 ms)` after the
/// first, doubling after every further error, up to `max(cap, 100 ms)`; each pause is 80–100 % of
/// its nominal value, so never beyond the cap.
pub(crate) fn error_backoff(base: Duration, cap: Duration, errors: u32) -> Duration {
    let base = base.max(MIN_ERROR_BACKOFF);
    let cap = cap.max(MIN_ERROR_BACKOFF);
    let doublings = errors.saturating_sub(1).min(30);
    let nominal = base.saturating_mul(1u32 << doublings).min(cap);
    nominal.mul_f64(0.8 + 0.2 * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let (base, cap) = (Duration::from_millis(500), Duration::from_secs(3));
        let nominal = [500, 1000, 2000, 3000, 3000, 3000];
        for (errors, nominal) in (1..).zip(nominal) {
            let pause = error_backoff(base, cap, errors);
            let nominal = Duration::from_millis(nominal);
            assert!(
                pause <= nominal && pause >= nominal.mul_f64(0.8),
                "{pause:?} vs {nominal:?}"
            );
        }
    }

    #[test]
    fn floors_and_never_overflows() {
        assert!(error_backoff(Duration::ZERO, Duration::ZERO, 1) >= Duration::from_millis(80));
        assert!(error_backoff(Duration::ZERO, Duration::ZERO, 1) <= Duration::from_millis(100));
        let far = error_backoff(Duration::from_secs(1), Duration::MAX, u32::MAX);
        assert!(far >= Duration::from_secs(1 << 30).mul_f64(0.8));
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_secs(1));
            assert!(j >= Duration::from_millis(800) && j <= Duration::from_millis(1200));
        }
    }
}
