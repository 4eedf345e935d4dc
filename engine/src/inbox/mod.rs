//! The inbox: accepting an event is one insert whose unique keys are the
//! dedup decision: (source, dedup key), and (source, replay key) when the
//! event has one (a source whose signature does not cover the id). One
//! `INSERT … ON CONFLICT DO NOTHING` covers both, so the decision is atomic
//! on both backends. A duplicate is a normal answer, not an error.

use std::sync::LazyLock;
use std::time::Duration;

use tracing::Instrument;

pub use crate::dedup_key::{body_hash, BODY_HASH_PREFIX};
pub use crate::event::Accepted;

use crate::context::FollowUps;
use crate::event::{EventState, NewEvent};
use crate::handler::Registry;
use crate::outcome::StepError;
use crate::plan::Plan;
use crate::retry::RetryPolicy;
use crate::store::transient::retry_transient;
use crate::store::{DebounceInsert, EventInsert, InsertOutcome, Store, StoreError};

/// How long an accept retries a transient store error before giving up (the
/// receiver then answers 503 and the provider retries).
pub const ACCEPT_RETRY_BUDGET: Duration = Duration::from_secs(1);

/// The plan stored with an ignored event (no handler): no steps. Encoded once.
static IGNORED_PLAN: LazyLock<String> = LazyLock::new(|| {
    Plan::encode(&RetryPolicy::default(), []).expect("an empty plan of plain fields always encodes")
});

/// The inbox as a step's [`FollowUps`]: a follow-up event is accepted like
/// a delivery, unless no handler would run it.
pub(crate) struct FollowUpInbox<'a> {
    pub store: &'a dyn Store,
    pub registry: &'a Registry,
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
        Ok(accept(self.store, self.registry, event).await?)
    }
}

pub(crate) async fn accept(
    store: &dyn Store,
    registry: &Registry,
    event: &NewEvent,
) -> Result<Accepted, StoreError> {
    let span = tracing::info_span!(
        "accept",
        event_id = %event.dedup_key,
        source = %event.source,
        kind = %event.kind
    );
    async {
        let handler = registry.find(&event.source, &event.kind);
        let payload_json = serde_json::to_string(&event.payload)
            .map_err(|e| StoreError::Corrupt(format!("payload: {e}")))?;
        let ordering = handler
            .and_then(|h| h.ordering.as_ref())
            .map(|ordering| ordering.keys(&event.source, &event.payload))
            .unwrap_or_default();
        let limit = handler.and_then(|h| h.concurrency_of(&event.source, &event.payload));
        let debounce_key = handler.and_then(|h| h.debounce_key_of(&event.source, &event.payload));
        let debounce = handler
            .and_then(|h| h.debounce.as_ref())
            .zip(debounce_key.as_deref())
            .map(|(debounce, key)| DebounceInsert {
                key,
                window: debounce.window,
                max_wait: debounce.max_wait,
            });
        let match_keys = registry.match_keys_of(&event.source, &event.kind, &event.payload);
        let (plan_json, step_count, state) = match handler {
            Some(handler) => (
                handler.plan_json.as_str(),
                handler.step_count,
                EventState::Pending,
            ),
            None => (IGNORED_PLAN.as_str(), 0, EventState::Ignored),
        };
        let insert = EventInsert {
            source: &event.source,
            dedup_key: &event.dedup_key,
            replay_key: event.replay_key.as_deref(),
            kind: &event.kind,
            payload_json: &payload_json,
            plan_json,
            step_count,
            state,
            not_before: event.not_before,
            resource_key: ordering.resource_key.as_deref(),
            resource_seq: ordering.resource_seq,
            limit_key: limit.as_ref().map(|(key, _)| key.as_str()),
            limit_n: limit.as_ref().map(|(_, n)| *n),
            debounce,
            match_keys: &match_keys,
        };
        let outcome = retry_transient("accept", ACCEPT_RETRY_BUDGET, || {
            store.event_insert(&insert)
        })
        .await?;
        let accepted = match (outcome, state) {
            (InsertOutcome::Duplicate, _) => Accepted::Duplicate,
            (InsertOutcome::New(seq), EventState::Pending) => Accepted::New { seq },
            (InsertOutcome::New(seq), _) => Accepted::Ignored { seq },
        };
        tracing::debug!(?accepted, "accepted");
        Ok(accepted)
    }
    .instrument(span)
    .await
}
