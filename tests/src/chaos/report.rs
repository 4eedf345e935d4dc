//! The figures of a chaos run, the checks made on them, and how they are
//! printed: a table for people, then one JSON line for tools.

use serde::Serialize;

/// Everything a run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// The plan's seed (rerun with `--seed` for the same plan).
    pub seed: u64,
    /// Node processes at a time.
    pub nodes: usize,
    /// The lease, in milliseconds.
    pub lease_ms: u64,
    /// How long `render_invoice` works, in milliseconds.
    pub render_ms: u64,
    /// Length of the chaos phase, in seconds.
    pub chaos_secs: f64,
    /// From the end of the chaos phase to every event done, in seconds.
    pub drain_secs: f64,
    /// The whole run, in seconds.
    pub total_secs: f64,

    /// Distinct events sent.
    pub events_sent: u64,
    /// Deliveries (1 to 5 per event).
    pub deliveries: u64,
    /// HTTP attempts, retries included.
    pub attempts: u64,
    /// Deliveries answered `new`.
    pub answered_new: u64,
    /// Deliveries answered `duplicate`.
    pub answered_duplicate: u64,
    /// 503 answers seen (database down).
    pub answers_503: u64,
    /// Refused or broken connections (node killed or restarting).
    pub connection_errors: u64,
    /// Attempts with no answer in time (a frozen node).
    pub timeouts: u64,
    /// Answers that were neither 2xx nor 503.
    pub unexpected_answers: u64,
    /// Examples of them.
    pub unexpected_samples: Vec<String>,
    /// Deliveries that never got a 2xx.
    pub given_up: u64,

    /// SIGKILLs.
    pub kills: u64,
    /// Nodes SIGSTOPped past their lease, then resumed.
    pub zombies: u64,
    /// Lines of the zombie's log after it resumed that say it was fenced:
    /// `mark refused`, `lease lost`, `lease expired before a heartbeat`.
    pub zombie_fenced: u64,
    /// PostgreSQL restarts with `-m immediate`.
    pub db_restarts: u64,
    /// How long the database was down, in milliseconds.
    pub db_down_ms: u64,

    /// Rows in `tickmark_events`.
    pub events_accepted: i64,
    /// Rows in state `done`.
    pub events_done: i64,
    /// Rows still `pending` or `running`.
    pub events_active: i64,
    /// Rows `dead` or `parked`.
    pub events_stuck: i64,
    /// Customers whose balance was checked.
    pub customers: usize,
    /// Customers whose balance is not the sum of their distinct events.
    pub ledger_mismatches: usize,
    /// Invoice files written (one per event; a re-run overwrites).
    pub invoices: usize,

    /// POSTs the receipt service received.
    pub receipt_calls: u64,
    /// Distinct `Idempotency-Key`s among them.
    pub receipt_keys: u64,
    /// Whether those keys are exactly `stripe:<event>:send_receipt` for each event.
    pub receipt_keys_match_events: bool,

    /// Steps marked done.
    pub steps_done: i64,
    /// Step runs beyond the first: Σ (attempts − 1) over done steps.
    pub steps_rerun: i64,
    /// Claims that took over an expired lease: Σ `tickmark_events.takeovers`.
    pub takeovers: i64,
    /// Retryable step failures the nodes logged (`step failed`).
    pub failed_attempts: u64,
    /// `mark refused` lines, all nodes.
    pub marks_refused: u64,
    /// `lease lost` and `lease expired before a heartbeat` lines, all nodes.
    pub leases_lost: u64,
    /// Panics logged.
    pub panics: u64,

    /// Events held by a node when it was killed.
    pub orphaned_by_kills: usize,
    /// The longest of their waits until another node claimed them, in ms.
    pub longest_wait_after_kill_ms: Option<u64>,
    /// Events held by the zombie when it was frozen.
    pub orphaned_by_freeze: usize,
    /// The longest of their waits, in ms.
    pub longest_wait_after_freeze_ms: Option<u64>,
    /// Orphans never claimed again (should be none).
    pub orphans_left: usize,
    /// Nodes that exited cleanly on the final SIGTERM.
    pub clean_exits: usize,
    /// With `--failover`: what the failover cost.
    pub failover: Option<FailoverFigures>,
}

