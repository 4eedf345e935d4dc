//! The inbox: accepting an event is one insert whose unique keys are the
//! dedup decision: (source, dedup key), and (source, replay key) when the
//! event has one (a source whose signature does not cover the id). One
//! `INSERT … ON CONFLICT DO NOTHING` covers both, so the decision is atomic
//! on both backends. A duplicate is a normal answer, not an error.

mod dedup_key;

use std::sync::LazyLock;
use std::time::Duration;

use serde::Serialize;
use tracing::Instrument;

pub use dedup_key::{body_hash, BODY_HASH_PREFIX};

use crate::event::{EventState, NewEvent};
use crate::handler::Registry;
use crate::plan::Plan;
use crate::retry::RetryPolicy;
use crate::store::transient::retry_transient;
use crate::store::{EventInsert, InsertOutcome, Store, StoreError};

/// How long an accept retries a transient store error before giving up (the
/// receiver then answers 503 and the provider retries).
pub const ACCEPT_RETRY_BUDGET: Duration = Duration::from_secs(1);

/// The inbox's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Accepted {
    /// First delivery: recorded, and its handler's steps will run.
    New {
        /// The event's row number.
        seq: i64,
    },
    /// First delivery of a (source, kind) with no handler: recorded as ignored,
    /// so redeliveries are duplicates and the provider can stop retrying.
    Ignored {
        /// The event's row number.
        seq: i64,
    },
    /// Already accepted earlier: nothing was written, nothing will run again.
    Duplicate,
}

impl Accepted {
    /// Whether this delivery was the first.
    pub fn is_new(&self) -> bool {
        !matches!(self, Accepted::Duplicate)
    }
}

/// The plan stored with an ignored event (no handler): no steps. Encoded once.
static IGNORED_PLAN: LazyLock<String> = LazyLock::new(|| {
    Plan::encode(&RetryPolicy::default(), []).expect("an empty plan of plain fields always encodes")
});

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
