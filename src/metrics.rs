//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`).
//!
//! The library only *emits*; the application installs the recorder it wants (Prometheus, StatsD,
//! OpenTelemetry) before it creates its leases, and calls [`describe_metrics`] once to give every
//! metric its unit and help text. Without the feature every call below compiles to nothing.
//!
//! Every metric is listed in [`METRICS`] with its kind, labels and meaning (the README's table is
//! the same list). Labels are bounded: the lease name (one per lease of the process), the backend
//! name, and fixed sets of `verb`, `outcome` and `reason` values; never an owner, a holder or a
//! fencing token, which would grow without bound.

use std::sync::Arc;
use std::time::Duration;

use crate::vocab::LostReason;

/// The kind of a metric in [`METRICS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A monotonic counter.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A distribution of observations (seconds).
    Histogram,
}

/// One metric this crate emits (see [`METRICS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricDescription {
    /// The metric name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Its label keys, each with a bounded set of values.
    pub labels: &'static [&'static str],
    /// What it counts or measures.
    pub help: &'static str,
}

impl MetricDescription {
    /// The recommended bucket upper bounds (seconds) of a histogram, `None` for a counter or a
    /// gauge: [`RENEWAL_DURATION_BUCKETS`] and [`RENEWAL_MARGIN_BUCKETS`]. An exporter without
    /// buckets may render a histogram as a summary, whose quantiles cannot be aggregated across
    /// replicas; configure these (the README's "Running in production" shows how for
    /// `metrics-exporter-prometheus`).
    pub fn buckets(&self) -> Option<&'static [f64]> {
        match self.name {
            RENEWAL_DURATION => Some(RENEWAL_DURATION_BUCKETS),
            RENEWAL_MARGIN => Some(RENEWAL_MARGIN_BUCKETS),
            SHARD_HANDOVER => Some(SHARD_HANDOVER_BUCKETS),
            _ => None,
        }
    }
}

/// Recommended buckets (upper bounds, seconds) of `actix_coordination_renewal_duration_seconds`:
/// from a round trip on the same host (1 ms) to past the longest default operation timeout (5 s),
/// so that a renewal that timed out lands in a bucket of its own.
pub const RENEWAL_DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Recommended buckets (upper bounds, seconds) of `actix_coordination_renewal_margin_seconds`:
/// fine near 0, where a renewal came nearly too late, and up to 2 minutes, past the normal
/// margin of TTLs up to a few minutes (TTL − drift margin − renewal interval: about 19 s with
/// the default TTL of 30 s).
pub const RENEWAL_MARGIN_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
];

/// Recommended buckets (upper bounds, seconds) of `actix_coordination_shard_handover_seconds`:
/// from a round trip on the same host (a planned handover takes milliseconds) to past a TTL (a
/// handover whose target never claimed the shard stops counting after one TTL).
pub const SHARD_HANDOVER_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// `1` while this process holds the lease, `0` otherwise.
pub const LEASE_HELD: &str = "actix_coordination_lease_held";
/// Acquire attempts (single backend calls) by outcome.
pub const ACQUIRE_ATTEMPTS: &str = "actix_coordination_acquire_attempts_total";
/// Renewals by outcome.
pub const RENEWALS: &str = "actix_coordination_renewals_total";
/// How long each renewal call took.
pub const RENEWAL_DURATION: &str = "actix_coordination_renewal_duration_seconds";
/// What was left of the local deadline when a renewal succeeded.
pub const RENEWAL_MARGIN: &str = "actix_coordination_renewal_margin_seconds";
/// Tenures lost, by reason.
pub const LOSSES: &str = "actix_coordination_lease_losses_total";
/// Releases by outcome.
pub const RELEASES: &str = "actix_coordination_releases_total";
/// Requests a backend sent to its server, by verb and outcome.
pub const BACKEND_REQUESTS: &str = "actix_coordination_backend_requests_total";
/// Compare-and-swap writes the server refused because the record had changed.
pub const CAS_CONFLICTS: &str = "actix_coordination_cas_conflicts_total";
/// Singleton instances started.
pub const SINGLETON_STARTS: &str = "actix_coordination_singleton_starts_total";
/// Singleton instances stopped, by reason.
pub const SINGLETON_STOPS: &str = "actix_coordination_singleton_stops_total";
/// Singletons restarted after stopping on their own.
pub const SINGLETON_RESTARTS: &str = "actix_coordination_singleton_restarts_total";
/// Tenure checks a coordinator gate passed.
pub const COORDINATOR_ADMITTED: &str = "actix_coordination_coordinator_admitted_total";
/// Requests a coordinator gate refused, by reason.
pub const COORDINATOR_REFUSED: &str = "actix_coordination_coordinator_refused_total";

