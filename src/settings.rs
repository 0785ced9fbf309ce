//! Lease settings: the timing of a lease, validated once at construction.

use std::time::Duration;

use serde::Deserialize;

/// The longest lease name accepted, in bytes.
///
/// Backends with shorter limits (a Kubernetes object name is at most 253 characters) map longer
/// names to valid, collision-free identifiers themselves.
pub const MAX_NAME_LEN: usize = 1024;

/// The longest owner identity accepted, in bytes.
pub const MAX_OWNER_LEN: usize = 512;

/// The longest holder metadata accepted, in bytes (see [`LeaseSettings::metadata`]).
pub const MAX_METADATA_LEN: usize = 4096;

/// Default time to live of a lease.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Default bound on a single backend call, when it is shorter than the renewal interval.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// The smallest default clock drift margin: it also covers the scheduling delay of the local
/// `on_lost` notification on a busy machine.
pub const MIN_DEFAULT_MARGIN: Duration = Duration::from_millis(100);
/// Default number of retries of `acquire` while another owner holds the lease.
pub const DEFAULT_ACQUIRE_RETRIES: u32 = 3;
/// Default delay between two attempts of `acquire`.
pub const DEFAULT_ACQUIRE_RETRY_DELAY: Duration = Duration::from_millis(500);
/// The shortest `acquire-retry-delay` accepted: a waiting lease retries an unreachable backend
/// at most 100 times a second.
pub const MIN_ACQUIRE_RETRY_DELAY: Duration = Duration::from_millis(10);
/// The smallest `clock-drift-margin` accepted, whatever the TTL; the floor is
/// `max(ttl / 1000, 1 ms)`: two clocks each drifting by up to 500 ppm (NTP's bound on slewing)
/// disagree by at most a thousandth of the TTL over the TTL.
pub const MIN_CLOCK_DRIFT_MARGIN: Duration = Duration::from_millis(1);

/// An invalid lease setting, found when [`LeaseSettings`] are built.
///
/// Every variant names the field at fault; [`SettingsError::field`] returns it as written in
/// configuration files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The lease name or the owner is empty.
    #[error("invalid `{field}`: must not be empty")]
    Empty {
        /// `name`, `owner` or `metadata`.
        field: &'static str,
    },
    /// The lease name or the owner is longer than allowed.
    #[error("invalid `{field}`: {len} bytes long, at most {max} allowed")]
    TooLong {
        /// `name`, `owner` or `metadata`.
        field: &'static str,
        /// The length given.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The lease name or the owner contains a control character.
    #[error("invalid `{field}`: contains the control character {character:?}")]
    ControlCharacter {
        /// `name`, `owner` or `metadata`.
        field: &'static str,
        /// The offending character.
        character: char,
    },
    /// A duration that must be positive is zero.
    #[error("invalid `{field}`: must be greater than zero")]
    Zero {
        /// The field name.
        field: &'static str,
    },
    /// The renewal interval is longer than half the TTL, so a single failed renewal could lose
    /// the lease.
    #[error(
        "invalid `renewal-interval`: {interval:?} must be at most half the ttl ({ttl:?}), \
         so that a failed renewal can be retried before the lease expires"
    )]
    RenewalIntervalTooLong {
        /// The renewal interval given.
        interval: Duration,
        /// The TTL.
        ttl: Duration,
    },
    /// The operation timeout leaves no room for one retry of a failed renewal before the local
    /// deadline: `renewal-interval + 2 × operation-timeout` must not exceed
    /// `ttl - clock-drift-margin`.
    #[error(
        "invalid `operation-timeout`: {timeout:?} is longer than {max:?}, so a renewal that \
         times out could not be retried before the deadline \
         (renewal-interval + 2 × operation-timeout must not exceed ttl - clock-drift-margin)"
    )]
    OperationTimeoutTooLong {
        /// The timeout given.
        timeout: Duration,
        /// The longest timeout the other settings allow: `(ttl - clock-drift-margin -
        /// renewal-interval) / 2`.
        max: Duration,
    },
    /// A duration is shorter than its floor (`acquire-retry-delay`, `clock-drift-margin`).
    #[error("invalid `{field}`: {value:?} is shorter than the minimum of {min:?}")]
    DurationTooShort {
        /// `acquire-retry-delay` or `clock-drift-margin`.
        field: &'static str,
        /// The duration given.
        value: Duration,
        /// The minimum.
        min: Duration,
    },
    /// A duration is longer than [`LeaseSettings::MAX_DURATION`] (one day): such a value is
    /// almost certainly a unit mistake, and instants that far ahead could overflow the clock.
    #[error("invalid `{field}`: {value:?} is longer than the maximum of {max:?}")]
    DurationTooLong {
        /// `ttl`, `renewal-interval`, `operation-timeout`, `acquire-retry-delay` or
        /// `clock-drift-margin`; from [`SingletonSettings::validate`](crate::SingletonSettings::validate):
        /// `retry-delay`, `max-error-backoff`, `restart-window`, `give-up-pause` or `stop-timeout`.
        field: &'static str,
        /// The duration given.
        value: Duration,
        /// The maximum, [`LeaseSettings::MAX_DURATION`].
        max: Duration,
    },
    /// The clock drift margin is not shorter than half the TTL.
    #[error(
        "invalid `clock-drift-margin`: {margin:?} must be shorter than half the ttl ({ttl:?})"
    )]
    ClockDriftMarginTooLong {
        /// The margin given.
        margin: Duration,
        /// The TTL.
        ttl: Duration,
    },
}