/// What a failover (`--failover`) cost: the primary killed with
/// `-m immediate` while deliveries continue, the standby promoted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FailoverFigures {
    /// `sync` (`synchronous_standby_names` names the standby) or `async`.
    pub replication: String,
    /// How long before the kill the standby was cut off (`--cut-standby-ms`).
    pub standby_cut_ms: u64,
    /// Distinct events answered 2xx before the promotion (all by the old
    /// primary: nothing else accepted writes).
    pub acked_before_kill: u64,
    /// Of those, events the standby did not have when it was promoted
    /// (after replaying all it had received): acknowledged, then lost.
    pub acked_lost: u64,
    /// The first few of them.
    pub acked_lost_samples: Vec<String>,
    /// From the kill until `pg_ctl promote` returned, in ms.
    pub kill_to_promoted_ms: u64,
    /// From the kill until the first 2xx to a delivery attempt sent after
    /// it: deliveries accepted again, in ms.
    pub kill_to_accepted_ms: Option<u64>,
    /// With `--failover auto`: the old primary's return as a standby.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejoin: Option<RejoinFigures>,
}

/// With `--failover auto` (pg_auto_failover): the old primary, its keeper
/// started again after the promotion, rejoins as a standby; after the drain
/// it must hold exactly what the new primary holds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RejoinFigures {
    /// From the keeper's restart until the monitor had it as the secondary
    /// (rewound, streaming) and it was in recovery, in ms; `None`: it did
    /// not rejoin in time.
    pub rejoined_ms: Option<u64>,
    /// Why it did not rejoin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejoin_error: Option<String>,
    /// After the drain: the old primary is in recovery.
    pub in_recovery: bool,
    /// The timeline the old primary receives WAL on (-1: not streaming).
    pub old_primary_timeline: i64,
    /// The new primary's timeline.
    pub new_primary_timeline: i64,
    /// Rows in `tickmark_events` on the old primary, once it replayed all
    /// the new primary wrote.
    pub events_on_old_primary: i64,
    /// Rows in `tickmark_events` on the new primary.
    pub events_on_new_primary: i64,
    /// `tickmark_events`, `tickmark_steps` and `accounts` are the same, row
    /// for row, on both (count and MD5 of the rows as text).
    pub rows_match: bool,
}

/// One check and whether it held.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is checked.
    pub name: &'static str,
    /// Whether it held.
    pub ok: bool,
    /// The numbers behind it.
    pub detail: String,
}

