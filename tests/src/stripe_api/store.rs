//! The fake's state: events (newest first by `created`, then by creation
//! order), webhook endpoints, each event's deliveries to them, and the
//! fake's clock.
//!
//! The event object as documented in <https://docs.stripe.com/api/events/object>:
//! `id`, `object: "event"`, `api_version`, `created`, `data.object`,
//! `livemode`, `pending_webhooks` ("Number of webhooks that haven't been
//! successfully delivered"), `request {id, idempotency_key}`, `type`.
//! Listing goes back 30 days only ("List events, going back up to 30 days",
//! <https://docs.stripe.com/api/events/list>; "We only guarantee access to
//! events through the Retrieve Event API for 30 days",
//! <https://docs.stripe.com/api/events>).

use serde_json::{json, Value};

use super::errors::ApiError;
use super::params::{Cursor, ListParams};

/// The API version the fake stamps on its events.
pub const API_VERSION: &str = "2025-04-30.basil";

/// How far back events are listed and retrieved: 30 days, in seconds.
pub const HORIZON_SECS: i64 = 30 * 24 * 60 * 60;

/// A webhook endpoint: where events go, the secret they are signed with, and
/// the types it subscribes to (`*` for all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL posted to (`http://` only: the fake speaks plain HTTP).
    pub url: String,
    /// The signing secret (`whsec_…`), used as-is as the HMAC key.
    pub secret: String,
    /// Subscribed event types; `*` subscribes to every type.
    pub enabled_events: Vec<String>,
}

impl Endpoint {
    /// Whether events of `kind` go to this endpoint.
    pub fn subscribes_to(&self, kind: &str) -> bool {
        self.enabled_events.iter().any(|e| e == "*" || e == kind)
    }
}

/// One event's delivery to one endpoint.
#[derive(Debug, Clone)]
pub(crate) struct EndpointDelivery {
    /// Index into [`Store::endpoints`].
    pub endpoint: usize,
    /// Attempts made so far.
    pub attempts: u32,
    /// A 2xx came back.
    pub delivered: bool,
    /// The retry window closed before a 2xx came back.
    pub given_up: bool,
    /// When (fake clock) the next attempt is due.
    pub next_attempt_at: i64,
}

impl EndpointDelivery {
    /// Still waiting for a 2xx, retries not over.
    pub fn pending(&self) -> bool {
        !self.delivered && !self.given_up
    }
}

/// A stored event.
#[derive(Debug, Clone)]
pub(crate) struct StoredEvent {
    pub id: String,
    pub kind: String,
    pub created: i64,
    /// Creation order: breaks ties between equal `created`.
    pub seq: u64,
    pub object: Value,
    pub deliveries: Vec<EndpointDelivery>,
    /// Live mode (`true`) or test mode: the fake account's mode.
    pub livemode: bool,
    /// The connected account a Connect event comes from (`None`: the
    /// account's own event, which has no `account` field).
    pub account: Option<String>,
}

impl StoredEvent {
    /// The list order key: greater is newer.
    fn key(&self) -> (i64, u64) {
        (self.created, self.seq)
    }

    /// Endpoints not yet delivered to (given-up ones included).
    pub fn pending_webhooks(&self) -> usize {
        self.deliveries.iter().filter(|d| !d.delivered).count()
    }

    /// Every endpoint answered 2xx (vacuously true with none).
    pub fn delivery_success(&self) -> bool {
        self.deliveries.iter().all(|d| d.delivered)
    }

    /// The event object as the API and webhooks render it (`account` only
    /// on a Connect event, as documented: "Connect only").
    pub fn to_json(&self) -> Value {
        let mut event = json!({
            "id": self.id,
            "object": "event",
            "api_version": API_VERSION,
            "created": self.created,
            "data": { "object": self.object },
            "livemode": self.livemode,
            "pending_webhooks": self.pending_webhooks(),
            "request": { "id": null, "idempotency_key": null },
            "type": self.kind,
        });
        if let Some(account) = &self.account {
            event["account"] = json!(account);
        }
        event
    }
}

/// One page of a list.
#[derive(Debug, Clone)]
pub(crate) struct Page {
    pub data: Vec<Value>,
    pub has_more: bool,
}

