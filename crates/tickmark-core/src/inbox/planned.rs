//! What the registry makes of a new event before it is inserted: its plan,
//! state and flow-control keys, the fields of an [`EventInsert`]. Computed
//! once here for every path into the inbox: an accept
//! ([`accept`](super::accept)), an accept in the caller's transaction
//! ([`accept_in`](super::accept_in)), and a re-plan of an event that was
//! ignored when it arrived.

use std::sync::LazyLock;

use crate::handler::Registry;
use crate::plan::Plan;
use crate::privacy::Privacy;
use crate::tenant::tenant_name;
use tickmark_driver::event::{Accepted, EventState, NewEvent};
use tickmark_driver::flow::Debounce;
use tickmark_driver::retry::RetryPolicy;
use tickmark_driver::store::admin::Replan;
use tickmark_driver::store::{DebounceInsert, EventInsert, InsertOutcome, StoreError};
use tickmark_driver::trace_context::TraceContext;

/// The plan stored with an ignored event (no handler): no steps. Encoded once.
static IGNORED_PLAN: LazyLock<String> = LazyLock::new(|| {
    Plan::encode(&RetryPolicy::default(), []).expect("an empty plan of plain fields always encodes")
});

/// A new event as this process's handlers plan it: everything its insert
/// needs but the event's own fields ([`insert`](Self::insert) joins them).
#[derive(Debug)]
pub struct PlannedEvent<'r> {
    payload_json: String,
    plan_json: &'r str,
    step_count: i32,
    state: EventState,
    resource_key: Option<String>,
    resource_seq: Option<i64>,
    limit: Option<(String, i32)>,
    tenant_key: Option<String>,
    head_start_ms: i32,
    trace: Option<TraceContext>,
    subjects: Option<String>,
    debounce: Option<(&'r Debounce, String)>,
    match_keys: Vec<String>,
}

/// Plan `event` with `registry`: its handler's plan (or the empty plan of
/// an ignored event, when no handler takes its source and kind), the
/// ordering, concurrency, tenant, debounce and match keys its payload gives,
/// and the trace context of the span it is planned in (an accept's).
pub fn plan_event<'r>(
    registry: &'r Registry,
    privacy: &Privacy,
    event: &NewEvent,
) -> Result<PlannedEvent<'r>, StoreError> {
    let handler = registry.find(&event.source, &event.kind);
    let payload_json = privacy.seal(
        serde_json::to_string(&event.payload)
            .map_err(|e| StoreError::Corrupt(format!("payload: {e}")))?,
    );
    let subjects =
        privacy.subjects_column(&registry.subjects_of(&event.source, &event.kind, &event.payload));
    let ordering = handler
        .and_then(|h| h.ordering.as_ref())
        .map(|ordering| ordering.keys(&event.source, &event.payload))
        .unwrap_or_default();
    let debounce = handler.and_then(|h| {
        let key = h.debounce_key_of(&event.source, &event.payload)?;
        Some((h.debounce.as_ref()?, key))
    });
    let (plan_json, step_count, state) = match handler {
        Some(handler) => (
            handler.plan_json.as_str(),
            handler.step_count,
            EventState::Pending,
        ),
        None => (IGNORED_PLAN.as_str(), 0, EventState::Ignored),
    };
    Ok(PlannedEvent {
        payload_json,
        plan_json,
        step_count,
        state,
        resource_key: ordering.resource_key,
        resource_seq: ordering.resource_seq,
        limit: handler.and_then(|h| h.concurrency_of(&event.source, &event.payload)),
        tenant_key: handler.and_then(|h| match &event.tenant {
            Some(tenant) => Some(tenant_name(tenant.clone())),
            None => h.tenant_of(&event.payload),
        }),
        head_start_ms: handler.map_or(0, |h| h.head_start_ms),
        // The accept's span, which the event's runs continue (`trace.rs`).
        trace: crate::trace::current(),
        subjects,
        debounce,
        match_keys: registry.match_keys_of(&event.source, &event.kind, &event.payload),
    })
}

impl PlannedEvent<'_> {
    /// The insert of `event` (the one this was planned from).
    pub fn insert<'a>(&'a self, event: &'a NewEvent) -> EventInsert<'a> {
        EventInsert {
            source: &event.source,
            dedup_key: &event.dedup_key,
            replay_key: event.replay_key.as_deref(),
            kind: &event.kind,
            payload_json: &self.payload_json,
            plan_json: self.plan_json,
            step_count: self.step_count,
            state: self.state,
            not_before: event.not_before,
            resource_key: self.resource_key.as_deref(),
            resource_seq: self.resource_seq,
            limit_key: self.limit.as_ref().map(|(key, _)| key.as_str()),
            limit_n: self.limit.as_ref().map(|(_, n)| *n),
            tenant_key: self.tenant_key.as_deref(),
            head_start_ms: self.head_start_ms,
            trace: self.trace.as_ref(),
            subjects: self.subjects.as_deref(),
            debounce: self
                .debounce
                .as_ref()
                .map(|(debounce, key)| DebounceInsert {
                    key,
                    window: debounce.window,
                    max_wait: debounce.max_wait,
                }),
            match_keys: &self.match_keys,
        }
    }

    /// What a re-plan of an event recorded `ignored` writes
    /// ([`Decision::Replan`](tickmark_driver::store::admin::Decision::Replan)), if a
    /// handler takes it now: `None` when none does, or when its handler
    /// would debounce it (its burst is long over).
    pub fn replan(&self) -> Option<Replan> {
        (self.state == EventState::Pending && self.debounce.is_none()).then(|| Replan {
            plan_json: self.plan_json.to_owned(),
            step_count: self.step_count,
            resource_key: self.resource_key.clone(),
            resource_seq: self.resource_seq,
            limit_key: self.limit.as_ref().map(|(key, _)| key.clone()),
            limit_n: self.limit.as_ref().map(|(_, n)| *n),
            tenant_key: self.tenant_key.clone(),
            head_start_ms: self.head_start_ms,
        })
    }

    /// What the insert's outcome means for the sender.
    pub fn accepted(&self, outcome: InsertOutcome) -> Accepted {
        match (outcome, self.state) {
            (InsertOutcome::Duplicate, _) => Accepted::Duplicate,
            (InsertOutcome::New(seq), EventState::Pending) => Accepted::New { seq },
            (InsertOutcome::New(seq), _) => Accepted::Ignored { seq },
        }
    }
}
