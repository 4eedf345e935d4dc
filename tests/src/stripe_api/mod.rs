//! A fake of Stripe's Events API and webhook sender on loopback, for tests
//! of code that pulls missed events (`GET /v1/events`) or receives Stripe
//! webhooks.
//!
//! [`FakeStripe::start`] serves, on `127.0.0.1:<free port>`:
//! - `GET /v1/events` as documented in <https://docs.stripe.com/api/events/list>
//!   ([`params`] parses the query strictly; [`store`] cuts the page), and
//! - `GET /v1/events/{id}` (<https://docs.stripe.com/api/events/retrieve>),
//! - `GET /v1/account`, the key's own account
//!   (<https://docs.stripe.com/api/accounts/retrieve>: `id`, `object`),
//!
//! as one account in one mode ([`FakeAccount`]: its key, `acct_…` id and
//! `livemode`, which every event carries; [`FakeStripe::start_as`]),
//! behind API key authentication ([`auth`]), with Stripe's error JSON for
//! every failure ([`errors`]) and injectable 429 and 5xx answers
//! ([`faults`]). Any other path is a 404 "Unrecognized request URL".
//!
//! Events are made with [`FakeStripe::create_event`] and stamped by the
//! fake's own clock ([`FakeStripe::now`], [`FakeStripe::advance`]); webhook
//! endpoints added with [`FakeStripe::add_endpoint`] receive them when a test
//! calls [`FakeStripe::deliver_due`] ([`sender`]: signed, retried with
//! exponential backoff, given up after 3 days).
//!
//! stripe-python talks to it with `StripeClient(key, base_addresses={"api":
//! fake.base_url()})` (tests/fixtures/stripe_python/list_events.py).

pub mod auth;
pub mod errors;
pub mod faults;
pub mod params;
pub mod request_log;
pub mod sender;
pub mod store;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use crate::http_client::LoopbackServer;
pub use errors::ApiError;
pub use faults::Fault;
pub use request_log::ApiRequest;
pub use sender::{DeliveryRound, EventDelivery};
pub use store::Endpoint;

use faults::Faults;
use sender::{Attempt, Sender};
use store::Store;

/// The fake's secret API key unless started as another account.
pub const API_KEY: &str = "sk_test_fake_4eC39HqLyjWDarjtT1zdp7dc";

/// The account a fake is: the one key it accepts, its id, its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeAccount {
    /// The secret key (`sk_test_…`, `sk_live_…`).
    pub api_key: String,
    /// `acct_…`, as `GET /v1/account` answers.
    pub id: String,
    /// Every event's `livemode`.
    pub livemode: bool,
}

impl Default for FakeAccount {
    /// [`API_KEY`], a test-mode account.
    fn default() -> Self {
        Self {
            api_key: API_KEY.to_owned(),
            id: "acct_1FakeTestAccount".to_owned(),
            livemode: false,
        }
    }
}

/// State shared by the handle and the server's handlers.
#[derive(Debug)]
struct Shared {
    account: FakeAccount,
    store: Mutex<Store>,
    faults: Mutex<Faults>,
    log: Mutex<Vec<ApiRequest>>,
}

/// Lock, shrugging off poisoning (a panicking test thread must not hide
/// the state from the assertions of another).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running fake Stripe. Clones share one server and one state; the server
/// stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct FakeStripe {
    shared: Arc<Shared>,
    server: Arc<LoopbackServer>,
    sender: Sender,
}

impl FakeStripe {
    /// Serve on `127.0.0.1:0`, the clock at the real now, no events, no
    /// endpoints, API key [`API_KEY`].
    pub async fn start() -> FakeStripe {
        Self::start_as(FakeAccount::default()).await
    }

