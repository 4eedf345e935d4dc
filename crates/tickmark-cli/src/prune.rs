//! `tickmark prune`: forget finished events older than a window, in batches,
//! keeping a tombstone per event for the dedup window, and refusing a dedup
//! window shorter than the providers' retry windows.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::duration::{self, human};
use super::progress_line::ProgressLine;
use super::retry_windows::{longest, PROVIDER_RETRY_WINDOWS, UNKNOWN_SOURCE_WINDOW};
use super::{Failure, Output};
use tickmark_driver::store::admin::PruneBatch;
use tickmark_driver::store::Store;

/// The dedup window when `--dedup-window` is not given: the longest window
/// in which a provider may deliver an event again (Stripe's resend by hand,
/// 30 days), so a default prune never lets a redelivery run twice.
const DEFAULT_DEDUP_WINDOW: &str = "30d";

pub(crate) const LONG_ABOUT: &str = "\
Delete finished events (done, ignored, cancelled, stale, superseded; dead ones too with
--include-dead) received more than --older-than ago, oldest first, in batches of --batch
events per transaction, with their payloads, step rows and audit rows. Pending and running
events are never deleted. Safe against a running fleet, and safe to interrupt: each batch
commits on its own.

A deleted event received within --dedup-window leaves a tombstone: its source, a 16-byte
hash of its dedup key (and of its replay key), and when it was accepted, about 100 bytes.
A provider that redelivers it within the window gets a duplicate answer and nothing runs.
Tombstones older than the window are deleted by the same command; after that a redelivery
is accepted as new and runs again. So the dedup window must exceed the longest window in
which a provider may deliver again among the sources in the database (stripe 30d: it
retries for 3 days and resends by hand for 30; github 3d: it never retries, but redelivers
by hand for 3 days; standard_webhooks 3d, svix 28h, shopify 4h; any other source counts as
30d). A shorter one is refused unless --i-know. --older-than may be as short as you like:
it only decides how long payloads and step rows stay readable.";

pub(crate) const AFTER_HELP: &str = "\
Examples:
  tickmark prune --older-than 2d                      # payloads 2 days, dedup 30 days
  tickmark prune --older-than 1d --dedup-window 45d --include-dead --batch 5000
  tickmark prune --older-than 1h --dedup-window 1h --i-know   # a test database: no retries

Run it on a schedule (cron, a systemd timer) so the tables stay level: docs/operations.md.
Progress (batches, running total, rate) goes to stderr when it is a terminal, or with
--progress. Exits 4 when the window is refused.";

#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
    /// Delete events received longer ago than this (payload, steps, audit): 90s, 15m, 4h, 3d, 1w
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    older_than: Duration,
    /// Answer redeliveries of deleted events as duplicates for this long after they were accepted
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, default_value = DEFAULT_DEDUP_WINDOW)]
    dedup_window: Duration,
    /// Delete dead events too (they wait for an operator: deleting them gives them up)
    #[arg(long)]
    include_dead: bool,
    /// Allow a dedup window shorter than the providers' retry windows
    #[arg(long)]
    i_know: bool,
    /// Events (and tombstones) deleted per transaction
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// Show progress on stderr even when it is not a terminal
    #[arg(long)]
    progress: bool,
}

#[derive(Serialize)]
struct Pruned {
    deleted: u64,
    batches: u32,
    older_than_seconds: u64,
    dedup_window_seconds: u64,
    tombstones_expired: u64,
    include_dead: bool,
    states: Vec<&'static str>,
    seconds: f64,
}

pub(crate) async fn run(store: &dyn Store, out: Output, args: PruneArgs) -> Result<(), Failure> {
    // An event older than the dedup window is pruned without a tombstone: it
    // was remembered for --older-than, the longer of the two.
    let remembered = args.dedup_window.max(args.older_than);
    if !args.i_know {
        let sources = store.sources().await?;
        if let Some((source, window)) = longest(&sources) {
            if remembered < window {
                return Err(Failure::Refused(refusal(args.dedup_window, source, window)));
            }
        }
    }

    let mut states = vec!["done", "ignored", "cancelled", "stale", "superseded"];
    if args.include_dead {
        states.push("dead");
    }
    let prune = PruneBatch {
        older_than: args.older_than,
        dedup_window: args.dedup_window,
        include_dead: args.include_dead,
        batch: args.batch,
    };
    let progress = ProgressLine::new(args.progress);
    let started = Instant::now();
    let (mut deleted, mut batches) = (0_u64, 0_u32);
    loop {
        let batch = store.event_prune(&prune).await?;
        if batch > 0 {
            deleted += batch;
            batches += 1;
            progress.show(&batch_line(batches, deleted, started.elapsed()));
        }
        if batch < u64::from(args.batch) {
            break;
        }
    }
    let mut tombstones_expired = 0_u64;
    loop {
        let batch = store.tombstone_prune(args.dedup_window, args.batch).await?;
        tombstones_expired += batch;
        if batch < u64::from(args.batch) {
            break;
        }
    }
    progress.finish();

    let pruned = Pruned {
        deleted,
        batches,
        older_than_seconds: args.older_than.as_secs(),
        dedup_window_seconds: args.dedup_window.as_secs(),
        tombstones_expired,
        include_dead: args.include_dead,
        states,
        seconds: started.elapsed().as_secs_f64(),
    };
    out.emit(&pruned, || {
        format!(
            "deleted {} event(s) ({}) received more than {} ago, with their steps and audit \
             rows, in {} batch(es); those within the {} dedup window left tombstones; \
             {} tombstone(s) older than it expired\n",
            pruned.deleted,
            pruned.states.join(", "),
            human(args.older_than),
            pruned.batches,
            human(args.dedup_window),
            pruned.tombstones_expired,
        )
    })
}

fn refusal(dedup_window: Duration, source: &str, window: Duration) -> String {
    let known = PROVIDER_RETRY_WINDOWS
        .iter()
        .map(|(name, window, _)| format!("{name} {}", human(*window)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "--dedup-window {} is shorter than the retry window of source `{source}` ({}): a \
         redelivery of a pruned event would be accepted as new and run again. Use \
         --dedup-window {} or more (--older-than may stay short: tombstones keep the \
         dedup), or add --i-know if no provider will redeliver (retry windows: {known}; \
         other sources {})",
        human(dedup_window),
        human(window),
        human(window),
        human(UNKNOWN_SOURCE_WINDOW)
    )
}

/// Batches, running total and rate, as a progress line.
fn batch_line(batches: u32, deleted: u64, elapsed: Duration) -> String {
    let rate = deleted as f64 / elapsed.as_secs_f64().max(0.001);
    format!("pruned {batches} batch(es), {deleted} event(s), {rate:.0}/s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_source_the_window_and_the_way_out() {
        let text = refusal(
            Duration::from_secs(3600),
            "stripe",
            Duration::from_secs(30 * 86_400),
        );
        assert!(text.contains("--dedup-window 1h"), "{text}");
        assert!(text.contains("`stripe` (4w 2d)"), "{text}");
        assert!(text.contains("--i-know"), "{text}");
        assert!(text.contains("shopify 4h"), "{text}");
    }
}