impl SettingsError {
    /// The name of the setting at fault, as written in configuration (`renewal-interval`).
    pub fn field(&self) -> &'static str {
        match self {
            SettingsError::Empty { field }
            | SettingsError::TooLong { field, .. }
            | SettingsError::ControlCharacter { field, .. }
            | SettingsError::Zero { field }
            | SettingsError::DurationTooShort { field, .. }
            | SettingsError::DurationTooLong { field, .. } => field,
            SettingsError::RenewalIntervalTooLong { .. } => "renewal-interval",
            SettingsError::OperationTimeoutTooLong { .. } => "operation-timeout",
            SettingsError::ClockDriftMarginTooLong { .. } => "clock-drift-margin",
        }
    }
}

/// The validated settings of one lease: its name, this node's owner identity and its timing.
///
/// Every backend reads the same [`LeaseSettings`]. They can only be built through
/// [`LeaseSettings::builder`] (or [`LeaseSettings::new`] for the defaults), which checks every field
/// and returns a [`SettingsError`] naming the first field that is wrong. A value of this type is
/// therefore always consistent: the renewal interval fits twice into the TTL, each backend call is
/// bounded by a timeout shorter than the TTL, and so on.
///
/// # Defaults
///
/// | setting | default | why |
/// |---|---|---|
/// | `ttl` | 30 s (at most 1 day) | long enough to ride out a backend hiccup or a GC-like pause, short enough that a crashed holder is replaced within half a minute |
/// | `renewal_interval` | `ttl / 3` (10 s) | one failed renewal never loses the lease: two more attempts fit before the deadline |
/// | `operation_timeout` | `min(5 s, renewal_interval, (ttl - margin - renewal_interval) / 2)` | a stuck call must not eat more than one renewal interval, and a renewal that times out can be retried before the deadline |
/// | `acquire_retries` | 3 | `acquire` makes up to 4 attempts before it resolves `false` (errors are not retried) |
/// | `acquire_retry_delay` | 500 ms (10 ms to 1 day) | long enough not to hammer the backend, short enough to notice a release soon |
/// | `clock_drift_margin` | `max(ttl / 50, 100 ms)`, at most `ttl / 4` (600 ms) | see below |
///
/// The rules, each checked by [`LeaseSettingsBuilder::build`]:
///
/// * `0 < renewal_interval ≤ ttl / 2`;
/// * `renewal_interval + 2 × operation_timeout ≤ ttl - clock_drift_margin`: a renewal that times
///   out is retried at once, and that retry still has a whole operation timeout before the
///   deadline ([`SettingsError::OperationTimeoutTooLong`]);
/// * `acquire_retry_delay ≥ 10 ms` ([`MIN_ACQUIRE_RETRY_DELAY`]): a waiting lease never spins
///   against an unreachable backend ([`SettingsError::DurationTooShort`]);
/// * `max(ttl / 1000, 1 ms) ≤ clock_drift_margin < ttl / 2` (see below);
/// * no duration exceeds [`LeaseSettings::MAX_DURATION`] (one day); longer values are rejected
///   with [`SettingsError::DurationTooLong`] instead of overflowing the clock later.
///
/// # The local deadline
///
/// A holder considers itself the owner until `start of its last successful renewal + ttl -
/// clock_drift_margin`, measured on its own monotonic clock. The backend (or a contender) can only
/// see the renewal *after* it started, and counts the TTL from then, so the holder's deadline always
/// comes first; the margin absorbs a difference in clock *rate* between the two machines (NTP slewing
/// is bounded by 500 ppm per clock, so two clocks disagree by at most `ttl / 1000` over a TTL: the
/// floor of the margin; the default covers 2 %) and the time it takes to deliver the lost
/// notification.
///
/// Build them with [`LeaseSettings::new`] (all defaults) or [`LeaseSettings::builder`].
///
/// ```
/// use std::time::Duration;
/// use actix_coordination::LeaseSettings;
///
/// let settings = LeaseSettings::builder("billing-singleton", "node-1")
///     .ttl(Duration::from_secs(15))
///     .build()?;
/// assert_eq!(settings.renewal_interval(), Duration::from_secs(5));
///
/// let err = LeaseSettings::builder("billing-singleton", "node-1")
///     .ttl(Duration::from_secs(10))
///     .renewal_interval(Duration::from_secs(8))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "renewal-interval");
/// # Ok::<(), actix_coordination::SettingsError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    name: String,
    owner: String,
    ttl: Duration,
    renewal_interval: Duration,
    operation_timeout: Duration,
    acquire_retries: u32,
    acquire_retry_delay: Duration,
    clock_drift_margin: Duration,
    metadata: Option<String>,
}

