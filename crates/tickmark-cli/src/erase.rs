//! `tickmark erase --subject kind=value`: erase what the database holds
//! about one subject, keeping what dedup needs (docs/privacy.md).

use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::progress_line::ProgressLine;
use super::{default_actor, Failure, Output};
use tickmark_core::privacy::{
    erase_subject, EraseReport, EraseRequest, PrivacyError, Subject, SubjectKey, SUBJECT_KEY_VAR,
};
use tickmark_driver::store::Store;

pub(crate) const LONG_ABOUT: &str = "\
Erase what tickmark holds about one subject: every event recorded with it (a handler's
`subject` rules found it in the payload) loses its payload, its steps' outputs and errors,
and its audit trail's free text. An event that had not ended (pending, waiting, dead,
parked) is cancelled: it never runs. Each event's row stays, with its dedup and replay
keys and its step-status rows, so a redelivery is still answered as a duplicate and no
step runs again.

An event running under a live lease finishes first: erase waits for it (--wait), then
erases it. What is still running when the wait runs out is listed, and erase exits 4:
run it again.

Subjects are stored as keyed hashes: TICKMARK_SUBJECT_KEY must be the key the engine
uses. What is not erased (the database's write-ahead log, backups, replicas, keys derived
from the payload such as an ordering or tenant key): docs/privacy.md.";

pub(crate) const AFTER_HELP: &str = "\
Examples:
  tickmark erase --subject customer=191167 --reason \"shopify customers/redact\"
  tickmark erase --subject email=jane@example.com --subject customer=191167
  tickmark erase --subject shop=acme.myshopify.com --wait 10m --json

Exit codes: 0 all erased; 2 no subject key, or a malformed --subject; 4 events still
running when --wait ran out (nothing else was left undone: run it again).";

#[derive(Debug, Args)]
pub(crate) struct EraseArgs {
    /// The subject, as `kind=value` (the kind a handler's `subject` rule names); repeatable
    #[arg(long = "subject", value_name = "KIND=VALUE", required = true)]
    subjects: Vec<String>,
    /// How long to wait for the subject's running events to finish
    #[arg(long, default_value = "5m", value_parser = super::duration::parse)]
    wait: Duration,
    /// Why (kept in the audit trail: say why, not whom)
    #[arg(long, default_value = "erasure requested")]
    reason: String,
    /// Who acts, for the audit trail [default: $USER@hostname]
    #[arg(long, value_name = "WHO")]
    actor: Option<String>,
    /// Print progress on stderr even when it is not a terminal
    #[arg(long)]
    progress: bool,
}

#[derive(Serialize)]
struct Erased {
    subject: String,
    erased: usize,
    cancelled: Vec<i64>,
    still_running: Vec<i64>,
}

pub(crate) async fn run(store: &dyn Store, out: Output, args: EraseArgs) -> Result<(), Failure> {
    let key = SubjectKey::from_env()
        .map_err(|error| Failure::Usage(error.to_string()))?
        .ok_or_else(|| {
            Failure::Usage(format!(
                "{SUBJECT_KEY_VAR} is not set: subjects are stored as keyed hashes, so erase \
                 needs the engine's subject key"
            ))
        })?;
    let subjects = args
        .subjects
        .iter()
        .map(|text| {
            Subject::parse(text).ok_or_else(|| {
                Failure::Usage(format!(
                    "--subject `{text}` is not `kind=value` (e.g. customer=191167)"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let actor = args.actor.clone().unwrap_or_else(default_actor);
    let request = EraseRequest {
        actor: &actor,
        reason: &args.reason,
        wait_for_running: args.wait,
        except_event: None,
    };
    let line = ProgressLine::new(args.progress);
    let mut results = Vec::new();
    for subject in &subjects {
        line.show(&format!("erasing {}=…", subject.kind));
        let report: EraseReport = erase_subject(store, &key, subject, &request)
            .await
            .map_err(|error| match error {
                PrivacyError::Store(error) => Failure::from(error),
                other => Failure::Other(other.to_string()),
            })?;
        results.push(Erased {
            // The kind only: the value is what is being erased.
            subject: subject.kind.clone(),
            erased: report.erased.len(),
            cancelled: report.cancelled,
            still_running: report.still_running,
        });
    }
    line.finish();
    let running: usize = results.iter().map(|r| r.still_running.len()).sum();
    out.emit(&results, || {
        let mut text = String::new();
        for result in &results {
            text.push_str(&format!(
                "{}: {} events erased ({} of them cancelled: they will not run)\n",
                result.subject,
                result.erased,
                result.cancelled.len()
            ));
            if !result.still_running.is_empty() {
                text.push_str(&format!(
                    "  still running, not erased: events {:?}; run erase again once they finish\n",
                    result.still_running
                ));
            }
        }
        text
    })?;
    if running > 0 {
        return Err(Failure::Refused(format!(
            "{running} events were still running when --wait ran out: run erase again"
        )));
    }
    Ok(())
}