    /// [`start`](Self::start) as `account`: its key, id and mode.
    pub async fn start_as(account: FakeAccount) -> FakeStripe {
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(chrono::Utc::now().timestamp(), account.livemode)),
            account,
            faults: Mutex::new(Faults::default()),
            log: Mutex::new(Vec::new()),
        });
        let router = Router::new().fallback(answer).with_state(shared.clone());
        let server = LoopbackServer::start(router).await;
        FakeStripe {
            shared,
            server: Arc::new(server),
            sender: Sender::new(),
        }
    }

    /// `http://127.0.0.1:PORT`, with no trailing slash: what stripe-python's
    /// `api_base` (or `base_addresses["api"]`) and tickmark's client take.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// The socket address served.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr
    }

    /// The API key the fake accepts ([`API_KEY`] unless started as another
    /// account).
    pub fn api_key(&self) -> String {
        self.shared.account.api_key.clone()
    }

    /// The fake's clock (Unix seconds): it stamps `created`, bounds the
    /// 30-day listing horizon and drives the retry schedule. Starts at the
    /// real now.
    pub fn now(&self) -> i64 {
        lock(&self.shared.store).now
    }

    /// Set the fake's clock.
    pub fn set_now(&self, unix: i64) {
        lock(&self.shared.store).now = unix;
    }

    /// Move the fake's clock forward by `by` (whole seconds; a fraction is dropped).
    pub fn advance(&self, by: Duration) {
        let secs = i64::try_from(by.as_secs()).unwrap_or(i64::MAX);
        let mut store = lock(&self.shared.store);
        store.now = store.now.saturating_add(secs);
    }

    /// Create an event of `kind` (`invoice.paid`) with `object` as its
    /// `data.object`, `created` at the fake's now; returns its unique
    /// `evt_…` id. Every endpoint then subscribed (its enabled events
    /// contain `kind` or `*`) gets a delivery due at once.
    pub fn create_event(&self, kind: &str, object: Value) -> String {
        lock(&self.shared.store).create_event(kind, object, None)
    }

    /// [`create_event`](Self::create_event) as a Connect event of connected
    /// account `account` (its `account` field).
    pub fn create_connect_event(&self, kind: &str, object: Value, account: &str) -> String {
        lock(&self.shared.store).create_event(kind, object, Some(account))
    }

    /// Add a webhook endpoint: its URL (`http://…`), signing secret
    /// (`whsec_…`) and enabled event types (`*` for all). It receives the
    /// events created from now on, as a new Stripe endpoint does.
    pub fn add_endpoint(&self, url: &str, secret: &str, enabled_events: &[&str]) {
        lock(&self.shared.store).endpoints.push(Endpoint {
            url: url.to_owned(),
            secret: secret.to_owned(),
            enabled_events: enabled_events.iter().map(|e| (*e).to_owned()).collect(),
        });
    }

    /// Attempt every delivery due at the fake's now, concurrently: each a
    /// POST of the event JSON signed with the real wall-clock time. A 2xx
    /// delivers it; anything else (refused, no answer within
    /// [`sender::ATTEMPT_TIMEOUT`], another status) fails it and schedules
    /// the next attempt [`sender::retry_delay`] later. A due delivery whose
    /// event is more than 3 days old is given up instead of attempted.
    pub async fn deliver_due(&self) -> DeliveryRound {
        let mut round = DeliveryRound::default();
        let (now, attempts) = {
            let mut store = lock(&self.shared.store);
            let now = store.now;
            let mut attempts = Vec::new();
            let endpoints = store.endpoints.clone();
            for (e, event) in store.events.iter_mut().enumerate() {
                let body = serde_json::to_vec(&event.to_json()).unwrap_or_default();
                let expired = now - event.created > sender::RETRY_WINDOW_SECS;
                for (d, delivery) in event.deliveries.iter_mut().enumerate() {
                    if !delivery.pending() || delivery.next_attempt_at > now {
                        continue;
                    }
                    if expired {
                        delivery.given_up = true;
                        round.given_up += 1;
                        continue;
                    }
                    let endpoint = &endpoints[delivery.endpoint];
                    attempts.push(Attempt {
                        event: e,
                        delivery: d,
                        url: endpoint.url.clone(),
                        secret: endpoint.secret.clone(),
                        body: body.clone(),
                    });
                }
            }
            (now, attempts)
        };
        let outcomes = futures_util::future::join_all(
            attempts.iter().map(|attempt| self.sender.post(attempt)),
        )
        .await;
        let mut store = lock(&self.shared.store);
        for (attempt, ok) in attempts.iter().zip(outcomes) {
            let delivery = &mut store.events[attempt.event].deliveries[attempt.delivery];
            delivery.attempts += 1;
            round.attempted += 1;
            if ok {
                delivery.delivered = true;
                round.delivered += 1;
            } else {
                let delay = sender::retry_delay(delivery.attempts).as_secs();
                delivery.next_attempt_at =
                    now.saturating_add(i64::try_from(delay).unwrap_or(i64::MAX));
                round.failed += 1;
            }
        }
        round
    }

    /// The next `n` API requests are answered 429 (code `rate_limit`) with
    /// `Retry-After: <retry_after in whole seconds>`.
    pub fn rate_limit_next(&self, n: usize, retry_after: Duration) {
        lock(&self.shared.faults).push(n, Fault::RateLimit { retry_after });
    }

    /// The next `n` API requests are answered `status` (500, 503, …) with an
    /// `api_error`. A status outside 500..=599 is answered 500.
    pub fn fail_next(&self, n: usize, status: u16) {
        let status = if (500..=599).contains(&status) {
            status
        } else {
            500
        };
        lock(&self.shared.faults).push(n, Fault::Status(status));
    }

    /// The next `n` API requests are answered 200 with `body`, whatever
    /// they ask: a broken or hostile API (see [`FakeStripe::list_page`]).
    pub fn answer_next_with(&self, n: usize, body: Value) {
        lock(&self.shared.faults).push(n, Fault::Body(body));
    }

    /// The next `n` API requests are answered 429 with `Retry-After: <text>`
    /// as it is (`1e20`: what no real Stripe sends).
    pub fn rate_limit_next_saying(&self, n: usize, text: &str) {
        lock(&self.shared.faults).push(n, Fault::RetryAfterText(text.to_owned()));
    }

    /// A list page as `GET /v1/events` renders it, of the events `ids` (in
    /// the order given; unknown ids are left out) and this `has_more`.
    pub fn list_page(&self, ids: &[String], has_more: bool) -> Value {
        let data: Vec<Value> = ids.iter().filter_map(|id| self.event_json(id)).collect();
        json!({
            "object": "list",
            "url": "/v1/events",
            "has_more": has_more,
            "data": data,
        })
    }

    /// Drop the faults still queued: the next requests are answered.
    pub fn heal(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Every API request answered so far, oldest first.
    pub fn requests(&self) -> Vec<ApiRequest> {
        lock(&self.shared.log).clone()
    }

    /// The delivery state of event `id` over its endpoints, or `None` for
    /// an unknown id.
    pub fn delivery_state(&self, id: &str) -> Option<EventDelivery> {
        let store = lock(&self.shared.store);
        let event = store.events.iter().find(|e| e.id == id)?;
        Some(EventDelivery {
            delivered: event.delivery_success(),
            attempts: event.deliveries.iter().map(|d| d.attempts).sum(),
            given_up: event.deliveries.iter().any(|d| d.given_up),
            pending_webhooks: event.pending_webhooks(),
            next_attempt_at: event
                .deliveries
                .iter()
                .filter(|d| d.pending())
                .map(|d| d.next_attempt_at)
                .min(),
        })
    }

    /// The event object as the API renders it now (for comparing), or
    /// `None` for an unknown id. Unlike the API, ignores the 30-day horizon.
    pub fn event_json(&self, id: &str) -> Option<Value> {
        let store = lock(&self.shared.store);
        store
            .events
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.to_json())
    }
}

