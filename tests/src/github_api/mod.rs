//! A loopback fake of GitHub's webhook deliveries REST API, and of the
//! sender behind it, for tests of tickmark's GitHub redelivery.
//!
//! [`FakeGitHub::start`] serves on `127.0.0.1:0`:
//! - `GET /repos/{owner}/{repo}/hooks/{hook_id}/deliveries`,
//!   `GET /orgs/{org}/hooks/{hook_id}/deliveries`, `GET /app/hook/deliveries`
//!   (cursor pagination, newest first: [`pagination`]);
//! - `GET …/deliveries/{delivery_id}` (the delivery with its request and
//!   response);
//! - `POST …/deliveries/{delivery_id}/attempts`: 202, and a redelivery
//!   (a new delivery id, the same guid, `redelivery: true`) posted to the
//!   hook now, in the background ([`FakeGitHub::wait_idle`] waits for it).
//!
//! REST reference: <https://docs.github.com/en/rest/repos/webhooks>,
//! <https://docs.github.com/en/rest/orgs/webhooks>,
//! <https://docs.github.com/en/rest/apps/webhooks>.
//!
//! [`FakeGitHub::send`] plays GitHub's webhook sender ([`sender`]): it posts
//! an event to a hook once and records the attempt, which the API then lists.
//! Deliveries stay listed for 3 days ("You can redeliver webhook deliveries
//! that occurred in the past 3 days":
//! <https://docs.github.com/en/webhooks/testing-and-troubleshooting-webhooks/redelivering-webhooks>),
//! measured on the fake's own clock ([`FakeGitHub::now`]), which moves only
//! when a test moves it.
//!
//! Authentication: `Authorization: Bearer <token>` or `token <token>` with
//! [`FakeGitHub::token`] (the App endpoints take the same token: the fake does
//! not check JWTs). `X-GitHub-Api-Version`, when sent, must be `2022-11-28`.
//!
//! Where the docs leave a detail open, the fake's choice is said where it is
//! made (e.g. 422 for a malformed `cursor`).

mod error;
mod faults;
mod model;
pub mod pagination;
mod routes;
pub mod sender;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::http_client::LoopbackServer;
use serde_json::Value;
use tokio::sync::watch;

pub use error::ApiError;
pub use model::{ApiRequest, DeliveryRecord, HookRef, SentDelivery};

use faults::{Fault, Faults};
use model::Hook;

/// How long GitHub keeps deliveries listable (github.com: 3 days).
pub const RETENTION: Duration = Duration::from_secs(3 * 24 * 60 * 60);

/// A running fake GitHub. Clones share it; the server stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct FakeGitHub {
    shared: Arc<Shared>,
    _server: Arc<LoopbackServer>,
}

impl std::fmt::Debug for FakeGitHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeGitHub")
            .field("base_url", &self.shared.base_url)
            .finish_non_exhaustive()
    }
}

/// What the server and the handle share.
pub(crate) struct Shared {
    pub base_url: String,
    pub addr: SocketAddr,
    pub token: String,
    state: Mutex<State>,
    /// Deliveries being posted right now.
    in_flight: watch::Sender<usize>,
}