/// Shards of a group whose tenure this node holds.
pub const SHARDS_HELD: &str = "actix_coordination_shards_held";
/// Shards this node stopped holding, by reason.
pub const SHARD_MOVES: &str = "actix_coordination_shard_moves_total";
/// How long a planned handover took, from its start to the shard seen held by another node.
pub const SHARD_HANDOVER: &str = "actix_coordination_shard_handover_seconds";

/// Every metric this crate emits with the feature `metrics`, through the
/// [`metrics`](https://docs.rs/metrics) facade: the library only emits, the application installs
/// the recorder it wants (Prometheus, StatsD, OpenTelemetry) and calls `describe_metrics()` once
/// for units and help texts. Labels are bounded: the lease name (one per lease of the process), the
/// backend name, and fixed sets of `verb`, `outcome` and `reason` values; never an owner, a holder
/// or a fencing token. The README's "Running in production" table is the same list (a test keeps
/// them equal).
pub const METRICS: &[MetricDescription] = &[
    MetricDescription {
        name: LEASE_HELD,
        kind: MetricKind::Gauge,
        labels: &["lease"],
        help: "1 while this process holds the lease (a tenure is alive), 0 otherwise",
    },
    MetricDescription {
        name: ACQUIRE_ATTEMPTS,
        kind: MetricKind::Counter,
        labels: &["lease", "outcome"],
        help: "acquire attempts (one backend call each); outcome: acquired, held_by_other, error, timeout",
    },
    MetricDescription {
        name: RENEWALS,
        kind: MetricKind::Counter,
        labels: &["lease", "outcome"],
        help: "renewals; outcome: renewed, error, timeout, lost (the backend showed another holder)",
    },
    MetricDescription {
        name: RENEWAL_DURATION,
        kind: MetricKind::Histogram,
        labels: &["lease"],
        help: "seconds each renewal call took, whatever its outcome",
    },
    MetricDescription {
        name: RENEWAL_MARGIN,
        kind: MetricKind::Histogram,
        labels: &["lease"],
        help: "seconds left to the local deadline when a renewal succeeded: near 0 warns before a loss",
    },
    MetricDescription {
        name: LOSSES,
        kind: MetricKind::Counter,
        labels: &["lease", "reason"],
        help: "tenures lost; reason: expired, taken_over, deleted, inconsistent, renewal_stopped, unbound",
    },
    MetricDescription {
        name: RELEASES,
        kind: MetricKind::Counter,
        labels: &["lease", "outcome"],
        help: "releases of a held tenure; outcome: released, held_by_other, error",
    },
    MetricDescription {
        name: BACKEND_REQUESTS,
        kind: MetricKind::Counter,
        labels: &["backend", "verb", "outcome"],
        help: "requests a backend sent; verb per backend (see the README), outcome: ok, conflict, not_found, error",
    },
    MetricDescription {
        name: CAS_CONFLICTS,
        kind: MetricKind::Counter,
        labels: &["backend", "verb"],
        help: "compare-and-swap writes refused because the record had changed since it was read",
    },
    MetricDescription {
        name: SINGLETON_STARTS,
        kind: MetricKind::Counter,
        labels: &["lease"],
        help: "singleton instances started (restarts included)",
    },
    MetricDescription {
        name: SINGLETON_STOPS,
        kind: MetricKind::Counter,
        labels: &["lease", "reason"],
        help: "singleton instances that stopped; reason: stopped, stop_timeout (terminated after the stop timeout)",
    },
    MetricDescription {
        name: SINGLETON_RESTARTS,
        kind: MetricKind::Counter,
        labels: &["lease"],
        help: "singletons restarted under the same tenure after stopping on their own",
    },
    MetricDescription {
        name: COORDINATOR_ADMITTED,
        kind: MetricKind::Counter,
        labels: &["lease"],
        help: "tenure checks a coordinator gate passed (one before each allocation step)",
    },
    MetricDescription {
        name: COORDINATOR_REFUSED,
        kind: MetricKind::Counter,
        labels: &["lease", "reason"],
        help: "requests a coordinator gate refused; reason: not_held, tenure_ended, stopped, no_regions, queue_full, queue_timeout, ack_timeout",
    },
    MetricDescription {
        name: SHARDS_HELD,
        kind: MetricKind::Gauge,
        labels: &["group"],
        help: "shards of a sharded-workers group whose tenure this node holds",
    },
    MetricDescription {
        name: SHARD_MOVES,
        kind: MetricKind::Counter,
        labels: &["group", "reason"],
        help: "shards this node stopped holding; reason: rebalance (handed over to its target), shutdown, lost (the tenure ended otherwise)",
    },
    MetricDescription {
        name: SHARD_HANDOVER,
        kind: MetricKind::Histogram,
        labels: &["group"],
        help: "seconds from the start of a planned handover to the shard seen held by its new node",
    },
];

