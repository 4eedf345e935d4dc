//! How a worker runs: concurrency, lease, heartbeat, polling, grace period.

use std::collections::BTreeMap;
use std::time::Duration;

/// A worker's settings that could never run correctly. Checked when the
/// worker is built ([`Engine::worker`](crate::Engine::worker)), before anything runs.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerConfigError {
    /// A zero lease expires as it is granted: every step would be taken over.
    #[error("the lease must be longer than zero (WorkerConfig::with_lease); 30 s is the default")]
    ZeroLease,
    /// The heartbeat must tick, and more often than the lease runs out.
    #[error(
        "the heartbeat interval ({heartbeat:?}) must be above zero and shorter than the lease \
         ({lease:?}), or leases run out under running steps; a third of the lease is the default"
    )]
    HeartbeatNotWithinLease {
        /// The configured heartbeat interval.
        heartbeat: Duration,
        /// The configured lease.
        lease: Duration,
    },
    /// Idle polling needs an interval above zero (zero would spin).
    #[error("poll_every must be above zero (WorkerConfig::with_poll_every); 2 s is the default")]
    ZeroPollInterval,
    /// A worker that may run no event at once never runs anything.
    #[error("concurrency must be at least 1 (WorkerConfig::with_concurrency)")]
    ZeroConcurrency,
    /// A claim of zero events claims nothing.
    #[error("claim_batch must be at least 1")]
    ZeroClaimBatch,
    /// A source or kind limit of zero would hold its events forever.
    #[error("the concurrency limit for `{0}` must be at least 1")]
    ZeroLimit(String),
}

/// A worker's settings. The defaults suit handlers from milliseconds to hours.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Stored as the lease owner; shows in the step-status table.
    pub name: String,
    /// Events run at once by this worker.
    pub concurrency: usize,
    /// Most events leased by one claim.
    pub claim_batch: u32,
    /// Most events claimed ahead of a free slot, while events finish quickly
    /// (each waits holding its lease, so claims are few and big, and their
    /// round trips overlap running work); never more than the slots start
    /// within a heartbeat interval at the recent pace. Ignored once events
    /// take long: then nothing is claimed ahead, and what was is given back.
    /// An event claimed ahead that waited a heartbeat interval for a slot
    /// (behind slow work) is given back too, for other workers to run; at
    /// shutdown they all are, within the grace period. A worker that dies
    /// holding them costs them no attempt (docs/guarantees.md, exact blame).
    pub prefetch: usize,
    /// How long a claim or heartbeat leases an event. After a crash, the event
    /// resumes at most this long after the last heartbeat.
    pub lease: Duration,
    /// How often held leases are renewed (default: a third of the lease).
    pub heartbeat_every: Duration,
    /// Idle workers check for due events this often, in case a wake-up was
    /// missed (another process on the same SQLite file, a dropped listener).
    pub poll_every: Duration,
    /// On shutdown, running steps get this long to finish before they are cancelled.
    pub grace: Duration,
    /// At most this many events of a source run at once in this worker.
    pub source_limits: BTreeMap<String, usize>,
    /// At most this many events of a (source, kind) run at once in this worker.
    pub kind_limits: BTreeMap<(String, String), usize>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        let lease = Duration::from_secs(30);
        Self {
            name: default_name(),
            concurrency: 16,
            claim_batch: claim_batch_for(16),
            prefetch: prefetch_for(16),
            lease,
            heartbeat_every: lease / 3,
            poll_every: Duration::from_secs(2),
            grace: Duration::from_secs(10),
            source_limits: BTreeMap::new(),
            kind_limits: BTreeMap::new(),
        }
    }
}

/// Events claimed ahead per slot while events are quick, by default.
const PREFETCH_PER_SLOT: usize = 32;

/// The most events claimed ahead by default, whatever the concurrency.
const MAX_PREFETCH: usize = 512;

/// The most events one claim leases by default.
const MAX_CLAIM_BATCH: usize = 256;

/// The default prefetch at `concurrency`.
fn prefetch_for(concurrency: usize) -> usize {
    (concurrency * PREFETCH_PER_SLOT).min(MAX_PREFETCH)
}

/// The default claim batch at `concurrency`: the slots' worth, and more
/// while claiming ahead, up to [`MAX_CLAIM_BATCH`].
fn claim_batch_for(concurrency: usize) -> u32 {
    let batch = concurrency.max((concurrency + prefetch_for(concurrency)).min(MAX_CLAIM_BATCH));
    u32::try_from(batch).unwrap_or(u32::MAX)
}

