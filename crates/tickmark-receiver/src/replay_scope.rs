//! The replay key a verified delivery is recorded under, given the handlers.
//!
//! A provider gives the key of the signed content
//! ([`VerifiedEvent::replay_key`]) and says how far it reaches
//! ([`ReplayScope`]). For [`ReplayScope::HandledKind`] (Shopify, whose topic
//! is not signed and which sends one body under several topics) only the
//! receiver can finish it, because only the engine knows the handlers:
//!
//! | the delivery's kind | key | so a signed body makes |
//! |---|---|---|
//! | named by a handler or a wait of the source | the content's key scoped by the kind | one event per named kind |
//! | taken only by a `*` handler | the content's key | one event for all such kinds together |
//! | taken by no handler | the content's key, unless the content is in the inbox under a named kind: then nothing is recorded | no event (an ignored one, when the content is new) |
//!
//! So a captured body re-sent with fresh ids can run at most once per named
//! kind, plus once under a `*` handler: bounded by the handlers, never by
//! what an attacker writes in the kind header.

use super::providers::{kind_scoped_replay_key, ReplayScope, VerifiedEvent};
use tickmark_core::Engine;
use tickmark_driver::store::{EventRecord, StoreError};

/// What to record a delivery under.
#[derive(Debug)]
pub(crate) enum Replay {
    /// Record the event with this replay key (or none).
    Key(Option<String>),
    /// No handler takes the delivery's kind, and its signed content is
    /// recorded already under a kind one takes: record nothing.
    Known(Box<EventRecord>),
}

/// The replay key `verified` is recorded under, from `source`, as the table
/// above says. Reads the store only for a [`ReplayScope::HandledKind`]
/// delivery of a kind no handler takes: one lookup per named kind.
pub(crate) async fn replay_key_for(
    engine: &Engine,
    source: &str,
    verified: &VerifiedEvent,
) -> Result<Replay, StoreError> {
    let Some(key) = verified.replay_key.as_deref() else {
        return Ok(Replay::Key(None));
    };
    if verified.replay_scope != ReplayScope::HandledKind {
        return Ok(Replay::Key(Some(key.to_owned())));
    }
    let registry = engine.registry();
    let kind = verified.kind.as_str();
    if registry.names_kind(source, kind) {
        return Ok(Replay::Key(Some(kind_scoped_replay_key(key, kind))));
    }
    if registry.find(source, kind).is_none() {
        // The content's own key is decided by the insert; under the named
        // kinds it is stored scoped, so look for those.
        for named in registry.named_kinds(source) {
            let scoped = kind_scoped_replay_key(key, named);
            if let Some(record) = engine
                .store()
                .event_find_by_replay_key(source, &scoped)
                .await?
            {
                return Ok(Replay::Known(Box::new(record)));
            }
        }
    }
    Ok(Replay::Key(Some(key.to_owned())))
}
