//! Re-planning ignored events: an event accepted while no handler took its
//! (source, kind) is recorded `ignored`, with no steps. Once a deploy adds
//! the handler, an operator gives those events its plan, and they run as if
//! the handler had been there when they arrived.
//!
//! Each event is its own fenced, audited transition (action `replan`),
//! allowed only from `ignored`; the plan, ordering and concurrency keys are
//! what an accept would have recorded. Events a debouncing handler takes
//! are left ignored: their burst is long over, and coalescing them now
//! would run one of them for events that were never a burst.

use std::time::Duration;

use super::actions::{note, transition};
use super::rules;
use super::{Actor, AdminError};
use crate::handler::{KindsHandled, Registry, ANY};
use crate::inbox::planned::plan_event;
use crate::privacy::Privacy;
use tickmark_driver::event::{EventState, NewEvent};
use tickmark_driver::store::admin::{Decision, EventFilter, Verdict};
use tickmark_driver::store::{EventRecord, Store};

/// Events fetched per page while re-planning.
const PAGE: u32 = 256;

/// Which ignored events to give a plan.
#[derive(Debug, Clone, Copy)]
pub struct ReplanIgnored<'a> {
    /// Only this source.
    pub source: &'a str,
    /// Only this kind; `None`: every kind of `source` a handler takes now.
    pub kind: Option<&'a str>,
    /// Only events received within this long; `None`: however old.
    pub since: Option<Duration>,
    /// Who and why, for the audit trail.
    pub actor: Actor<'a>,
}

/// What a re-plan did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplanReport {
    /// Ignored events that are now pending with their handler's plan.
    pub replanned: u64,
    /// Ignored events left ignored because their handler debounces.
    pub debounced: u64,
    /// The kinds whose ignored events were looked at.
    pub kinds: Vec<String>,
}

/// Give the ignored events `request` names the plans `registry` has for them.
pub async fn replan_ignored(
    store: &dyn Store,
    registry: &Registry,
    privacy: &Privacy,
    request: &ReplanIgnored<'_>,
) -> Result<ReplanReport, AdminError> {
    let kinds: Vec<Option<String>> = match request.kind {
        Some(kind) if registry.find(request.source, kind).is_none() => {
            return Err(AdminError::Refused(format!(
                "no handler takes ({}, {kind}) in this build: register one with \
                 Handlers::on, deploy, then re-plan",
                request.source
            )))
        }
        Some(kind) => vec![Some(kind.to_owned())],
        None => match registry.kinds_handled(request.source) {
            // A handler for every kind of the source: every ignored event of it.
            KindsHandled::Every => vec![None],
            KindsHandled::Only(kinds) => kinds
                .into_iter()
                .map(|kind| Some(kind.to_owned()))
                .collect(),
        },
    };
    let mut report = ReplanReport {
        kinds: kinds
            .iter()
            .map(|kind| kind.clone().unwrap_or_else(|| ANY.to_owned()))
            .collect(),
        ..ReplanReport::default()
    };
    for kind in kinds {
        // Listed, but left as they are: not listed as fresh again.
        let mut skipped = std::collections::HashSet::new();
        loop {
            let filter = EventFilter {
                state: Some(EventState::Ignored),
                source: Some(request.source.to_owned()),
                kind: kind.clone(),
                since: request.since,
                limit: PAGE + u32::try_from(skipped.len()).unwrap_or(u32::MAX - PAGE),
            };
            let page = store.event_list(&filter).await?;
            let fresh: Vec<&EventRecord> = page
                .iter()
                .filter(|record| !skipped.contains(&record.event.seq))
                .collect();
            if fresh.is_empty() {
                break;
            }
            for record in fresh {
                match replan_one(store, registry, privacy, record, request.actor).await? {
                    Outcome::Replanned => report.replanned += 1,
                    Outcome::Debounced => {
                        report.debounced += 1;
                        skipped.insert(record.event.seq);
                    }
                    // Not ignored any more: a page lists it only if it is again.
                    Outcome::Gone => {
                        skipped.insert(record.event.seq);
                    }
                }
            }
        }
    }
    tracing::info!(
        source = request.source,
        replanned = report.replanned,
        debounced = report.debounced,
        "ignored events re-planned"
    );
    Ok(report)
}

enum Outcome {
    Replanned,
    /// Its handler debounces: left ignored.
    Debounced,
    /// No longer ignored when its transition ran.
    Gone,
}

async fn replan_one(
    store: &dyn Store,
    registry: &Registry,
    privacy: &Privacy,
    record: &EventRecord,
    actor: Actor<'_>,
) -> Result<Outcome, AdminError> {
    let event = &record.event;
    // The event as its delivery was: planned exactly as an accept plans it.
    let payload = privacy
        .open(event.payload.clone())
        .map_err(|error| AdminError::Refused(error.to_string()))?;
    let delivery = NewEvent::with_id(&event.source, &event.id, &event.kind, payload);
    let Some(replan) = plan_event(registry, privacy, &delivery)?.replan() else {
        // Listed by a kind a handler takes: its handler debounces it.
        return Ok(Outcome::Debounced);
    };
    let steps = replan.step_count;
    let result = transition(store, event.seq, |before| {
        rules::replan(before)?;
        Ok(Verdict {
            decision: Decision::Replan(replan.clone()),
            audit: note(
                &actor,
                "replan",
                None,
                format!("ignored → pending with this build's handler ({steps} steps)"),
            ),
        })
    })
    .await;
    match result {
        Ok(_) => Ok(Outcome::Replanned),
        // Changed meanwhile (another operator re-planned or cancelled it, a
        // prune removed it): no longer ignored, so not listed again.
        Err(AdminError::Refused(_) | AdminError::NotFound(_)) => Ok(Outcome::Gone),
        Err(error) => Err(error),
    }
}
