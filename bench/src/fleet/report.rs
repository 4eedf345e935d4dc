//! The scale-out table: one row per process count, the throughput run and
//! (for N ≥ 2) the kill run side by side, each throughput as a ratio to the
//! 1-process run of the same invocation.

use super::run::RunFigures;

/// One process count's runs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// Which round (`--rounds`).
    pub round: usize,
    /// The drain without a kill.
    pub throughput: RunFigures,
    /// One process with as many slots as this row's processes (`--control`).
    pub control: Option<RunFigures>,
    /// The run with worker 0 SIGKILLed under load, if any.
    pub killed: Option<RunFigures>,
    /// `events_per_s` ÷ the 1-process run's (None without one).
    pub ratio_to_one: Option<f64>,
}

/// Print the table (plain text, Markdown-compatible).
pub fn print(rows: &[Row]) {
    println!();
    println!(
        "| round | processes | events | events/s | steps/s | × 1 process | 1 process, same slots: events/s | claims (events/claim, ms) | short claims under backlog | lock waits | takeovers | killed: held (+ claimed by its connection after the kill), max wait to claim / done s (lease) | re-runs after kill | active backends | top wait events (% of active samples) | correct |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---|---|");
    for row in rows {
        let t = &row.throughput;
        let ratio = row
            .ratio_to_one
            .map_or("–".to_owned(), |r| format!("{r:.2}"));
        let kill = row
            .killed
            .as_ref()
            .and_then(|k| k.kill.as_ref().map(|f| (k, f)))
            .map_or("–".to_owned(), |(_, f)| {
                format!(
                    "{} (+{} after), {:.1} / {:.1} ({:.0} s)",
                    f.held - f.claimed_after_kill,
                    f.claimed_after_kill,
                    f.max_wait_to_claim_s,
                    f.max_wait_to_done_s,
                    f.lease_s
                )
            });
        let reruns = row
            .killed
            .as_ref()
            .map_or("–".to_owned(), |k| k.reruns.to_string());
        let waits = t
            .top_waits
            .iter()
            .map(|(e, share)| format!("{e} {share:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let control = row.control.as_ref().map_or("–".to_owned(), |c| {
            format!("{:.0} ({} slots)", c.events_per_s, c.concurrency)
        });
        let correct = t.correct
            && row.killed.as_ref().is_none_or(|k| k.correct)
            && row.control.as_ref().is_none_or(|c| c.correct);
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {} | {} | {} ({:.1}, {:.2}) | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
            row.round,
            t.processes,
            t.events,
            t.events_per_s,
            t.steps_per_s,
            ratio,
            control,
            t.claims,
            t.events_per_claim,
            t.claim_ms_mean,
            t.short_claims_under_backlog,
            t.lock_wait_samples,
            t.takeovers,
            kill,
            reruns,
            t.active_mean,
            waits,
            if correct { "yes" } else { "NO" },
        );
    }
    println!();
    println!(
        "| round | processes | commits/event (server) | WAL syncs/s | WAL KB/event | max connections | other sessions active | delivered/s (receivers) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let t = &row.throughput;
        println!(
            "| {} | {} | {:.2} | {:.0} | {:.2} | {} | {:.2} | {:.0} |",
            row.round,
            t.processes,
            t.commits_per_event,
            t.wal_syncs_per_s,
            t.wal_kb_per_event,
            t.max_connections,
            t.others_active_mean,
            t.accepted_per_s
        );
    }
    for row in rows {
        let runs = std::iter::once(&row.throughput)
            .chain(row.control.as_ref())
            .chain(row.killed.as_ref());
        for run in runs {
            for problem in &run.problems {
                println!("problem ({} processes): {problem}", run.processes);
            }
        }
    }
}