impl Figures {
    /// The checks of `docs/chaos.md`, in order.
    pub fn checks(&self) -> Vec<Check> {
        let check = |name, ok, detail: String| Check { name, ok, detail };
        let rerun_bound = self.kills as i64 + self.takeovers + self.failed_attempts as i64;
        let mut checks = vec![
            check(
                "every event sent was accepted once",
                self.events_accepted == self.events_sent as i64,
                format!(
                    "{} rows for {} events",
                    self.events_accepted, self.events_sent
                ),
            ),
            check(
                "every delivery got a 2xx",
                self.given_up == 0 && self.unexpected_answers == 0,
                format!(
                    "{} given up, {} unexpected answers {:?}",
                    self.given_up, self.unexpected_answers, self.unexpected_samples
                ),
            ),
            check(
                "every accepted event is done (none lost, none stuck)",
                self.events_done == self.events_accepted
                    && self.events_active == 0
                    && self.events_stuck == 0,
                format!(
                    "{} done, {} active, {} dead or parked",
                    self.events_done, self.events_active, self.events_stuck
                ),
            ),
            check(
                "every balance is the sum of its distinct events (credited exactly once)",
                self.ledger_mismatches == 0,
                format!(
                    "{} of {} customers wrong",
                    self.ledger_mismatches, self.customers
                ),
            ),
            check(
                "receipt calls >= distinct keys = events (every re-run absorbed by its key)",
                self.receipt_calls >= self.receipt_keys
                    && self.receipt_keys == self.events_sent
                    && self.receipt_keys_match_events,
                format!(
                    "{} calls, {} keys, {} events, keys match: {}",
                    self.receipt_calls,
                    self.receipt_keys,
                    self.events_sent,
                    self.receipt_keys_match_events
                ),
            ),
            check(
                "steps re-run <= kills + takeovers + failed attempts",
                self.steps_rerun <= rerun_bound,
                format!(
                    "{} re-runs; {} kills + {} takeovers + {} failed attempts = {rerun_bound}",
                    self.steps_rerun, self.kills, self.takeovers, self.failed_attempts
                ),
            ),
            check(
                "every orphaned event was claimed again",
                self.orphans_left == 0,
                format!("{} left", self.orphans_left),
            ),
            check(
                "one invoice file per event",
                self.invoices == self.events_sent as usize,
                format!("{} files", self.invoices),
            ),
            check(
                "no panics",
                self.panics == 0,
                format!("{} lines", self.panics),
            ),
            check(
                "every node stopped cleanly on SIGTERM",
                self.clean_exits == self.nodes,
                format!("{} of {}", self.clean_exits, self.nodes),
            ),
        ];
        if self.zombies > 0 {
            checks.push(check(
                "the zombie was fenced (mark refused or lease lost)",
                self.zombie_fenced > 0,
                format!("{} lines", self.zombie_fenced),
            ));
        }
        if self.db_restarts > 0 {
            checks.push(check(
                "503 answered while the database was down",
                self.answers_503 > 0,
                format!("{} answers", self.answers_503),
            ));
        }
        if let Some(failover) = &self.failover {
            checks.push(check(
                "503 answered while no primary was reachable",
                self.answers_503 > 0,
                format!("{} answers", self.answers_503),
            ));
            checks.push(check(
                "no acknowledged delivery lost in the failover",
                failover.acked_lost == 0,
                format!(
                    "{} of {} acknowledged events missing on the promoted standby {:?}",
                    failover.acked_lost, failover.acked_before_kill, failover.acked_lost_samples
                ),
            ));
            checks.push(check(
                "deliveries accepted again after the failover, without restarting a node",
                failover.kill_to_accepted_ms.is_some(),
                format!("{:?} ms after the kill", failover.kill_to_accepted_ms),
            ));
            if let Some(rejoin) = &failover.rejoin {
                checks.push(check(
                    "the old primary rejoined as a standby of the new primary",
                    rejoin.rejoined_ms.is_some()
                        && rejoin.in_recovery
                        && rejoin.old_primary_timeline == rejoin.new_primary_timeline,
                    format!(
                        "in {}; in recovery: {}, timeline {} (new primary: {}){}",
                        rejoin
                            .rejoined_ms
                            .map_or_else(|| "-".to_owned(), |v| format!("{v} ms")),
                        rejoin.in_recovery,
                        rejoin.old_primary_timeline,
                        rejoin.new_primary_timeline,
                        rejoin
                            .rejoin_error
                            .as_ref()
                            .map_or_else(String::new, |e| format!("; {e}"))
                    ),
                ));
                checks.push(check(
                    "no write of tickmark landed on the old primary (its rows are the new primary's)",
                    rejoin.rows_match,
                    format!(
                        "{} events on the old primary, {} on the new one",
                        rejoin.events_on_old_primary, rejoin.events_on_new_primary
                    ),
                ));
            }
        }
        checks
    }