impl LeaseSettings {
    /// The longest duration accepted for any timing setting (`ttl`, `acquire_retry_delay`, and
    /// the settings bounded by the TTL): one day. A lease meant to be held longer is renewed, it
    /// does not need a longer TTL; a larger value is almost certainly a unit mistake.
    pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

    /// Settings with every default, for lease `name` held by `owner`.
    ///
    /// # Errors
    ///
    /// [`SettingsError`] when the name or the owner is empty, too long or contains a control
    /// character.
    pub fn new(name: impl Into<String>, owner: impl Into<String>) -> Result<Self, SettingsError> {
        Self::builder(name, owner).build()
    }

    /// A builder for lease `name` held by `owner`; unset fields take their documented defaults.
    pub fn builder(name: impl Into<String>, owner: impl Into<String>) -> LeaseSettingsBuilder {
        LeaseSettingsBuilder {
            name: name.into(),
            owner: owner.into(),
            metadata: None,
            timing: TimingConfig::default(),
        }
    }

    /// The lease name: the same name on every node means the same lease.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This node's identity as a holder (a pod name, `host:port`, a UUID). Two processes must
    /// never share one: the same owner is treated as the same holder (reentrancy).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// How long the lease stays held without a successful renewal (the heartbeat timeout).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How often the holder renews the lease.
    pub fn renewal_interval(&self) -> Duration {
        self.renewal_interval
    }

    /// The bound on each single backend call.
    pub fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// How many times `acquire` tries again while another owner holds the lease.
    pub fn acquire_retries(&self) -> u32 {
        self.acquire_retries
    }

    /// The delay between two attempts of `acquire`.
    pub fn acquire_retry_delay(&self) -> Duration {
        self.acquire_retry_delay
    }

    /// How much earlier than the TTL the holder gives the lease up locally.
    pub fn clock_drift_margin(&self) -> Duration {
        self.clock_drift_margin
    }

    /// What this owner writes about itself with every claim (default none): an opaque string of
    /// at most [`MAX_METADATA_LEN`] bytes without control characters, which every
    /// [`GroupWatch`](crate::GroupWatch) of the lease shows in [`GroupRecord::metadata`](crate::GroupRecord::metadata)
    /// for as long as this owner holds it. A candidacy's revision, start time and address travel
    /// this way ([`Candidate`](crate::Candidate)). It is never read for exclusivity.
    pub fn metadata(&self) -> Option<&str> {
        self.metadata.as_deref()
    }

    /// The same settings with other holder metadata (see [`metadata`](Self::metadata)).
    ///
    /// # Errors
    ///
    /// [`SettingsError`] (field `metadata`) when it is empty, longer than [`MAX_METADATA_LEN`] or
    /// contains a control character.
    pub fn with_metadata(&self, metadata: Option<String>) -> Result<Self, SettingsError> {
        if let Some(metadata) = &metadata {
            check_identifier("metadata", metadata, MAX_METADATA_LEN)?;
        }
        Ok(Self {
            metadata,
            ..self.clone()
        })
    }

    /// The holder keeps the lease for this long after the start of a successful renewal:
    /// `ttl - clock_drift_margin`.
    pub fn local_validity(&self) -> Duration {
        self.ttl - self.clock_drift_margin
    }

    /// A builder holding these settings, to derive variants (`name` and `owner` can be replaced
    /// with [`LeaseSettingsBuilder::name`] and [`LeaseSettingsBuilder::owner`]).
    pub fn to_builder(&self) -> LeaseSettingsBuilder {
        LeaseSettingsBuilder {
            name: self.name.clone(),
            owner: self.owner.clone(),
            metadata: self.metadata.clone(),
            timing: TimingConfig {
                ttl: Some(self.ttl),
                renewal_interval: Some(self.renewal_interval),
                operation_timeout: Some(self.operation_timeout),
                acquire_retries: Some(self.acquire_retries),
                acquire_retry_delay: Some(self.acquire_retry_delay),
                clock_drift_margin: Some(self.clock_drift_margin),
            },
        }
    }