/// The fake's data.
pub(crate) struct State {
    pub hooks: Vec<Hook>,
    pub deliveries: Vec<DeliveryRecord>,
    pub faults: Faults,
    pub requests: Vec<ApiRequest>,
    pub now: i64,
    pub delivery_timeout: Duration,
    next_hook_id: u64,
    next_target_id: u64,
    next_delivery_id: u64,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock (in a test's own thread) must not
        // hide the fake's data from the rest of the test.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The hook `reference` names, if configured.
    pub(crate) fn hook(&self, reference: &HookRef) -> Option<Hook> {
        self.state()
            .hooks
            .iter()
            .find(|hook| hook.reference.same_as(reference))
            .cloned()
    }

    /// Post one delivery to `hook` in the background and record it when done;
    /// the in-flight count covers it from now on.
    pub(crate) fn spawn_delivery(self: &Arc<Self>, hook: Hook, attempt: Attempt) -> u64 {
        let id = self.state().allocate_delivery_id();
        self.in_flight.send_modify(|n| *n += 1);
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            shared.deliver(hook, id, attempt).await;
            shared.in_flight.send_modify(|n| *n -= 1);
        });
        id
    }

    /// Post one delivery to `hook` and record it, stamped with the fake's
    /// now as the attempt starts.
    async fn deliver(&self, hook: Hook, id: u64, attempt: Attempt) -> DeliveryRecord {
        let delivered_at = self.state().now;
        self.deliver_started_at(hook, id, attempt, delivered_at)
            .await
    }

    /// Post one delivery to `hook` and record it (listed from now on),
    /// stamped `delivered_at`: when its attempt started.
    async fn deliver_started_at(
        &self,
        hook: Hook,
        id: u64,
        attempt: Attempt,
        delivered_at: i64,
    ) -> DeliveryRecord {
        let timeout = self.state().delivery_timeout;
        let outgoing = sender::Outgoing {
            url: hook.url.clone(),
            guid: attempt.guid.clone(),
            event: attempt.event.clone(),
            hook_id: hook.id,
            target_type: hook.reference.target_type(),
            target_id: hook.target_id,
            secret: hook.secret.clone(),
            body: attempt.body.clone(),
        };
        let outcome = sender::deliver(&outgoing, timeout).await;
        let record = DeliveryRecord {
            id,
            guid: attempt.guid,
            hook: hook.reference.clone(),
            delivered_at,
            redelivery: attempt.redelivery,
            duration: outcome.duration,
            status: outcome.status,
            status_code: outcome.status_code,
            event: attempt.event,
            action: attempt
                .payload
                .get("action")
                .and_then(Value::as_str)
                .map(str::to_owned),
            installation_id: attempt
                .payload
                .pointer("/installation/id")
                .and_then(Value::as_i64),
            repository_id: attempt
                .payload
                .pointer("/repository/id")
                .and_then(Value::as_i64),
            url: hook.url,
            request_headers: outcome.request_headers,
            request_body: attempt.body,
            payload: attempt.payload,
            response_headers: outcome.response_headers,
            response_body: outcome.response_body,
        };
        self.state().deliveries.push(record.clone());
        record
    }
}

/// A delivery GitHub has started but not yet listed: see
/// [`FakeGitHub::begin_send`].
pub struct InFlightDelivery {
    shared: Arc<Shared>,
    hook: Hook,
    id: u64,
    attempt: Attempt,
    started_at: i64,
}

impl InFlightDelivery {
    /// Its delivery id (older than any delivery sent after it began).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its event's guid.
    pub fn guid(&self) -> &str {
        &self.attempt.guid
    }

    /// Post it now and list it, stamped with the time it began.
    pub async fn finish(self) -> SentDelivery {
        let record = self
            .shared
            .deliver_started_at(self.hook, self.id, self.attempt, self.started_at)
            .await;
        SentDelivery {
            id: record.id,
            guid: record.guid,
            status_code: record.status_code,
            status: record.status,
        }
    }
}

/// One attempt to post an event.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    pub guid: String,
    pub event: String,
    pub payload: Value,
    pub body: Vec<u8>,
    pub redelivery: bool,
}

impl State {
    fn allocate_delivery_id(&mut self) -> u64 {
        self.next_delivery_id += 1;
        self.next_delivery_id
    }

    /// Whether a delivery stamped `delivered_at` is still kept.
    pub(crate) fn retained(&self, delivered_at: i64) -> bool {
        let retention = i64::try_from(RETENTION.as_secs()).unwrap_or(i64::MAX);
        delivered_at > self.now.saturating_sub(retention)
    }
}