/// Registers the unit and help text of every metric in [`METRICS`] with the installed recorder
/// (exporters such as Prometheus print them as `# HELP`). Call it once, after installing the
/// recorder.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    for metric in METRICS {
        let unit = match metric.kind {
            MetricKind::Histogram => Some(::metrics::Unit::Seconds),
            _ => None,
        };
        ::metrics::with_recorder(|recorder| {
            let key = ::metrics::KeyName::from_const_str(metric.name);
            let help = ::metrics::SharedString::const_str(metric.help);
            match metric.kind {
                MetricKind::Counter => recorder.describe_counter(key, unit, help),
                MetricKind::Gauge => recorder.describe_gauge(key, unit, help),
                MetricKind::Histogram => recorder.describe_histogram(key, unit, help),
            }
        });
    }
}

/// The lease label of one lease, shared by its handles (cloning it does not allocate).
#[derive(Debug, Clone)]
pub(crate) struct LeaseLabel(#[cfg_attr(not(feature = "metrics"), allow(dead_code))] Arc<str>);

impl LeaseLabel {
    pub(crate) fn new(name: &str) -> Self {
        Self(Arc::from(name))
    }
}

/// The `outcome` label values of `acquire_attempts_total`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) const ACQUIRE_OUTCOMES: &[&str] = &["acquired", "held_by_other", "timeout", "error"];
/// The `outcome` label values of `renewals_total`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) const RENEWAL_OUTCOMES: &[&str] = &["renewed", "lost", "error", "timeout"];
/// The `reason` label values of `lease_losses_total` (see [`reason_label`]).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) const LOSS_REASONS: &[&str] = &[
    "expired",
    "taken_over",
    "deleted",
    "inconsistent",
    "renewal_stopped",
    "unbound",
];
/// The `outcome` label values of `releases_total`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) const RELEASE_OUTCOMES: &[&str] = &["released", "held_by_other", "error"];
/// The `reason` label values of `shard_moves_total`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) const SHARD_MOVE_REASONS: &[&str] = &["rebalance", "shutdown", "lost"];
/// The `reason` label values of `singleton_stops_total`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) const SINGLETON_STOP_REASONS: &[&str] = &["stopped", "stop_timeout"];