    /// The same settings for another owner (the name and timing are kept).
    ///
    /// # Errors
    ///
    /// [`SettingsError`] when the owner is invalid.
    pub fn with_owner(&self, owner: impl Into<String>) -> Result<Self, SettingsError> {
        let owner = owner.into();
        check_identifier("owner", &owner, MAX_OWNER_LEN)?;
        Ok(Self {
            owner,
            ..self.clone()
        })
    }
}

/// Builds [`LeaseSettings`]; [`LeaseSettingsBuilder::build`] validates.
#[derive(Debug, Clone)]
#[must_use = "call `build` to get the settings"]
pub struct LeaseSettingsBuilder {
    name: String,
    owner: String,
    metadata: Option<String>,
    timing: TimingConfig,
}

impl LeaseSettingsBuilder {
    /// The lease name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The owner identity.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// What this owner writes about itself with every claim (see [`LeaseSettings::metadata`]).
    pub fn metadata(mut self, metadata: impl Into<String>) -> Self {
        self.metadata = Some(metadata.into());
        self
    }

    /// The time to live (default 30 s); at most [`LeaseSettings::MAX_DURATION`] (1 day).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.timing.ttl = Some(ttl);
        self
    }

    /// The renewal interval (default `ttl / 3`); at most `ttl / 2`.
    pub fn renewal_interval(mut self, interval: Duration) -> Self {
        self.timing.renewal_interval = Some(interval);
        self
    }

    /// The bound on each backend call (default `min(5 s, renewal_interval, (ttl -
    /// clock_drift_margin - renewal_interval) / 2)`); at most `(ttl - clock_drift_margin -
    /// renewal_interval) / 2`, so that a renewal that times out can be retried before the
    /// deadline.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.timing.operation_timeout = Some(timeout);
        self
    }

    /// Retries of `acquire` while another owner holds the lease (default 3).
    pub fn acquire_retries(mut self, retries: u32) -> Self {
        self.timing.acquire_retries = Some(retries);
        self
    }

    /// Delay between attempts of `acquire` (default 500 ms); at least
    /// [`MIN_ACQUIRE_RETRY_DELAY`] (10 ms), at most [`LeaseSettings::MAX_DURATION`] (1 day).
    pub fn acquire_retry_delay(mut self, delay: Duration) -> Self {
        self.timing.acquire_retry_delay = Some(delay);
        self
    }

    /// How much earlier than the TTL the holder gives up locally (default `max(ttl / 50, 100 ms)`,
    /// at most `ttl / 4`); at least `max(ttl / 1000, 1 ms)`, below `ttl / 2`.
    pub fn clock_drift_margin(mut self, margin: Duration) -> Self {
        self.timing.clock_drift_margin = Some(margin);
        self
    }

    /// Applies every field that is set in `timing` (configuration files use this).
    pub fn timing(mut self, timing: &TimingConfig) -> Self {
        self.timing = self.timing.overlay(timing);
        self
    }

    /// Validates and builds the settings.
    ///
    /// # Errors
    ///
    /// The first [`SettingsError`] found, naming its field.
    pub fn build(self) -> Result<LeaseSettings, SettingsError> {
        check_identifier("name", &self.name, MAX_NAME_LEN)?;
        check_identifier("owner", &self.owner, MAX_OWNER_LEN)?;
        if let Some(metadata) = &self.metadata {
            check_identifier("metadata", metadata, MAX_METADATA_LEN)?;
        }
        let t = &self.timing;
        for (field, value) in [
            ("ttl", t.ttl),
            ("renewal-interval", t.renewal_interval),
            ("operation-timeout", t.operation_timeout),
            ("acquire-retry-delay", t.acquire_retry_delay),
            ("clock-drift-margin", t.clock_drift_margin),
        ] {
            check_max_duration(field, value)?;
        }
        let ttl = t.ttl.unwrap_or(DEFAULT_TTL);
        if ttl.is_zero() {
            return Err(SettingsError::Zero { field: "ttl" });
        }
        let renewal_interval = t.renewal_interval.unwrap_or(ttl / 3);
        if renewal_interval.is_zero() {
            return Err(SettingsError::Zero {
                field: "renewal-interval",
            });
        }
        if renewal_interval > ttl / 2 {
            return Err(SettingsError::RenewalIntervalTooLong {
                interval: renewal_interval,
                ttl,
            });
        }
        let clock_drift_margin = t
            .clock_drift_margin
            .unwrap_or_else(|| (ttl / 50).max(MIN_DEFAULT_MARGIN).min(ttl / 4));
        let min_margin = (ttl / 1000).max(MIN_CLOCK_DRIFT_MARGIN);
        if clock_drift_margin < min_margin {
            return Err(SettingsError::DurationTooShort {
                field: "clock-drift-margin",
                value: clock_drift_margin,
                min: min_margin,
            });
        }
        if clock_drift_margin >= ttl / 2 {
            return Err(SettingsError::ClockDriftMarginTooLong {
                margin: clock_drift_margin,
                ttl,
            });
        }
        // One retry of a renewal that timed out must fit before the deadline.
        let max_timeout = (ttl - clock_drift_margin).saturating_sub(renewal_interval) / 2;
        let operation_timeout = t.operation_timeout.unwrap_or_else(|| {
            DEFAULT_OPERATION_TIMEOUT
                .min(renewal_interval)
                .min(max_timeout)
        });
        if operation_timeout.is_zero() {
            return Err(SettingsError::Zero {
                field: "operation-timeout",
            });
        }
        if operation_timeout > max_timeout {
            return Err(SettingsError::OperationTimeoutTooLong {
                timeout: operation_timeout,
                max: max_timeout,
            });
        }
        let acquire_retry_delay = t.acquire_retry_delay.unwrap_or(DEFAULT_ACQUIRE_RETRY_DELAY);
        if acquire_retry_delay < MIN_ACQUIRE_RETRY_DELAY {
            return Err(SettingsError::DurationTooShort {
                field: "acquire-retry-delay",
                value: acquire_retry_delay,
                min: MIN_ACQUIRE_RETRY_DELAY,
            });
        }
        Ok(LeaseSettings {
            name: self.name,
            owner: self.owner,
            ttl,
            renewal_interval,
            operation_timeout,
            acquire_retries: t.acquire_retries.unwrap_or(DEFAULT_ACQUIRE_RETRIES),
            acquire_retry_delay,
            clock_drift_margin,
            metadata: self.metadata,
        })
    }
}