/// Everything the fake knows.
#[derive(Debug)]
pub(crate) struct Store {
    pub events: Vec<StoredEvent>,
    pub endpoints: Vec<Endpoint>,
    /// The fake's clock, Unix seconds.
    pub now: i64,
    /// The mode of every event made (the fake account's).
    pub livemode: bool,
    next_seq: u64,
    /// Random per fake, so ids of two fakes differ.
    id_tag: u32,
}

impl Store {
    /// An empty store whose clock reads `now`, its events in `livemode`.
    pub fn new(now: i64, livemode: bool) -> Self {
        Self {
            events: Vec::new(),
            endpoints: Vec::new(),
            now,
            livemode,
            next_seq: 0,
            id_tag: rand::random(),
        }
    }

    /// Record an event created now; every subscribed endpoint gets a
    /// delivery due at once. Returns the id.
    pub fn create_event(&mut self, kind: &str, object: Value, account: Option<&str>) -> String {
        let seq = self.next_seq;
        self.next_seq += 1;
        let id = format!("evt_1Fk{:08x}{seq:012}", self.id_tag);
        let deliveries = self
            .endpoints
            .iter()
            .enumerate()
            .filter(|(_, endpoint)| endpoint.subscribes_to(kind))
            .map(|(endpoint, _)| EndpointDelivery {
                endpoint,
                attempts: 0,
                delivered: false,
                given_up: false,
                next_attempt_at: self.now,
            })
            .collect();
        self.events.push(StoredEvent {
            id: id.clone(),
            kind: kind.to_owned(),
            created: self.now,
            seq,
            object,
            deliveries,
            livemode: self.livemode,
            account: account.map(str::to_owned),
        });
        id
    }

    fn find(&self, id: &str) -> Option<&StoredEvent> {
        self.events.iter().find(|e| e.id == id)
    }

    fn within_horizon(&self, event: &StoredEvent) -> bool {
        event.created >= self.now - HORIZON_SECS
    }

    /// `GET /v1/events/{id}`.
    pub fn retrieve(&self, id: &str) -> Result<Value, ApiError> {
        self.find(id)
            .filter(|e| self.within_horizon(e))
            .map(StoredEvent::to_json)
            .ok_or_else(|| ApiError::NoSuchEvent {
                id: id.to_owned(),
                param: "id".to_owned(),
            })
    }

    /// `GET /v1/events`: filter, order newest first, cut the page.
    ///
    /// `starting_after=X`: the `limit` events just older than X, `has_more`
    /// when older ones remain. `ending_before=X`: the `limit` events just
    /// newer than X, still newest first, `has_more` when even newer ones
    /// remain; stripe-python's auto-pagination walks that way by reversing
    /// each page and asking `ending_before=<first id of the page>` next
    /// (`ListObject._auto_paging_iter`, `_get_filters_for_previous_page`).
    pub fn list(&self, params: &ListParams) -> Result<Page, ApiError> {
        let cursor_key = |id: &str, param: &str| {
            self.find(id)
                .map(StoredEvent::key)
                .ok_or_else(|| ApiError::NoSuchEvent {
                    id: id.to_owned(),
                    param: param.to_owned(),
                })
        };
        let bound = match &params.cursor {
            Cursor::None => None,
            Cursor::StartingAfter(id) => Some((true, cursor_key(id, "starting_after")?)),
            Cursor::EndingBefore(id) => Some((false, cursor_key(id, "ending_before")?)),
        };
        let mut matching: Vec<&StoredEvent> = self
            .events
            .iter()
            .filter(|e| self.within_horizon(e))
            .filter(|e| params.types.matches(&e.kind))
            .filter(|e| params.created.contains(e.created))
            .filter(|e| {
                params
                    .delivery_success
                    .is_none_or(|wanted| e.delivery_success() == wanted)
            })
            .filter(|e| match bound {
                None => true,
                Some((true, key)) => e.key() < key,
                Some((false, key)) => e.key() > key,
            })
            .collect();
        matching.sort_by_key(|e| std::cmp::Reverse(e.key()));
        let limit = params.limit as usize;
        let has_more = matching.len() > limit;
        let page: &[&StoredEvent] = match bound {
            // Newer than X: the ones closest to X are the oldest, at the end.
            Some((false, _)) => &matching[matching.len().saturating_sub(limit)..],
            _ => &matching[..matching.len().min(limit)],
        };
        Ok(Page {
            data: page.iter().map(|e| e.to_json()).collect(),
            has_more,
        })
    }
}
