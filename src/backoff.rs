//! Pauses between the tries of a call refused for now: doubling from a first pause up to a cap,
//! optionally with jitter. One type for every retry loop of the crate (the backends' releases,
//! the Kubernetes namespace watch), so that each names its bounds and nothing else.

use std::time::Duration;

/// Doubling pauses: `start`, `2 × start`, … up to `max`, then `max` for good; each drawn with
/// ±`jitter` (a fraction of it, 0 for none) so that many clients refused at once do not come back
/// at once.
#[derive(Debug, Clone)]
// Jitter, peeking and starting over serve the Kubernetes backend alone.
#[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
pub(crate) struct Doubling {
    start: Duration,
    max: Duration,
    next: Duration,
    jitter: f64,
}

#[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
impl Doubling {
    /// Pauses from `start` doubling up to `max`, without jitter.
    pub(crate) const fn new(start: Duration, max: Duration) -> Self {
        Self {
            start,
            max,
            next: start,
            jitter: 0.0,
        }
    }

    /// The same, each pause drawn uniformly within ±`fraction` of it.
    pub(crate) fn with_jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction.clamp(0.0, 1.0);
        self
    }

    /// The next pause, without taking it (its middle, without jitter).
    pub(crate) fn peek(&self) -> Duration {
        self.next
    }

    /// Starts over from the first pause.
    pub(crate) fn reset(&mut self) {
        self.next = self.start;
    }
}

impl Iterator for Doubling {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let pause = self.next;
        self.next = (self.next * 2).min(self.max);
        if self.jitter == 0.0 {
            return Some(pause);
        }
        let factor = 1.0 + self.jitter * (2.0 * fastrand::f64() - 1.0);
        Some(pause.mul_f64(factor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn pauses_double_up_to_the_cap_and_start_over_on_reset() {
        let mut pauses = Doubling::new(25 * MS, 200 * MS);
        let taken: Vec<Duration> = pauses.by_ref().take(6).collect();
        assert_eq!(
            taken,
            [25 * MS, 50 * MS, 100 * MS, 200 * MS, 200 * MS, 200 * MS]
        );
        assert_eq!(pauses.peek(), 200 * MS);
        pauses.reset();
        assert_eq!(pauses.next(), Some(25 * MS));
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let mut pauses = Doubling::new(100 * MS, 1000 * MS).with_jitter(0.25);
        for middle in [100, 200, 400, 800, 1000, 1000, 1000] {
            let pause = pauses.next().unwrap();
            let middle = middle * MS;
            assert!(
                pause >= middle.mul_f64(0.75) && pause <= middle.mul_f64(1.25),
                "{pause:?} around {middle:?}"
            );
        }
    }
}