/// The `verb` label values of a backend's requests, each with the `outcome` values it can be
/// counted with in `backend_requests_total`; the verbs that can answer `conflict` are its
/// compare-and-swap writes, counted in `cas_conflicts_total` too.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) type BackendRequests = &'static [(&'static str, &'static [&'static str])];

#[cfg(feature = "metrics")]
mod emit {
    use super::*;
    use ::metrics::{counter, gauge, histogram};

    fn lease(label: &LeaseLabel) -> ::metrics::SharedString {
        ::metrics::SharedString::from(Arc::clone(&label.0))
    }

    /// Records every series of a new lease at zero (and registers its histograms, whose buckets
    /// an exporter then shows at zero), so that absence alerts and `rate()` see the lease from
    /// its start (a series that was never recorded does not exist).
    pub(crate) fn lease_registered(label: &LeaseLabel) {
        gauge!(LEASE_HELD, "lease" => lease(label)).increment(0.0);
        // Registered without an observation: an exporter shows them with empty buckets.
        drop(histogram!(RENEWAL_DURATION, "lease" => lease(label)));
        drop(histogram!(RENEWAL_MARGIN, "lease" => lease(label)));
        for &outcome in ACQUIRE_OUTCOMES {
            counter!(ACQUIRE_ATTEMPTS, "lease" => lease(label), "outcome" => outcome).increment(0);
        }
        for &outcome in RENEWAL_OUTCOMES {
            counter!(RENEWALS, "lease" => lease(label), "outcome" => outcome).increment(0);
        }
        for &reason in LOSS_REASONS {
            counter!(LOSSES, "lease" => lease(label), "reason" => reason).increment(0);
        }
        for &outcome in RELEASE_OUTCOMES {
            counter!(RELEASES, "lease" => lease(label), "outcome" => outcome).increment(0);
        }
    }

    /// Records every request counter of a new backend at zero (`requests`: its verbs and their
    /// outcomes), so that a `rate()` over them sees the first request, and the first conflict.
    pub(crate) fn backend_registered(backend: &'static str, requests: BackendRequests) {
        for &(verb, outcomes) in requests {
            for &outcome in outcomes {
                counter!(BACKEND_REQUESTS, "backend" => backend, "verb" => verb, "outcome" => outcome)
                    .increment(0);
            }
            if outcomes.contains(&"conflict") {
                counter!(CAS_CONFLICTS, "backend" => backend, "verb" => verb).increment(0);
            }
        }
    }

    /// Records the `lease_held` gauge of a tenure publisher at zero.
    pub(crate) fn publisher_registered(label: &LeaseLabel) {
        gauge!(LEASE_HELD, "lease" => lease(label)).increment(0.0);
    }

    /// Records every series of a new singleton manager at zero.
    pub(crate) fn singleton_registered(label: &LeaseLabel) {
        counter!(SINGLETON_STARTS, "lease" => lease(label)).increment(0);
        counter!(SINGLETON_RESTARTS, "lease" => lease(label)).increment(0);
        for &reason in SINGLETON_STOP_REASONS {
            counter!(SINGLETON_STOPS, "lease" => lease(label), "reason" => reason).increment(0);
        }
    }