/// A new event guid, in GitHub's form (a UUID).
fn new_guid() -> String {
    let bytes: [u8; 16] = rand::random();
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl FakeGitHub {
    /// Serve a fake GitHub on `127.0.0.1:0`, its clock at real now.
    pub async fn start() -> FakeGitHub {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0 for the fake GitHub");
        let addr = listener.local_addr().expect("the fake GitHub's address");
        let token = format!("ghp_fake{}", hex::encode(rand::random::<[u8; 12]>()));
        let shared = Arc::new(Shared {
            base_url: format!("http://{addr}"),
            addr,
            token,
            state: Mutex::new(State {
                hooks: Vec::new(),
                deliveries: Vec::new(),
                faults: Faults::default(),
                requests: Vec::new(),
                now: chrono::Utc::now().timestamp(),
                delivery_timeout: sender::DELIVERY_TIMEOUT,
                next_hook_id: 0,
                next_target_id: 100,
                next_delivery_id: 12_000_000_000,
            }),
            in_flight: watch::channel(0).0,
        });
        let router = routes::router(Arc::clone(&shared));
        let server = LoopbackServer::start_on(listener, router);
        FakeGitHub {
            shared,
            _server: Arc::new(server),
        }
    }

    /// `http://127.0.0.1:<port>`, the API's base URL (no trailing slash).
    pub fn base_url(&self) -> String {
        self.shared.base_url.clone()
    }

    /// The socket address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The one token it accepts.
    pub fn token(&self) -> String {
        self.shared.token.clone()
    }

    fn add_hook(&self, reference: impl FnOnce(u64) -> HookRef, url: &str, secret: &str) -> u64 {
        let mut state = self.shared.state();
        state.next_hook_id += 1;
        state.next_target_id += 1;
        let id = state.next_hook_id;
        let reference = reference(id);
        let target_id = state.next_target_id;
        state
            .hooks
            .retain(|hook| !hook.reference.same_as(&reference));
        state.hooks.push(Hook {
            reference,
            id,
            target_id,
            url: url.to_owned(),
            secret: secret.to_owned(),
        });
        id
    }

    /// A repository webhook on `owner/repo` posting to `url`, signing with
    /// `secret` (empty: unsigned). Returns its hook id.
    pub fn add_repo_hook(&self, owner: &str, repo: &str, url: &str, secret: &str) -> u64 {
        self.add_hook(|id| HookRef::repo(owner, repo, id), url, secret)
    }

    /// An organisation webhook on `org`. Returns its hook id.
    pub fn add_org_hook(&self, org: &str, url: &str, secret: &str) -> u64 {
        self.add_hook(|id| HookRef::org(org, id), url, secret)
    }

    /// The GitHub App's webhook (replacing any earlier one).
    pub fn set_app_hook(&self, url: &str, secret: &str) {
        self.add_hook(|_| HookRef::App, url, secret);
    }

    /// Point an existing hook at another URL (what editing a webhook does).
    /// Panics on an unknown hook.
    pub fn set_hook_url(&self, hook: &HookRef, url: &str) {
        let mut state = self.shared.state();
        let hook = state
            .hooks
            .iter_mut()
            .find(|h| h.reference.same_as(hook))
            .unwrap_or_else(|| panic!("no hook {hook:?}"));
        hook.url = url.to_owned();
    }

    /// The fake's clock, unix seconds.
    pub fn now(&self) -> i64 {
        self.shared.state().now
    }

    /// Set the clock.
    pub fn set_now(&self, unix: i64) {
        self.shared.state().now = unix;
    }

    /// Move the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut state = self.shared.state();
        state.now = state
            .now
            .saturating_add(i64::try_from(by.as_secs()).unwrap_or(i64::MAX));
    }

    /// How long the sender waits for a receiver (default
    /// [`sender::DELIVERY_TIMEOUT`], GitHub's 10 s); a test of `timed out`
    /// shortens it.
    pub fn set_delivery_timeout(&self, timeout: Duration) {
        self.shared.state().delivery_timeout = timeout;
    }

    /// `hook`, and a first attempt (a new guid, not a redelivery) of `event`
    /// with `payload`. Panics on an unknown hook.
    fn first_attempt(&self, hook: HookRef, event: &str, payload: Value) -> (Hook, Attempt) {
        let hook = self
            .shared
            .hook(&hook)
            .unwrap_or_else(|| panic!("no hook {hook:?}"));
        let body = serde_json::to_vec(&payload).expect("JSON serialises");
        let attempt = Attempt {
            guid: new_guid(),
            event: event.to_owned(),
            payload,
            body,
            redelivery: false,
        };
        (hook, attempt)
    }

    /// Send `event` with `payload` to `hook` once, as GitHub does, and
    /// record the delivery (new id, new guid, `redelivery: false`). Waits
    /// for the receiver's answer (or the timeout). Panics on an unknown hook.
    pub async fn send(&self, hook: HookRef, event: &str, payload: Value) -> SentDelivery {
        let (hook, attempt) = self.first_attempt(hook, event, payload);
        let id = self.shared.state().allocate_delivery_id();
        let record = self.shared.deliver(hook, id, attempt).await;
        SentDelivery {
            id: record.id,
            guid: record.guid,
            status_code: record.status_code,
            status: record.status,
        }
    }

    /// Start sending `event` to `hook` as GitHub starts an attempt: its
    /// delivery id and time are taken now, but it is posted, and listed,
    /// only when the test calls [`InFlightDelivery::finish`]. Deliveries
    /// sent in between have newer ids and are listed first: as GitHub lists
    /// a delivery whose receiver is slow to answer (up to 10 s) after newer
    /// ones. Panics on an unknown hook.
    pub fn begin_send(&self, hook: HookRef, event: &str, payload: Value) -> InFlightDelivery {
        let (hook, attempt) = self.first_attempt(hook, event, payload);
        let (id, started_at) = {
            let mut state = self.shared.state();
            (state.allocate_delivery_id(), state.now)
        };
        InFlightDelivery {
            shared: Arc::clone(&self.shared),
            hook,
            id,
            attempt,
            started_at,
        }
    }

    /// Answer the next `n` API requests with 200, `body` and, when given,
    /// `link` as the `Link` header, whatever they ask: a broken or hostile
    /// API (a page that repeats, an empty page with a next link).
    pub fn answer_next_with(&self, n: usize, body: Value, link: Option<String>) {
        self.shared
            .state()
            .faults
            .push(n, Fault::Listing { body, link });
    }

    /// Wait until no delivery (a redelivery asked for through the API) is
    /// being posted.
    pub async fn wait_idle(&self) {
        let mut in_flight = self.shared.in_flight.subscribe();
        // The sender lives in `shared`, so the channel never closes while
        // `self` exists.
        let _ = in_flight.wait_for(|n| *n == 0).await;
    }

    /// Answer the next `n` API requests with 429 and `Retry-After`
    /// (a secondary rate limit).
    pub fn rate_limit_next(&self, n: usize, retry_after: Duration) {
        self.shared
            .state()
            .faults
            .push(n, Fault::TooManyRequests(retry_after));
    }

    /// Answer the next `n` API requests with 403 and `Retry-After`, as
    /// GitHub also answers a secondary rate limit.
    pub fn secondary_rate_limit_next(&self, n: usize, retry_after: Duration) {
        self.shared
            .state()
            .faults
            .push(n, Fault::SecondaryForbidden(retry_after));
    }

    /// Answer the next `n` API requests with 403, `x-ratelimit-remaining: 0`
    /// and `x-ratelimit-reset` `reset_in` from the fake's now (the primary
    /// limit used up).
    pub fn primary_rate_limit_next(&self, n: usize, reset_in: Duration) {
        self.shared
            .state()
            .faults
            .push(n, Fault::PrimaryExhausted(reset_in));
    }

    /// Answer the next `n` API requests with `status` (a 5xx, typically).
    /// Panics on a status outside 100–999.
    pub fn fail_next(&self, n: usize, status: u16) {
        assert!(
            (100..=999).contains(&status),
            "not an HTTP status: {status}"
        );
        self.shared.state().faults.push(n, Fault::Status(status));
    }

    /// Every API request answered so far, in order.
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.shared.state().requests.clone()
    }

    /// Every recorded delivery to `hook` (expired ones included), newest
    /// first.
    pub fn deliveries(&self, hook: HookRef) -> Vec<DeliveryRecord> {
        let mut deliveries: Vec<_> = self
            .shared
            .state()
            .deliveries
            .iter()
            .filter(|d| d.hook.same_as(&hook))
            .cloned()
            .collect();
        deliveries.sort_by_key(|d| std::cmp::Reverse(d.id));
        deliveries
    }
}
