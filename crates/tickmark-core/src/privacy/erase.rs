//! Erase a subject: every event recorded with its hash loses its payload,
//! outputs and free text, in batches; events running under a live lease
//! finish first (or lose their lease), and are erased by a later pass.

use std::time::Duration;

use tickmark_driver::store::privacy::SubjectErase;
use tickmark_driver::store::Store;

use super::{PrivacyError, Subject, SubjectKey};

/// Events erased per transaction.
const BATCH: u32 = 500;

/// How often a waiting erasure looks again at the events still running.
const RECHECK: Duration = Duration::from_millis(500);

/// Who asks to erase a subject, and how long to wait for its running events.
#[derive(Debug, Clone)]
pub struct EraseRequest<'a> {
    /// Who asked (audited: `$USER@host`, `shopify customers/redact`).
    pub actor: &'a str,
    /// Why (audited; say why, not whom).
    pub reason: &'a str,
    /// How long to wait for the subject's running events to finish; they
    /// are left unerased when it runs out, and reported.
    pub wait_for_running: Duration,
    /// An event to leave out: the one whose step asks (a compliance
    /// webhook's own event, which is running).
    pub except_event: Option<i64>,
}

/// What an erasure did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EraseReport {
    /// Events erased, by row number.
    pub erased: Vec<i64>,
    /// Of those, the ones that had not ended: cancelled, they never run.
    pub cancelled: Vec<i64>,
    /// Events still running when the wait ran out: not erased; erase again.
    pub still_running: Vec<i64>,
}

impl EraseReport {
    /// Whether every event of the subject is erased.
    pub fn is_complete(&self) -> bool {
        self.still_running.is_empty()
    }
}

/// Erase `subject` (hashed with `key`) in `store`, as `request` says:
/// fenced and audited, one batch per transaction. Dedup and replay keys and
/// the step-status rows stay, so a redelivery is a duplicate and no step
/// runs again. Safe to repeat: an erased event is not erased twice.
pub async fn erase_subject(
    store: &dyn Store,
    key: &SubjectKey,
    subject: &Subject,
    request: &EraseRequest<'_>,
) -> Result<EraseReport, PrivacyError> {
    let subject_hash = key.hash(subject);
    let erase = SubjectErase {
        subject_hash: &subject_hash,
        actor: request.actor,
        reason: request.reason,
        except_event: request.except_event,
        batch: BATCH,
    };
    let started = tokio::time::Instant::now();
    let mut report = EraseReport::default();
    loop {
        let batch = store.subject_erase(&erase).await?;
        let full = batch.erased.len() >= BATCH as usize;
        report.erased.extend(batch.erased);
        report.cancelled.extend(batch.cancelled);
        report.still_running = batch.running;
        if full {
            continue;
        }
        if report.still_running.is_empty() || started.elapsed() >= request.wait_for_running {
            break;
        }
        tracing::info!(
            running = report.still_running.len(),
            "erase: waiting for the subject's running events to finish"
        );
        tokio::time::sleep(RECHECK).await;
    }
    tracing::info!(
        erased = report.erased.len(),
        cancelled = report.cancelled.len(),
        still_running = report.still_running.len(),
        "erase: subject erased"
    );
    Ok(report)
}