/// Every request: the next fault if one is queued, else authentication,
/// else the route. Logged with the status answered.
async fn answer(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or_default().to_owned();
    let result = route(&shared, &method, &path, &query, &headers);
    let mut response = match result {
        Ok(body) => axum::Json(body).into_response(),
        Err(error) => error.into_response(),
    };
    let request_id = format!("req_fake{:016x}", rand::random::<u64>());
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert("request-id", value);
    }
    lock(&shared.log).push(ApiRequest {
        method: method.to_string(),
        path,
        query,
        status: response.status().as_u16(),
        at: Instant::now(),
    });
    response
}

fn route(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> Result<Value, ApiError> {
    if let Some(fault) = lock(&shared.faults).take_next() {
        return fault.answer();
    }
    auth::check(headers, &shared.account.api_key)?;
    let unrecognized = || ApiError::UnrecognizedUrl {
        method: method.to_string(),
        path: path.to_owned(),
    };
    if method != Method::GET {
        return Err(unrecognized());
    }
    if path == "/v1/account" {
        return Ok(json!({
            "id": shared.account.id,
            "object": "account",
            "country": "US",
            "default_currency": "usd",
        }));
    }
    if path == "/v1/events" {
        let params = params::parse_list(query)?;
        let page = lock(&shared.store).list(&params)?;
        return Ok(json!({
            "object": "list",
            "url": "/v1/events",
            "has_more": page.has_more,
            "data": page.data,
        }));
    }
    match path.strip_prefix("/v1/events/") {
        Some(id) if !id.is_empty() && !id.contains('/') => {
            params::parse_retrieve(query)?;
            let id = percent_decoded(id);
            lock(&shared.store).retrieve(&id)
        }
        _ => Err(unrecognized()),
    }
}

/// A path segment with `%XX` escapes decoded (lossily for bad UTF-8).
fn percent_decoded(segment: &str) -> String {
    // form_urlencoded decodes `%XX` (and `+`, which ids never contain).
    form_urlencoded::parse(format!("x={segment}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}
