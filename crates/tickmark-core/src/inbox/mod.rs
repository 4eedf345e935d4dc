//! The inbox: accepting an event is one insert whose unique keys are the
//! dedup decision: (source, dedup key), and (source, replay key) when the
//! event has one (a source whose signature does not cover the id). One
//! `INSERT … ON CONFLICT DO NOTHING` covers both, so the decision is atomic
//! on both backends. A duplicate is a normal answer, not an error.

pub mod planned;

use std::time::Duration;

use tracing::Instrument;

pub use tickmark_driver::dedup_key::{body_hash, BODY_HASH_PREFIX};
pub use tickmark_driver::event::Accepted;

use planned::plan_event;

use crate::context::FollowUps;
use crate::handler::Registry;
use crate::privacy::{erase_subject, EraseReport, EraseRequest, Privacy, PrivacyError, Subject};
use crate::step::StepError;
use tickmark_driver::event::NewEvent;
use tickmark_driver::store::transient::retry_transient;
use tickmark_driver::store::{AppConnection, EventRecord, Store, StoreError};

/// How long an accept retries a transient store error before giving up (the
/// receiver then answers 503 and the provider retries).
pub const ACCEPT_RETRY_BUDGET: Duration = Duration::from_secs(1);

/// The inbox as a step's [`FollowUps`]: a follow-up event is accepted like
/// a delivery, unless no handler would run it.
pub struct FollowUpInbox<'a> {
    #[doc(hidden)]
    pub store: &'a dyn Store,
    #[doc(hidden)]
    pub registry: &'a Registry,
    #[doc(hidden)]
    pub privacy: &'a Privacy,
}

#[async_trait::async_trait]
impl FollowUps for FollowUpInbox<'_> {
    async fn accept(&self, event: &NewEvent) -> Result<Accepted, StepError> {
        // A follow-up nobody handles would be recorded as ignored, and a later
        // re-run of this step would find it a duplicate: refuse, write nothing.
        if self.registry.find(&event.source, &event.kind).is_none() {
            return Err(StepError::terminal(format!(
                "no handler is registered for ({}, {}) in this process; register one \
                 (for the outbox: tickmark_steps::outbox::handler()), deploy, then retry this event",
                event.source, event.kind
            )));
        }
        Ok(accept(self.store, self.registry, self.privacy, event).await?)
    }

    async fn erase_subject(
        &self,
        subject: &Subject,
        reason: &str,
        except: i64,
    ) -> Result<EraseReport, StepError> {
        let key = self
            .privacy
            .subject_key()
            .ok_or_else(|| StepError::terminal(PrivacyError::NoSubjectKey.to_string()))?;
        let request = EraseRequest {
            actor: "step",
            reason,
            wait_for_running: Duration::ZERO,
            except_event: Some(except),
        };
        erase_subject(self.store, key, subject, &request)
            .await
            .map_err(privacy_failure)
    }

    async fn subject_events(&self, subject: &Subject) -> Result<Vec<EventRecord>, StepError> {
        let key = self
            .privacy
            .subject_key()
            .ok_or_else(|| StepError::terminal(PrivacyError::NoSubjectKey.to_string()))?;
        let mut events = self
            .store
            .subject_events(&key.hash(subject), SUBJECT_EVENTS_MAX)
            .await?;
        for record in &mut events {
            let payload = std::mem::take(&mut record.event.payload);
            record.event.payload = self.privacy.open(payload).map_err(privacy_failure)?;
        }
        Ok(events)
    }
}

/// The most events a data request's answer lists.
const SUBJECT_EVENTS_MAX: u32 = 1_000;

/// A privacy error in a step: the database's are retried, the keys' are not.
fn privacy_failure(error: PrivacyError) -> StepError {
    match error {
        PrivacyError::Store(error) => error.into(),
        other => StepError::terminal(other.to_string()),
    }
}

#[doc(hidden)]
pub async fn accept(
    store: &dyn Store,
    registry: &Registry,
    privacy: &Privacy,
    event: &NewEvent,
) -> Result<Accepted, StoreError> {
    async {
        privacy.ready(store, registry.declares_subjects()).await?;
        let planned = plan_event(registry, privacy, event)?;
        let insert = planned.insert(event);
        let outcome = retry_transient("accept", ACCEPT_RETRY_BUDGET, || {
            store.event_insert(&insert)
        })
        .await?;
        let accepted = planned.accepted(outcome);
        tracing::debug!(?accepted, "accepted");
        record_verdict(store, event, accepted).await;
        Ok(accepted)
    }
    .instrument(accept_span(event))
    .await
}

/// Accept `event` on the caller's connection, in its transaction: the same
/// insert and dedup decision as [`accept`], not batched, and not retried
/// (a transient error aborts the caller's transaction; the caller retries
/// it whole). Recorded when the caller commits, gone if it rolls back.
pub async fn accept_in(
    store: &dyn Store,
    registry: &Registry,
    privacy: &Privacy,
    // The event before the connection: built without a backend (as this
    // crate is verified alone), a connection cannot exist, and nothing after
    // one is reached.
    event: &NewEvent,
    conn: AppConnection<'_>,
) -> Result<Accepted, StoreError> {
    async {
        privacy.ready(store, registry.declares_subjects()).await?;
        let planned = plan_event(registry, privacy, event)?;
        let outcome = store.event_insert_in(conn, &planned.insert(event)).await?;
        let accepted = planned.accepted(outcome);
        tracing::debug!(?accepted, "accepted in the caller's transaction");
        record_verdict(store, event, accepted).await;
        Ok(accepted)
    }
    .instrument(accept_span(event))
    .await
}

fn accept_span(event: &NewEvent) -> tracing::Span {
    tracing::info_span!(
        "accept",
        event_id = %event.dedup_key,
        source = %event.source,
        kind = %event.kind,
        verdict = tracing::field::Empty,
    )
}

/// Name the dedup decision on the accept's span (`new`, `ignored`,
/// `duplicate`) and, while traces are exported, link a duplicate's span to
/// the trace of the event it repeats: one read of that event, only then.
async fn record_verdict(store: &dyn Store, event: &NewEvent, accepted: Accepted) {
    let span = tracing::Span::current();
    let verdict = match accepted {
        Accepted::New { .. } => "new",
        Accepted::Ignored { .. } => "ignored",
        Accepted::Duplicate => "duplicate",
    };
    span.record("verdict", verdict);
    if accepted.is_new() || !crate::trace::recording() {
        return;
    }
    let recorded = match store.event_find(&event.source, &event.dedup_key).await {
        Ok(None) => match &event.replay_key {
            Some(key) => store.event_find_by_replay_key(&event.source, key).await,
            None => Ok(None),
        },
        found => found,
    };
    // A pruned event (a tombstone) has no trace left to link to; a failed
    // read only costs the link.
    if let Ok(Some(trace)) = recorded.map(|record| record.and_then(|r| r.trace)) {
        crate::trace::link_to(&span, &trace);
    }
}
