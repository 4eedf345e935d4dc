//! How a run reports its progress while it reads pages: the command line
//! draws a progress line from it; the scheduled reconciler logs.

use tickmark_driver::store::ReconcileSummary;

/// Told after each page a run has read and handled.
pub trait Progress: Send + Sync {
    /// `pages` pages read so far; `summary` holds the counts so far.
    fn page(&self, pages: u64, summary: &ReconcileSummary);
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn page(&self, _pages: u64, _summary: &ReconcileSummary) {}
}

/// Logs each page at `debug` through `tracing`, with the source.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogProgress;

impl Progress for LogProgress {
    fn page(&self, pages: u64, summary: &ReconcileSummary) {
        tracing::debug!(source = %summary.source, pages, counts = %summary.line(), "reconcile: page read");
    }
}