/// The timing part of lease settings as it appears in configuration files; every field is
/// optional and falls back to the documented default.
///
/// Durations are written like `30s`, `500ms` or `1m 30s`
/// ([humantime](https://docs.rs/humantime) syntax); field names are kebab-case.
///
/// ```
/// # use actix_coordination::TimingConfig;
/// let timing: TimingConfig = serde_json::from_str(r#"{ "ttl": "15s", "acquire-retries": 5 }"#)?;
/// assert_eq!(timing.ttl, Some(std::time::Duration::from_secs(15)));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TimingConfig {
    /// See [`LeaseSettingsBuilder::ttl`].
    #[serde(default, with = "humantime_serde")]
    pub ttl: Option<Duration>,
    /// See [`LeaseSettingsBuilder::renewal_interval`].
    #[serde(default, with = "humantime_serde")]
    pub renewal_interval: Option<Duration>,
    /// See [`LeaseSettingsBuilder::operation_timeout`].
    #[serde(default, with = "humantime_serde")]
    pub operation_timeout: Option<Duration>,
    /// See [`LeaseSettingsBuilder::acquire_retries`]. A number, or a string holding one (as
    /// environment-driven configuration layers deliver it).
    #[serde(default, deserialize_with = "u32_or_string")]
    pub acquire_retries: Option<u32>,
    /// See [`LeaseSettingsBuilder::acquire_retry_delay`].
    #[serde(default, with = "humantime_serde")]
    pub acquire_retry_delay: Option<Duration>,
    /// See [`LeaseSettingsBuilder::clock_drift_margin`].
    #[serde(default, with = "humantime_serde")]
    pub clock_drift_margin: Option<Duration>,
}

impl TimingConfig {
    /// `self` with every field that `top` sets replaced by `top`'s value.
    pub fn overlay(&self, top: &TimingConfig) -> TimingConfig {
        TimingConfig {
            ttl: top.ttl.or(self.ttl),
            renewal_interval: top.renewal_interval.or(self.renewal_interval),
            operation_timeout: top.operation_timeout.or(self.operation_timeout),
            acquire_retries: top.acquire_retries.or(self.acquire_retries),
            acquire_retry_delay: top.acquire_retry_delay.or(self.acquire_retry_delay),
            clock_drift_margin: top.clock_drift_margin.or(self.clock_drift_margin),
        }
    }
}

