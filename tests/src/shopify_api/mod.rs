//! A loopback fake of Shopify's GraphQL Admin API, just enough for tickmark
//! to check that its webhook subscriptions still exist: the
//! `webhookSubscriptions` query
//! (<https://shopify.dev/docs/api/admin-graphql/latest/queries/webhookSubscriptions>),
//! paged with `first`/`after` and `pageInfo { hasNextPage endCursor }`
//! (<https://shopify.dev/docs/api/usage/pagination-graphql>).
//!
//! Why tickmark checks: Shopify retries a failed delivery 8 times over 4
//! hours (<https://shopify.dev/changelog/updates-to-webhook-retry-mechanism>),
//! and when every attempt fails it deletes a subscription that was created
//! through the Admin API
//! (<https://shopify.dev/docs/apps/build/webhooks/subscribe/https>); an app
//! that was down must re-subscribe
//! (<https://shopify.dev/docs/apps/build/webhooks/best-practices#recover-from-a-downtime-event>).
//! [`FakeShopify::remove_subscription`] is that deletion.
//!
//! Serves `POST /admin/api/{version}/graphql.json` on `127.0.0.1:0`, with
//! `X-Shopify-Access-Token` (<https://shopify.dev/docs/api/admin-graphql#authentication>).

mod graphql;
mod model;
mod routes;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::http_client::LoopbackServer;

pub use graphql::{GraphqlError, MAX_PAGE};
pub use model::Subscription;

/// A running fake Shopify. Clones share it; the server stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct FakeShopify {
    shared: Arc<Shared>,
    _server: Arc<LoopbackServer>,
}

impl std::fmt::Debug for FakeShopify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeShopify")
            .field("base_url", &self.shared.base_url)
            .finish_non_exhaustive()
    }
}

/// One request the fake answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShopifyRequest {
    /// The API version in the path (`2025-10`).
    pub version: String,
    /// The GraphQL query text, when the body had one.
    pub query: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
}

/// A queued fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// HTTP 429 with `Retry-After` (<https://shopify.dev/docs/api/usage/limits>).
    TooManyRequests(Duration),
    /// HTTP 200 with a `THROTTLED` GraphQL error: the calculated query cost
    /// exceeded (<https://shopify.dev/docs/apps/build/apis/graphql-admin/rate-limits>).
    Throttled,
    /// This HTTP status.
    Status(u16),
}

pub(crate) struct Shared {
    pub base_url: String,
    pub addr: SocketAddr,
    pub token: String,
    state: Mutex<State>,
}

pub(crate) struct State {
    pub subscriptions: Vec<Subscription>,
    pub faults: crate::fault_queue::FaultQueue<Fault>,
    pub requests: Vec<ShopifyRequest>,
    next_id: u64,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl FakeShopify {
    /// Serve a fake shop's Admin API on `127.0.0.1:0`.
    pub async fn start() -> FakeShopify {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0 for the fake Shopify");
        let addr = listener.local_addr().expect("the fake Shopify's address");
        let shared = Arc::new(Shared {
            base_url: format!("http://{addr}"),
            addr,
            token: format!("shpat_{}", hex::encode(rand::random::<[u8; 16]>())),
            state: Mutex::new(State {
                subscriptions: Vec::new(),
                faults: Default::default(),
                requests: Vec::new(),
                next_id: 1_000,
            }),
        });
        let router = routes::router(Arc::clone(&shared));
        let server = LoopbackServer::start_on(listener, router);
        FakeShopify {
            shared,
            _server: Arc::new(server),
        }
    }

    /// `http://127.0.0.1:<port>` (the shop's `https://{shop}.myshopify.com`).
    pub fn base_url(&self) -> String {
        self.shared.base_url.clone()
    }

    /// The GraphQL endpoint for `version`, e.g. `…/admin/api/2025-10/graphql.json`.
    pub fn graphql_url(&self, version: &str) -> String {
        format!("{}/admin/api/{version}/graphql.json", self.shared.base_url)
    }

    /// The socket address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The access token it accepts in `X-Shopify-Access-Token`.
    pub fn token(&self) -> String {
        self.shared.token.clone()
    }

    /// Subscribe `callback_url` to `topic` (the GraphQL enum, e.g.
    /// `ORDERS_CREATE`). Returns the numeric id.
    pub fn add_subscription(&self, topic: &str, callback_url: &str) -> u64 {
        let mut state = self.shared.state();
        state.next_id += 1;
        let id = state.next_id;
        let now = chrono::Utc::now().timestamp();
        state.subscriptions.push(Subscription {
            id,
            topic: topic.to_owned(),
            callback_url: callback_url.to_owned(),
            created_at: now,
            updated_at: now,
        });
        id
    }

    /// Delete subscription `id`, as Shopify does after a delivery failed
    /// every retry. Whether it existed.
    pub fn remove_subscription(&self, id: u64) -> bool {
        let mut state = self.shared.state();
        let before = state.subscriptions.len();
        state.subscriptions.retain(|s| s.id != id);
        state.subscriptions.len() != before
    }

    /// The current subscriptions, by id.
    pub fn subscriptions(&self) -> Vec<Subscription> {
        let mut subscriptions = self.shared.state().subscriptions.clone();
        subscriptions.sort_by_key(|s| s.id);
        subscriptions
    }

    /// Answer the next `n` requests with HTTP 429 and `Retry-After`.
    pub fn rate_limit_next(&self, n: usize, retry_after: Duration) {
        let mut state = self.shared.state();
        state.faults.push(n, Fault::TooManyRequests(retry_after));
    }

    /// Answer the next `n` requests with a `THROTTLED` GraphQL error (HTTP 200).
    pub fn throttle_next(&self, n: usize) {
        let mut state = self.shared.state();
        state.faults.push(n, Fault::Throttled);
    }

    /// Answer the next `n` requests with `status`. Panics on a status outside
    /// 100–999.
    pub fn fail_next(&self, n: usize, status: u16) {
        assert!(
            (100..=999).contains(&status),
            "not an HTTP status: {status}"
        );
        let mut state = self.shared.state();
        state.faults.push(n, Fault::Status(status));
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<ShopifyRequest> {
        self.shared.state().requests.clone()
    }
}
