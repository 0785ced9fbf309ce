//! Helpers shared by the bench harnesses.
#![allow(dead_code)]

use std::time::Duration;

/// min / median / p99 / max of a sample, in milliseconds (p99 by nearest rank: with fewer than
/// 100 samples it is the maximum).
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn summarize(values: &[f64]) -> Summary {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    assert!(n > 0, "no samples");
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
    Summary {
        n,
        min: v[0],
        median,
        p99: v[rank - 1],
        max: v[n - 1],
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} min={:.2} ms median={:.2} ms p99={:.2} ms max={:.2} ms",
            self.n, self.min, self.median, self.p99, self.max
        )
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