/// Reads an optional `u32` written as a number (`3`) or as a string holding one (`"3"`).
fn u32_or_string<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<u32>, D::Error> {
    struct U32OrString;

    impl<'de> serde::de::Visitor<'de> for U32OrString {
        type Value = Option<u32>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a non-negative integer (at most 4294967295), or a string holding one")
        }

        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            u32::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u32::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            v.trim()
                .parse()
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: serde::Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
            de.deserialize_any(self)
        }
    }

    de.deserialize_any(U32OrString)
}

fn check_max_duration(field: &'static str, value: Option<Duration>) -> Result<(), SettingsError> {
    match value {
        Some(value) if value > LeaseSettings::MAX_DURATION => Err(SettingsError::DurationTooLong {
            field,
            value,
            max: LeaseSettings::MAX_DURATION,
        }),
        _ => Ok(()),
    }
}

/// What makes `value` unfit as an identifier of at most `max` bytes, if anything.
pub(crate) fn identifier_problem(value: &str, max: usize) -> Option<&'static str> {
    match check_identifier("owner", value, max) {
        Ok(()) => None,
        Err(SettingsError::Empty { .. }) => Some("it is empty"),
        Err(SettingsError::TooLong { .. }) => Some("it is longer than an owner identity may be"),
        Err(_) => Some("it contains a control character"),
    }
}