    /// The table, for people.
    pub fn table(&self) -> String {
        let ms = |value: Option<u64>| value.map_or_else(|| "-".to_owned(), |v| format!("{v} ms"));
        let rows: Vec<(&str, String)> = vec![
            (
                "run",
                format!(
                    "{} nodes on {}, seed {}, lease {} ms, render {} ms",
                    self.nodes, self.backend, self.seed, self.lease_ms, self.render_ms
                ),
            ),
            (
                "time",
                format!(
                    "chaos {:.1} s, drain {:.1} s, total {:.1} s",
                    self.chaos_secs, self.drain_secs, self.total_secs
                ),
            ),
            ("events sent (distinct)", self.events_sent.to_string()),
            (
                "deliveries / attempts",
                format!("{} / {}", self.deliveries, self.attempts),
            ),
            (
                "answered new / duplicate",
                format!("{} / {}", self.answered_new, self.answered_duplicate),
            ),
            ("503s seen (database down)", self.answers_503.to_string()),
            (
                "connection errors / timeouts",
                format!("{} / {}", self.connection_errors, self.timeouts),
            ),
            (
                "unexpected answers / given up",
                format!("{} / {}", self.unexpected_answers, self.given_up),
            ),
            ("SIGKILLs", self.kills.to_string()),
            (
                "zombies (SIGSTOP past the lease)",
                format!("{}, fenced lines {}", self.zombies, self.zombie_fenced),
            ),
            (
                "PostgreSQL restarts (-m immediate)",
                format!("{}, down {} ms", self.db_restarts, self.db_down_ms),
            ),
            ("events accepted (rows)", self.events_accepted.to_string()),
            (
                "events done / active / dead+parked",
                format!(
                    "{} / {} / {}",
                    self.events_done, self.events_active, self.events_stuck
                ),
            ),
            (
                "ledger",
                format!(
                    "{} customers, {} wrong",
                    self.customers, self.ledger_mismatches
                ),
            ),
            ("invoice files", self.invoices.to_string()),
            (
                "receipt calls / distinct keys",
                format!("{} / {}", self.receipt_calls, self.receipt_keys),
            ),
            (
                "steps done / re-run",
                format!("{} / {}", self.steps_done, self.steps_rerun),
            ),
            (
                "takeovers / failed attempts",
                format!("{} / {}", self.takeovers, self.failed_attempts),
            ),
            (
                "marks refused / leases lost",
                format!("{} / {}", self.marks_refused, self.leases_lost),
            ),
            (
                "orphaned by kills, longest wait",
                format!(
                    "{}, {}",
                    self.orphaned_by_kills,
                    ms(self.longest_wait_after_kill_ms)
                ),
            ),
            (
                "orphaned by the freeze, longest wait",
                format!(
                    "{}, {}",
                    self.orphaned_by_freeze,
                    ms(self.longest_wait_after_freeze_ms)
                ),
            ),
            (
                "clean exits on SIGTERM",
                format!("{} of {}", self.clean_exits, self.nodes),
            ),
        ];
        let mut rows = rows;
        if let Some(failover) = &self.failover {
            rows.push((
                "failover (primary killed, standby promoted)",
                format!(
                    "{} replication, standby cut {} ms before; promoted {} ms after the kill, \
                     accepting again after {}",
                    failover.replication,
                    failover.standby_cut_ms,
                    failover.kill_to_promoted_ms,
                    ms(failover.kill_to_accepted_ms)
                ),
            ));
            rows.push((
                "acknowledged before the kill / lost",
                format!("{} / {}", failover.acked_before_kill, failover.acked_lost),
            ));
            if let Some(rejoin) = &failover.rejoin {
                rows.push((
                    "old primary rejoined (keeper restart -> standby)",
                    format!(
                        "{}; {} events there, {} on the new primary; rows match: {}",
                        ms(rejoin.rejoined_ms),
                        rejoin.events_on_old_primary,
                        rejoin.events_on_new_primary,
                        rejoin.rows_match
                    ),
                ));
            }
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (key, value) in rows {
            out.push_str(&format!("{key:<width$}  {value}\n"));
        }
        out
    }

    /// The JSON line: the figures, `ok`, and the names of failed checks.
    pub fn json_line(&self) -> String {
        let checks = self.checks();
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            object.insert("ok".into(), checks.iter().all(|c| c.ok).into());
            let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
            object.insert("failed".into(), serde_json::json!(failed));
        }
        value.to_string()
    }
}