    /// Records every series of a new coordinator gate at zero (`reasons`: its refusal reasons).
    pub(crate) fn coordinator_registered(label: &LeaseLabel, reasons: &[&'static str]) {
        counter!(COORDINATOR_ADMITTED, "lease" => lease(label)).increment(0);
        for &reason in reasons {
            counter!(COORDINATOR_REFUSED, "lease" => lease(label), "reason" => reason).increment(0);
        }
    }

    /// Records every series of a new sharded-workers group at zero.
    pub(crate) fn sharded_registered(group: &LeaseLabel) {
        gauge!(SHARDS_HELD, "group" => lease(group)).increment(0.0);
        for &reason in SHARD_MOVE_REASONS {
            counter!(SHARD_MOVES, "group" => lease(group), "reason" => reason).increment(0);
        }
    }

    /// Changes the `shards_held` gauge by `delta` (a change, as `lease_held`'s: several groups
    /// of one name in one process add up).
    pub(crate) fn shards_held(group: &LeaseLabel, delta: f64) {
        let gauge = gauge!(SHARDS_HELD, "group" => lease(group));
        if delta >= 0.0 {
            gauge.increment(delta);
        } else {
            gauge.decrement(-delta);
        }
    }

    pub(crate) fn shard_moved(group: &LeaseLabel, reason: &'static str, count: u64) {
        counter!(SHARD_MOVES, "group" => lease(group), "reason" => reason).increment(count);
    }

    pub(crate) fn shard_handover(group: &LeaseLabel, took: Duration) {
        histogram!(SHARD_HANDOVER, "group" => lease(group)).record(took.as_secs_f64());
    }

    pub(crate) fn held(label: &LeaseLabel, delta: f64) {
        let gauge = gauge!(LEASE_HELD, "lease" => lease(label));
        if delta >= 0.0 {
            gauge.increment(delta);
        } else {
            gauge.decrement(-delta);
        }
    }

    pub(crate) fn acquire_attempt(label: &LeaseLabel, outcome: &'static str) {
        counter!(ACQUIRE_ATTEMPTS, "lease" => lease(label), "outcome" => outcome).increment(1);
    }

    pub(crate) fn renewal(label: &LeaseLabel, outcome: &'static str, took: Duration) {
        counter!(RENEWALS, "lease" => lease(label), "outcome" => outcome).increment(1);
        histogram!(RENEWAL_DURATION, "lease" => lease(label)).record(took.as_secs_f64());
    }

    pub(crate) fn renewal_margin(label: &LeaseLabel, margin: Duration) {
        histogram!(RENEWAL_MARGIN, "lease" => lease(label)).record(margin.as_secs_f64());
    }

    pub(crate) fn lost(label: &LeaseLabel, reason: &LostReason) {
        counter!(LOSSES, "lease" => lease(label), "reason" => reason_label(reason)).increment(1);
    }

    pub(crate) fn release(label: &LeaseLabel, outcome: &'static str) {
        counter!(RELEASES, "lease" => lease(label), "outcome" => outcome).increment(1);
    }

    pub(crate) fn backend_request(
        backend: &'static str,
        verb: &'static str,
        outcome: &'static str,
    ) {
        counter!(BACKEND_REQUESTS, "backend" => backend, "verb" => verb, "outcome" => outcome)
            .increment(1);
        if outcome == "conflict" {
            counter!(CAS_CONFLICTS, "backend" => backend, "verb" => verb).increment(1);
        }
    }

    pub(crate) fn singleton_started(label: &LeaseLabel) {
        counter!(SINGLETON_STARTS, "lease" => lease(label)).increment(1);
    }

    pub(crate) fn singleton_stopped(label: &LeaseLabel, reason: &'static str) {
        counter!(SINGLETON_STOPS, "lease" => lease(label), "reason" => reason).increment(1);
    }

    pub(crate) fn singleton_restarted(label: &LeaseLabel) {
        counter!(SINGLETON_RESTARTS, "lease" => lease(label)).increment(1);
    }

    pub(crate) fn coordinator_admitted(label: &LeaseLabel) {
        counter!(COORDINATOR_ADMITTED, "lease" => lease(label)).increment(1);
    }

    pub(crate) fn coordinator_refused(label: &LeaseLabel, reason: &'static str) {
        counter!(COORDINATOR_REFUSED, "lease" => lease(label), "reason" => reason).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod emit {
    //! The feature is off: nothing is recorded, and the calls compile to nothing.
    #![allow(clippy::missing_const_for_fn)]
    use super::*;

    #[inline(always)]
    pub(crate) fn lease_registered(_: &LeaseLabel) {}
    #[inline(always)]
    #[allow(dead_code)]
    pub(crate) fn backend_registered(_: &'static str, _: BackendRequests) {}
    #[inline(always)]
    pub(crate) fn publisher_registered(_: &LeaseLabel) {}
    #[inline(always)]
    pub(crate) fn singleton_registered(_: &LeaseLabel) {}
    #[inline(always)]
    pub(crate) fn coordinator_registered(_: &LeaseLabel, _: &[&'static str]) {}
    #[inline(always)]
    pub(crate) fn sharded_registered(_: &LeaseLabel) {}

    pub(crate) fn shards_held(_: &LeaseLabel, _: f64) {}

    pub(crate) fn shard_moved(_: &LeaseLabel, _: &'static str, _: u64) {}

    pub(crate) fn shard_handover(_: &LeaseLabel, _: Duration) {}

    pub(crate) fn held(_: &LeaseLabel, _: f64) {}
    #[inline(always)]
    pub(crate) fn acquire_attempt(_: &LeaseLabel, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn renewal(_: &LeaseLabel, _: &'static str, _: Duration) {}
    #[inline(always)]
    pub(crate) fn renewal_margin(_: &LeaseLabel, _: Duration) {}
    #[inline(always)]
    pub(crate) fn lost(_: &LeaseLabel, _: &LostReason) {}
    #[inline(always)]
    pub(crate) fn release(_: &LeaseLabel, _: &'static str) {}
    #[inline(always)]
    #[allow(dead_code)]
    pub(crate) fn backend_request(_: &'static str, _: &'static str, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn singleton_started(_: &LeaseLabel) {}
    #[inline(always)]
    pub(crate) fn singleton_stopped(_: &LeaseLabel, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn singleton_restarted(_: &LeaseLabel) {}
    #[inline(always)]
    pub(crate) fn coordinator_admitted(_: &LeaseLabel) {}
    #[inline(always)]
    pub(crate) fn coordinator_refused(_: &LeaseLabel, _: &'static str) {}
}

pub(crate) use emit::*;

/// The `reason` label of a loss.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) fn reason_label(reason: &LostReason) -> &'static str {
    match reason {
        LostReason::TakenOver { .. } => "taken_over",
        LostReason::Expired { .. } => "expired",
        LostReason::Deleted => "deleted",
        LostReason::Inconsistent(_) => "inconsistent",
        LostReason::RenewalStopped => "renewal_stopped",
        LostReason::Unbound { .. } => "unbound",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The series recorded at registration cover every reason a loss can be counted with.
    #[test]
    fn every_loss_reason_is_registered() {
        let reasons = [
            LostReason::TakenOver { holder: None },
            LostReason::Expired { last_error: None },
            LostReason::Deleted,
            LostReason::Inconsistent(String::new()),
            LostReason::RenewalStopped,
            LostReason::Unbound {
                member: String::new(),
            },
        ];
        for reason in &reasons {
            assert!(LOSS_REASONS.contains(&reason_label(reason)), "{reason:?}");
        }
        assert_eq!(LOSS_REASONS.len(), reasons.len());
    }

    #[test]
    fn every_histogram_and_only_histograms_have_rising_positive_buckets() {
        for metric in METRICS {
            match (metric.kind, metric.buckets()) {
                (MetricKind::Histogram, Some(buckets)) => {
                    assert!(!buckets.is_empty(), "{}", metric.name);
                    assert!(buckets[0] > 0.0, "{}", metric.name);
                    assert!(
                        buckets.windows(2).all(|w| w[0] < w[1]),
                        "{}: {buckets:?}",
                        metric.name
                    );
                }
                (MetricKind::Histogram, None) => panic!("{} has no buckets", metric.name),
                (_, Some(_)) => panic!("{} is no histogram but has buckets", metric.name),
                (_, None) => {}
            }
        }
    }
}
