//! What one reconcile run found, as the reconciler stores it with its cursor
//! (`tickmark_reconcile_cursors.last_summary`) and the command line, the
//! dashboard and `/metrics` read it back. A leaf: it imports nothing of the
//! crate, so every layer that shows a run can read it.

use serde::{Deserialize, Serialize};

/// The counts of one run over one source, and what it could not do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileSummary {
    /// The receiver's source name the run reconciled.
    pub source: String,
    /// Which provider's API it read: `stripe`, `github` or `shopify`.
    pub provider: String,
    /// Nothing was recorded or redelivered; the counts say what would have been.
    pub dry_run: bool,
    /// Events (Stripe) or deliveries by GUID (GitHub) of a kind the handlers take.
    pub seen: u64,
    /// Of those, the ones the inbox already had (pushed earlier, or pulled by an earlier run).
    pub already_had: u64,
    /// Recorded into the inbox by this run (or, dry, that would have been).
    pub recorded: u64,
    /// GitHub: failed deliveries this run asked GitHub to send again (or,
    /// dry, would have); they arrive through the receiver.
    pub redelivered: u64,
    /// Events or deliveries this run could not record or redeliver.
    pub failed: u64,
    /// Listed by the provider, but of a kind no handler takes: not recorded.
    pub not_handled: u64,
    /// Pulled, but not recorded because the receiver would refuse it too
    /// (an id or kind it does not accept, a body over its limit); logged,
    /// and the first few named in `notes`.
    #[serde(default)]
    pub refused: u64,
    /// Every page up to the newest was read (the cursor moved, unless dry).
    pub complete: bool,
    /// Shopify: the webhook subscriptions the handlers need that Shopify does
    /// not have (removed after failed deliveries, or never made).
    pub missing_subscriptions: Vec<MissingSubscription>,
    /// What an operator should know about this run (a cursor past the
    /// provider's horizon, a page that failed), in words.
    pub notes: Vec<String>,
    /// Why the run failed, in words, when it did (the provider's API
    /// unreachable or refusing, a key of another account): the run ended
    /// there, the cursor kept what was done, and the next run resumes from
    /// it. The failure's time is the row's `last_run_finished_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A webhook subscription the handlers need and the provider does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingSubscription {
    /// The topic as the handlers name it (`orders/create`).
    pub topic: String,
    /// Where deliveries of it should go: the receiver's URL for the source.
    pub callback_url: String,
}

// Every build reads summaries back (`/metrics`); only one with the
// `reconcile` feature makes them or words them.
#[cfg_attr(not(feature = "reconcile"), allow(dead_code))]
impl ReconcileSummary {
    /// The summary as stored with a source's cursor
    /// (`ReconcileCursor::last_summary`); `None` for none stored, or one
    /// this build cannot read.
    pub fn from_stored(text: Option<&str>) -> Option<Self> {
        serde_json::from_str(text?).ok()
    }

    /// An empty summary of a run over `source` through `provider`'s API.
    pub fn new(source: &str, provider: &str, dry_run: bool) -> Self {
        Self {
            source: source.to_owned(),
            provider: provider.to_owned(),
            dry_run,
            ..Self::default()
        }
    }

    /// One line for people: `seen 12, already had 9, recorded 3, failed 0`
    /// (`would record 3` when dry).
    pub fn line(&self) -> String {
        let (record, redeliver) = if self.dry_run {
            ("would record", "would redeliver")
        } else {
            ("recorded", "redelivered")
        };
        let mut parts = vec![
            format!("seen {}", self.seen),
            format!("already had {}", self.already_had),
            format!("{record} {}", self.recorded),
        ];
        if self.provider == "github" {
            parts.push(format!("{redeliver} {}", self.redelivered));
        }
        parts.push(format!("failed {}", self.failed));
        if self.not_handled > 0 {
            parts.push(format!("not handled {}", self.not_handled));
        }
        if self.refused > 0 {
            parts.push(format!("refused {}", self.refused));
        }
        if !self.missing_subscriptions.is_empty() {
            parts.push(format!(
                "missing subscriptions {}",
                self.missing_subscriptions.len()
            ));
        }
        parts.join(", ")
    }
}
