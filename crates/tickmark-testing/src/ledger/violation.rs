//! What [`EffectLedger::check`](super::EffectLedger::check) finds: the calls
//! one step made to one endpoint, more than one of which the service had to
//! treat as new.

use std::collections::HashMap;

use super::{EffectOwner, LedgerCall};

/// The step named for calls whose owner is unknown: no tickmark key, and no
/// step running when they arrived (or no test kit to say).
const UNKNOWN_STEP: &str = "(unknown step)";

/// The event named for calls whose owner is unknown.
const UNKNOWN_EVENT: &str = "(unknown event)";

/// A logical effect that happened more than once: one step sent one
/// `method path` so that the service could not drop the re-send.
///
/// Calls are grouped by (owner, method, path); a replay of an earlier key is
/// never counted. Calls with no known owner are grouped together, under
/// the step `(unknown step)` of the event `(unknown event)`.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerViolation {
    /// The step sent the call more than once, at least once without an
    /// `Idempotency-Key`: every re-send (after a crash, after a retry) is a
    /// new effect.
    #[error(
        "step `{step}` of event {source_name}/{event_id} sent {method} {path} {times} times \
         as a new request, at least once without an Idempotency-Key, so each one took effect \
         (a double effect): pass ctx.idempotency_key() as the Idempotency-Key header so the \
         service drops the re-send"
    )]
    DoubleEffectWithoutKey {
        /// The step's name, or `(unknown step)`.
        step: String,
        /// The event's source, or `(unknown event)`.
        source_name: String,
        /// The event's id, or `(unknown event)`.
        event_id: String,
        /// The calls' method (`POST`).
        method: String,
        /// The calls' path (`/v1/charges`).
        path: String,
        /// How many of the calls the service had to treat as new: each one
        /// without a key, and one per distinct key.
        times: usize,
    },
    /// The step sent the call with different keys on different runs (a
    /// random or per-attempt key): the service sees a new request each time.
    #[error(
        "step `{step}` of event {source_name}/{event_id} sent {method} {path} with {n} \
         different Idempotency-Keys ({list}), so the service applied each of them: use \
         ctx.idempotency_key(), which is the same on every run of the step, not a random \
         or per-attempt key",
        n = .keys.len(),
        list = .keys.join(", ")
    )]
    KeysDisagree {
        /// The step's name, or `(unknown step)`.
        step: String,
        /// The event's source, or `(unknown event)`.
        source_name: String,
        /// The event's id, or `(unknown event)`.
        event_id: String,
        /// The calls' method (`POST`).
        method: String,
        /// The calls' path (`/v1/charges`).
        path: String,
        /// The distinct keys, in the order they first arrived.
        keys: Vec<String>,
    },
}

impl LedgerViolation {
    /// The step to blame (`(unknown step)` when no step was known).
    pub fn step(&self) -> &str {
        match self {
            Self::DoubleEffectWithoutKey { step, .. } | Self::KeysDisagree { step, .. } => step,
        }
    }
}

/// Every violation among `calls`, in the order their groups first made a
/// call.
pub(super) fn violations(calls: &[LedgerCall]) -> Vec<LedgerViolation> {
    let mut order: Vec<(Option<&EffectOwner>, &str, &str)> = Vec::new();
    let mut groups: HashMap<(Option<&EffectOwner>, &str, &str), Group<'_>> = HashMap::new();
    for call in calls.iter().filter(|call| !call.replayed) {
        let id = (
            call.owner.as_ref(),
            call.method.as_str(),
            call.path.as_str(),
        );
        let group = groups.entry(id).or_insert_with(|| {
            order.push(id);
            Group::default()
        });
        match &call.idempotency_key {
            None => group.without_key += 1,
            Some(key) => {
                if !group.keys.contains(&key.as_str()) {
                    group.keys.push(key);
                }
            }
        }
    }
    let mut found = Vec::new();
    for id in order {
        let Some(group) = groups.get(&id) else {
            continue;
        };
        let (owner, method, path) = id;
        let (step, source_name, event_id) = match owner {
            Some(owner) => (
                owner.step.clone(),
                owner.source.clone(),
                owner.event_id.clone(),
            ),
            None => (
                UNKNOWN_STEP.to_owned(),
                UNKNOWN_EVENT.to_owned(),
                UNKNOWN_EVENT.to_owned(),
            ),
        };
        let times = group.without_key + group.keys.len();
        if group.without_key > 0 && times > 1 {
            found.push(LedgerViolation::DoubleEffectWithoutKey {
                step: step.clone(),
                source_name: source_name.clone(),
                event_id: event_id.clone(),
                method: method.to_owned(),
                path: path.to_owned(),
                times,
            });
        }
        if group.keys.len() > 1 {
            found.push(LedgerViolation::KeysDisagree {
                step,
                source_name,
                event_id,
                method: method.to_owned(),
                path: path.to_owned(),
                keys: group.keys.iter().map(|&key| key.to_owned()).collect(),
            });
        }
    }
    found
}

/// One (owner, method, path)'s calls, replays left out.
#[derive(Default)]
struct Group<'a> {
    /// Calls without a key.
    without_key: usize,
    /// The distinct keys, first seen first.
    keys: Vec<&'a str>,
}