fn check_identifier(field: &'static str, value: &str, max: usize) -> Result<(), SettingsError> {
    if value.is_empty() {
        return Err(SettingsError::Empty { field });
    }
    if value.len() > max {
        return Err(SettingsError::TooLong {
            field,
            len: value.len(),
            max,
        });
    }
    if let Some(character) = value.chars().find(|c| c.is_control()) {
        return Err(SettingsError::ControlCharacter { field, character });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = LeaseSettings::new("lease", "owner").unwrap();
        assert_eq!(s.ttl(), secs(30));
        assert_eq!(s.renewal_interval(), secs(10));
        assert_eq!(s.operation_timeout(), secs(5));
        assert_eq!(s.acquire_retries(), 3);
        assert_eq!(s.acquire_retry_delay(), Duration::from_millis(500));
        assert_eq!(s.clock_drift_margin(), Duration::from_millis(600));
        assert_eq!(s.local_validity(), Duration::from_millis(29_400));
    }

    #[test]
    fn derived_defaults_follow_the_ttl() {
        let s = LeaseSettings::builder("lease", "owner")
            .ttl(secs(6))
            .build()
            .unwrap();
        assert_eq!(s.renewal_interval(), secs(2));
        // (6 s - 120 ms - 2 s) / 2: a renewal that times out is retried before the deadline.
        assert_eq!(s.operation_timeout(), Duration::from_millis(1940));
        assert_eq!(s.clock_drift_margin(), Duration::from_millis(120));
        let short = |ms| {
            LeaseSettings::builder("lease", "owner")
                .ttl(Duration::from_millis(ms))
                .build()
                .unwrap()
                .clock_drift_margin()
        };
        assert_eq!(short(3000), Duration::from_millis(100), "at least 100 ms");
        assert_eq!(
            short(200),
            Duration::from_millis(50),
            "at most a quarter of the ttl"
        );
    }

    #[test]
    fn every_invalid_field_is_named() {
        let b = || LeaseSettings::builder("lease", "owner");
        let cases: Vec<(Result<LeaseSettings, SettingsError>, &str)> = vec![
            (LeaseSettings::new("", "o"), "name"),
            (LeaseSettings::new("n", ""), "owner"),
            (
                LeaseSettings::new("x".repeat(MAX_NAME_LEN + 1), "o"),
                "name",
            ),
            (
                LeaseSettings::new("n", "o".repeat(MAX_OWNER_LEN + 1)),
                "owner",
            ),
            (LeaseSettings::new("n\n", "o"), "name"),
            (LeaseSettings::new("n", "o\0"), "owner"),
            (b().ttl(Duration::ZERO).build(), "ttl"),
            (
                b().renewal_interval(Duration::ZERO).build(),
                "renewal-interval",
            ),
            (b().renewal_interval(secs(16)).build(), "renewal-interval"),
            (b().renewal_interval(secs(30)).build(), "renewal-interval"),
            (
                b().operation_timeout(Duration::ZERO).build(),
                "operation-timeout",
            ),
            (b().operation_timeout(secs(30)).build(), "operation-timeout"),
            (
                b().clock_drift_margin(secs(15)).build(),
                "clock-drift-margin",
            ),
            (
                b().acquire_retry_delay(Duration::ZERO).build(),
                "acquire-retry-delay",
            ),
            (
                b().clock_drift_margin(Duration::ZERO).build(),
                "clock-drift-margin",
            ),
        ];
        for (result, field) in cases {
            let err = result.expect_err(field);
            assert_eq!(err.field(), field, "{err}");
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn boundaries_are_accepted() {
        let s = LeaseSettings::builder("x".repeat(MAX_NAME_LEN), "o".repeat(MAX_OWNER_LEN))
            .ttl(secs(10))
            .renewal_interval(secs(5))
            .operation_timeout(Duration::from_millis(2_495))
            .acquire_retries(0)
            .acquire_retry_delay(MIN_ACQUIRE_RETRY_DELAY)
            .clock_drift_margin(Duration::from_millis(10))
            .build()
            .unwrap();
        assert_eq!(s.local_validity(), Duration::from_millis(9_990));
    }

    #[test]
    fn durations_longer_than_a_day_are_rejected_by_field() {
        let over = LeaseSettings::MAX_DURATION + Duration::from_nanos(1);
        let b = || LeaseSettings::builder("lease", "owner");
        let cases: Vec<(LeaseSettingsBuilder, &str)> = vec![
            (b().ttl(over), "ttl"),
            (b().ttl(Duration::MAX), "ttl"),
            (b().renewal_interval(Duration::MAX), "renewal-interval"),
            (b().operation_timeout(Duration::MAX), "operation-timeout"),
            (b().acquire_retry_delay(over), "acquire-retry-delay"),
            (
                b().acquire_retry_delay(Duration::MAX),
                "acquire-retry-delay",
            ),
            (b().clock_drift_margin(Duration::MAX), "clock-drift-margin"),
            // A huge ttl is named even when the fields derived from it would be fine.
            (b().ttl(Duration::MAX).renewal_interval(secs(1)), "ttl"),
        ];
        for (builder, field) in cases {
            let err = builder.build().expect_err(field);
            assert_eq!(err.field(), field, "{err}");
            assert!(
                matches!(err, SettingsError::DurationTooLong { max, .. } if max == secs(86_400)),
                "{err:?}"
            );
            let message = err.to_string();
            assert!(message.contains(field), "{message}");
            assert!(message.contains("86400s"), "names the maximum: {message}");
        }
        // Through a configuration file, too.
        let timing: TimingConfig =
            serde_json::from_str(r#"{"ttl":"100years","acquire-retry-delay":"1s"}"#).unwrap();
        let err = b().timing(&timing).build().unwrap_err();
        assert_eq!(err.field(), "ttl");
    }

    #[test]
    fn durations_up_to_a_day_are_accepted_and_usable() {
        let day = LeaseSettings::MAX_DURATION;
        assert_eq!(day, secs(24 * 60 * 60));
        let s = LeaseSettings::builder("lease", "owner")
            .ttl(day)
            .acquire_retry_delay(day)
            .build()
            .unwrap();
        assert_eq!(s.ttl(), day);
        assert_eq!(s.acquire_retry_delay(), day);
        assert_eq!(s.renewal_interval(), secs(28_800));
        assert_eq!(s.clock_drift_margin(), Duration::from_millis(1_728_000));
        // What the leases and the singleton compute from the settings does not overflow.
        let now = tokio::time::Instant::now();
        assert!(now + s.local_validity() > now);
        assert!(now + s.acquire_retry_delay() > now);
        assert_eq!(s.ttl() * 2, secs(2 * 86_400));
        // Every bounded field at the maximum the relations allow.
        let s = LeaseSettings::builder("lease", "owner")
            .ttl(day)
            .renewal_interval(day / 2)
            .operation_timeout(secs(1))
            .clock_drift_margin(day / 2 - secs(2))
            .build()
            .unwrap();
        assert_eq!(s.renewal_interval(), day / 2);
    }

    /// The timing rules that keep a renewal retry before the deadline and a waiting lease from
    /// spinning: each violation is a typed error naming its field and its bound.
    #[test]
    fn timing_rules_keep_one_retry_before_the_deadline() {
        let b = || LeaseSettings::builder("lease", "owner").ttl(secs(30));
        // ttl 30 s, margin 600 ms, interval 10 s: at most (29.4 s - 10 s) / 2 = 9.7 s.
        let max = Duration::from_millis(9_700);
        assert_eq!(
            b().operation_timeout(max)
                .build()
                .unwrap()
                .operation_timeout(),
            max
        );
        let err = b()
            .operation_timeout(max + Duration::from_millis(1))
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            SettingsError::OperationTimeoutTooLong {
                timeout: max + Duration::from_millis(1),
                max
            }
        );
        assert!(
            err.to_string().contains("retried before the deadline"),
            "{err}"
        );
        // An operation timeout close to the ttl (it used to be accepted up to the ttl).
        let err = b().operation_timeout(secs(29)).build().unwrap_err();
        assert_eq!(err.field(), "operation-timeout");
        // The default adapts instead of breaking the rule.
        let s = b().renewal_interval(secs(14)).build().unwrap();
        assert_eq!(s.operation_timeout(), Duration::from_millis(5_000));
        let s = b()
            .renewal_interval(secs(14))
            .clock_drift_margin(secs(6))
            .build()
            .unwrap();
        assert_eq!(s.operation_timeout(), secs(5), "(30 - 6 - 14) / 2 = 5");
        let s = b()
            .renewal_interval(secs(15))
            .clock_drift_margin(secs(7))
            .build()
            .unwrap();
        assert_eq!(s.operation_timeout(), secs(4), "(30 - 7 - 15) / 2 = 4");
        // A zero (or too short) acquire-retry delay would spin against an unreachable backend.
        for delay in [Duration::ZERO, Duration::from_millis(9)] {
            let err = b().acquire_retry_delay(delay).build().unwrap_err();
            assert_eq!(
                err,
                SettingsError::DurationTooShort {
                    field: "acquire-retry-delay",
                    value: delay,
                    min: MIN_ACQUIRE_RETRY_DELAY
                }
            );
        }
        // The drift margin has a floor: max(ttl / 1000, 1 ms).
        let err = b().clock_drift_margin(Duration::ZERO).build().unwrap_err();
        assert_eq!(
            err,
            SettingsError::DurationTooShort {
                field: "clock-drift-margin",
                value: Duration::ZERO,
                min: Duration::from_millis(30)
            }
        );
        assert!(b()
            .clock_drift_margin(Duration::from_millis(30))
            .build()
            .is_ok());
        let short = LeaseSettings::builder("lease", "owner")
            .ttl(secs(1))
            .clock_drift_margin(Duration::from_micros(999))
            .build()
            .unwrap_err();
        assert!(
            matches!(short, SettingsError::DurationTooShort { min, .. } if min == Duration::from_millis(1)),
            "{short:?}"
        );
        // Through a configuration file too.
        let timing: TimingConfig = serde_json::from_str(r#"{"acquire-retry-delay":"0s"}"#).unwrap();
        let err = b().timing(&timing).build().unwrap_err();
        assert_eq!(err.field(), "acquire-retry-delay");
    }

    #[test]
    fn with_owner_validates() {
        let s = LeaseSettings::new("lease", "a").unwrap();
        assert_eq!(s.with_owner("b").unwrap().owner(), "b");
        assert_eq!(s.with_owner("").unwrap_err().field(), "owner");
    }

    #[test]
    fn timing_config_parses_humantime_and_rejects_unknown_fields() {
        let t: TimingConfig = serde_json::from_str(
            r#"{"ttl":"15s","renewal-interval":"5s","operation-timeout":"1500ms",
                "acquire-retries":2,"acquire-retry-delay":"250ms","clock-drift-margin":"100ms"}"#,
        )
        .unwrap();
        let s = LeaseSettings::builder("n", "o").timing(&t).build().unwrap();
        assert_eq!(s.ttl(), secs(15));
        assert_eq!(s.renewal_interval(), secs(5));
        assert_eq!(s.operation_timeout(), Duration::from_millis(1500));
        assert_eq!(s.acquire_retries(), 2);
        assert_eq!(s.acquire_retry_delay(), Duration::from_millis(250));
        assert_eq!(s.clock_drift_margin(), Duration::from_millis(100));
        // Numbers may come as strings (environment variables), or be null (unset).
        let t: TimingConfig =
            serde_json::from_str(r#"{"acquire-retries":" 4294967295 "}"#).unwrap();
        assert_eq!(t.acquire_retries, Some(u32::MAX));
        let t: TimingConfig = serde_json::from_str(r#"{"acquire-retries":null}"#).unwrap();
        assert_eq!(t.acquire_retries, None);
        for bad in [r#""3x""#, r#""-1""#, "-1", "4294967296", "2.5", "true"] {
            let json = format!(r#"{{"acquire-retries":{bad}}}"#);
            let err = serde_json::from_str::<TimingConfig>(&json).unwrap_err();
            assert!(
                err.to_string().contains("non-negative integer"),
                "{bad}: {err}"
            );
        }
        let err = serde_json::from_str::<TimingConfig>(r#"{"tll":"15s"}"#).unwrap_err();
        assert!(err.to_string().contains("tll"), "{err}");
        let err = serde_json::from_str::<TimingConfig>(r#"{"ttl":"15 parsecs"}"#).unwrap_err();
        assert!(
            err.to_string().contains("parsecs") || err.to_string().contains("unit"),
            "{err}"
        );
    }
}