impl WorkerConfig {
    /// Set the lease, and the heartbeat to a third of it.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.heartbeat_every = lease / 3;
        self
    }

    /// Set concurrency, and the claim batch to match.
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self.claim_batch = claim_batch_for(self.concurrency);
        self.prefetch = prefetch_for(self.concurrency);
        self
    }

    /// Set the worker's name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Set the grace period on shutdown.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Run at most `limit` events of `source` at once in this worker (the
    /// claim skips the source while it is full). Per worker process: a fleet
    /// of N workers runs up to N × `limit`.
    pub fn with_source_limit(mut self, source: impl Into<String>, limit: usize) -> Self {
        self.source_limits.insert(source.into(), limit.max(1));
        self
    }

    /// Run at most `limit` events of (`source`, `kind`) at once in this worker.
    pub fn with_kind_limit(
        mut self,
        source: impl Into<String>,
        kind: impl Into<String>,
        limit: usize,
    ) -> Self {
        self.kind_limits
            .insert((source.into(), kind.into()), limit.max(1));
        self
    }

    /// Set the idle polling interval.
    pub fn with_poll_every(mut self, every: Duration) -> Self {
        self.poll_every = every;
        self
    }

    /// Set how many events may be claimed ahead of a free slot (0: none).
    pub fn with_prefetch(mut self, prefetch: usize) -> Self {
        self.prefetch = prefetch;
        self
    }
}

impl WorkerConfig {
    /// Check settings a worker could never run correctly with (a zero lease,
    /// a heartbeat not shorter than the lease, zero concurrency or polling).
    pub fn validate(&self) -> Result<(), WorkerConfigError> {
        if self.lease.is_zero() {
            return Err(WorkerConfigError::ZeroLease);
        }
        if self.heartbeat_every.is_zero() || self.heartbeat_every >= self.lease {
            return Err(WorkerConfigError::HeartbeatNotWithinLease {
                heartbeat: self.heartbeat_every,
                lease: self.lease,
            });
        }
        if self.poll_every.is_zero() {
            return Err(WorkerConfigError::ZeroPollInterval);
        }
        if self.concurrency == 0 {
            return Err(WorkerConfigError::ZeroConcurrency);
        }
        if self.claim_batch == 0 {
            return Err(WorkerConfigError::ZeroClaimBatch);
        }
        let zero_source = self.source_limits.iter().find(|(_, limit)| **limit == 0);
        if let Some((source, _)) = zero_source {
            return Err(WorkerConfigError::ZeroLimit(source.clone()));
        }
        let zero_kind = self.kind_limits.iter().find(|(_, limit)| **limit == 0);
        if let Some(((source, kind), _)) = zero_kind {
            return Err(WorkerConfigError::ZeroLimit(format!("{source}/{kind}")));
        }
        Ok(())
    }
}

fn default_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    format!(
        "{host}:{}:{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_and_the_builders_are_valid() {
        assert_eq!(WorkerConfig::default().validate(), Ok(()));
        let built = WorkerConfig::default()
            .with_lease(Duration::from_millis(300))
            .with_concurrency(1)
            .with_poll_every(Duration::from_millis(1));
        assert_eq!(built.validate(), Ok(()));
    }

    #[test]
    fn settings_that_could_never_run_are_refused() {
        let zero_lease = WorkerConfig::default().with_lease(Duration::ZERO);
        assert_eq!(zero_lease.validate(), Err(WorkerConfigError::ZeroLease));

        let no_heartbeat = WorkerConfig {
            heartbeat_every: Duration::ZERO,
            ..WorkerConfig::default()
        };
        assert!(matches!(
            no_heartbeat.validate(),
            Err(WorkerConfigError::HeartbeatNotWithinLease { .. })
        ));
        let late_heartbeat = WorkerConfig {
            heartbeat_every: Duration::from_secs(30),
            ..WorkerConfig::default()
        };
        assert!(matches!(
            late_heartbeat.validate(),
            Err(WorkerConfigError::HeartbeatNotWithinLease { .. })
        ));
        let no_polling = WorkerConfig::default().with_poll_every(Duration::ZERO);
        assert_eq!(
            no_polling.validate(),
            Err(WorkerConfigError::ZeroPollInterval)
        );
        let no_slots = WorkerConfig {
            concurrency: 0,
            ..WorkerConfig::default()
        };
        assert_eq!(no_slots.validate(), Err(WorkerConfigError::ZeroConcurrency));
        let mut zero_limit = WorkerConfig::default();
        zero_limit.source_limits.insert("shop".into(), 0);
        assert_eq!(
            zero_limit.validate(),
            Err(WorkerConfigError::ZeroLimit("shop".into()))
        );
    }
}
