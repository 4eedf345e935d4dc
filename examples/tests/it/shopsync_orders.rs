//! The `shopsync` order flow, end to end: real `shopsync` processes, real
//! sockets, signed Shopify deliveries, a fake Admin API that keeps
//! idempotency keys as a real one does, and worker processes SIGKILLed in
//! the middle of a call.
//!
//! Each order's `orders/create` runs `reserve_stock`, then waits (durably)
//! for the order's `orders/paid` up to `--pay-timeout-secs`, then runs
//! `fulfill` (paid) or `release_stock` (not paid in time). The orders are
//! paid in five ways:
//!
//! | payment | how the test sends it | expected |
//! |---|---|---|
//! | `Before` | `orders/paid` answered before `orders/create` is sent | fulfil (the wait finds the earlier event) |
//! | `RightAfter` | `orders/paid` right after `orders/create` was answered | fulfil (*) |
//! | `WhileWaiting` | `orders/paid` once the database shows the order waiting | fulfil (*) (the accept wakes the wait) |
//! | `Never` | no `orders/paid` | release |
//! | `TooLate` | `orders/paid` once the API has applied the order's release | release, and never a fulfil |
//!
//! (*) when the `orders/paid` was answered before the order's first reserve
//! call reached the API plus the pay timeout. The wait begins after that
//! call, so its deadline is later still, and an `orders/paid` accepted
//! before the deadline must be matched. One answered later may be matched or
//! not (the deadline passed, but the wait may run after it and find the
//! payment); the test then holds it only to "exactly one of the two". No
//! expectation depends on how fast the machine is: each is derived from
//! what happened before what.
//!
//! (A `WhileWaiting` order whose whole wait slipped between two looks at
//! the database, and was released, is paid too late and expected so.)
//!
//! Every delivery is sent 1 to 3 times (some copies at once), round-robin to
//! the processes. A few orders' first `reserve` call is held by the API
//! until the test has SIGKILLed the process making it (found by the lease
//! owner in the database) and started another; the lease runs out and
//! another process calls again, with the same key. The API also loses the
//! answer of some orders' first reserve (applied, answered 503) and
//! throttles some orders' first fulfil or release (429, not applied).
//!
//! What is counted, from the fake API's log: the API *applies* a call (an
//! effect) only for the first call of an `Idempotency-Key`; a later call
//! with a key already applied to the same order and action is answered from
//! the stored result and applies nothing (a *replay*), as Stripe's API
//! does; a key applied to another call is refused (422). So a
//! re-sent call (after a crash, a lost answer, a 429) is harmless only if it
//! carries the same key, and the test checks both halves:
//!
//! - effects: every order has exactly `[reserve, fulfill]` or
//!   `[reserve, release]`, in that order, as its payment says: one reserve,
//!   and then exactly one of the two, never both;
//! - calls: every call on an order carries the key of its step of that
//!   order's one `orders/create` event (`shopify:<webhook id>:<step>`), so
//!   every re-sent call is a retry of the same step, absorbed by the key,
//!   and never a second run under a new key (which the API would apply
//!   again). No call is refused.
//!
//! The database must agree: one event per webhook id, all `done`; in each
//! order's step-status rows `reserve_stock` and `paid` are done, the branch
//! taken is done and the other `skipped`; the wait's output names the
//! order's own `orders/paid` webhook; `orders/paid` events are recorded.
//! And of the orders paid while they waited, at least one was fulfilled
//! before its deadline could have come: the payment's accept woke it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use tickmark::Backend;
use tickmark_tests::http_client::{HttpClient, LoopbackServer, Outgoing};
use tickmark_tests::{Probe, TestDb};
use tokio::process::{Child, Command};
use tokio::sync::{Notify, Semaphore};

const SECRET: &str = "shpss_shopsync_orders_e2e_secret_0123456789";

/// `--pay-timeout-secs`: short, so that unpaid orders time out during the test.
const PAY_TIMEOUT_SECS: u64 = 4;
const PAY_TIMEOUT: Duration = Duration::from_secs(PAY_TIMEOUT_SECS);

/// `--lease-secs`: a killed process's steps are taken over within this.
const LEASE_SECS: u64 = 3;

/// Generous limits for conditions that normally hold within seconds.
const PATIENCE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// The fake Admin API.

/// The three calls of the order flow (the URL's last segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Action {
    Reserve,
    Fulfill,
    Release,
}

impl Action {
    fn parse(segment: &str) -> Option<Action> {
        match segment {
            "reserve" => Some(Action::Reserve),
            "fulfill" => Some(Action::Fulfill),
            "release" => Some(Action::Release),
            _ => None,
        }
    }

    /// The handler's step that makes this call.
    fn step(self) -> &'static str {
        match self {
            Action::Reserve => "reserve_stock",
            Action::Fulfill => "fulfill",
            Action::Release => "release_stock",
        }
    }
}

/// One call: (shop, order id, action).
type Target = (String, String, Action);

/// What the API did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The first call of its key: the effect happened; 200.
    Applied,
    /// Applied, but answered 503, as when the answer is lost on the way
    /// back: the caller cannot tell, and must call again with the same key.
    AppliedAnswerLost,
    /// The key was already applied to this same call: the stored answer
    /// (200), nothing applied.
    Replayed,
    /// 429 `Retry-After: 1`, nothing applied.
    Throttled,
    /// No key (400), or a key already applied to another call (422).
    Refused,
}

#[derive(Debug, Clone)]
struct ApiCall {
    at: Instant,
    shop: String,
    order: String,
    action: Action,
    key: Option<String>,
    body: Value,
    answer: Answer,
}

/// What the API applied to an order.
#[derive(Debug, Clone)]
struct Effect {
    action: Action,
    key: String,
}

/// Faults the API injects into the *first* call of a target.
#[derive(Debug, Default)]
struct Faults {
    /// Apply, then answer 503.
    lose_first_answer: HashSet<Target>,
    /// Answer 429 without applying.
    throttle_first: HashSet<Target>,
    /// Apply, then hold the answer until the test releases it (after it has
    /// SIGKILLed the process waiting for it).
    hold_first: HashMap<Target, Arc<Notify>>,
}

#[derive(Debug, Default)]
struct ApiLog {
    calls: Vec<ApiCall>,
    /// Every key applied, and the call it was applied to.
    applied: HashMap<String, Target>,
    /// The effects per (shop, order id), in the order applied.
    effects: HashMap<(String, String), Vec<Effect>>,
    /// Targets called at least once (faults hit only the first call).
    seen: HashSet<Target>,
}

/// `POST /shops/{shop}/orders/{id}/{reserve|fulfill|release}`, idempotent by
/// `Idempotency-Key`.
#[derive(Debug, Clone)]
struct FakeAdminApi {
    log: Arc<Mutex<ApiLog>>,
    faults: Arc<Faults>,
}

impl FakeAdminApi {
    async fn start(faults: Faults) -> (LoopbackServer, Self) {
        let api = FakeAdminApi {
            log: Arc::default(),
            faults: Arc::new(faults),
        };
        let router = axum::Router::new()
            .route(
                "/shops/{shop}/orders/{id}/{action}",
                axum::routing::post(order_call),
            )
            .with_state(api.clone());
        (LoopbackServer::start(router).await, api)
    }

    fn calls(&self) -> Vec<ApiCall> {
        self.log.lock().unwrap().calls.clone()
    }

    fn effects(&self) -> HashMap<(String, String), Vec<Effect>> {
        self.log.lock().unwrap().effects.clone()
    }

    fn has_call(&self, target: &Target) -> bool {
        self.log.lock().unwrap().seen.contains(target)
    }

    fn applied(&self, target: &Target) -> bool {
        self.log
            .lock()
            .unwrap()
            .applied
            .values()
            .any(|t| t == target)
    }

    /// Let a held call answer.
    fn release_hold(&self, target: &Target) {
        if let Some(hold) = self.faults.hold_first.get(target) {
            hold.notify_one();
        }
    }
}

async fn order_call(
    State(api): State<FakeAdminApi>,
    UrlPath((shop, order, action)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(action) = Action::parse(&action) else {
        return (StatusCode::NOT_FOUND, "no such action").into_response();
    };
    let at = Instant::now();
    let target: Target = (shop.clone(), order.clone(), action);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (answer, hold) = {
        let mut log = api.log.lock().unwrap();
        let first = log.seen.insert(target.clone());
        let answer = match &key {
            None => Answer::Refused,
            Some(key) => match log.applied.get(key) {
                Some(applied_to) if *applied_to == target => Answer::Replayed,
                Some(_) => Answer::Refused,
                None if first && api.faults.throttle_first.contains(&target) => Answer::Throttled,
                None => {
                    log.applied.insert(key.clone(), target.clone());
                    log.effects
                        .entry((shop.clone(), order.clone()))
                        .or_default()
                        .push(Effect {
                            action,
                            key: key.clone(),
                        });
                    if first && api.faults.lose_first_answer.contains(&target) {
                        Answer::AppliedAnswerLost
                    } else {
                        Answer::Applied
                    }
                }
            },
        };
        log.calls.push(ApiCall {
            at,
            shop,
            order,
            action,
            key: key.clone(),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            answer,
        });
        let hold = if first {
            api.faults.hold_first.get(&target).cloned()
        } else {
            None
        };
        (answer, hold)
    };
    if let Some(hold) = hold {
        // The caller is SIGKILLed meanwhile; nobody reads this answer.
        let _ = tokio::time::timeout(PATIENCE, hold.notified()).await;
    }
    match answer {
        Answer::Applied | Answer::Replayed => {
            let mut response = (StatusCode::OK, "{}").into_response();
            if answer == Answer::Replayed {
                response
                    .headers_mut()
                    .insert("idempotent-replayed", "true".parse().unwrap());
            }
            response
        }
        Answer::AppliedAnswerLost => {
            (StatusCode::SERVICE_UNAVAILABLE, "upstream went away").into_response()
        }
        Answer::Throttled => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "1")],
            "Exceeded 2 calls per second for api client.",
        )
            .into_response(),
        Answer::Refused if key.is_none() => {
            (StatusCode::BAD_REQUEST, "Idempotency-Key is required").into_response()
        }
        Answer::Refused => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "Idempotency-Key was used for another request",
        )
            .into_response(),
    }
}

// ---------------------------------------------------------------------------
// The app's processes.

/// A running `shopsync` process; killed if the test ends early.
struct App {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl App {
    async fn start(dir: &Path, database_url: &str, admin_api: SocketAddr, flags: &[String]) -> App {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let log = dir.join(format!(
            "shopsync-{}.log",
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let mut child = Command::new(env!("CARGO_BIN_EXE_shopsync"))
            .current_dir(dir)
            .args(["--database-url", database_url, "--listen", "127.0.0.1:0"])
            .args(["--admin-api-url", &format!("http://{admin_api}")])
            .args(flags)
            .env("SHOPIFY_WEBHOOK_SECRET", SECRET)
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "info,sqlx=warn,tickmark::receiver=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("start the shopsync binary");
        let addr = tickmark_tests::announced::listening_address(
            &mut child,
            "shopsync: listening on http://",
            &log,
        )
        .await;
        App { child, addr, log }
    }
}

/// The processes on one database, deliveries sent round-robin to the live
/// ones (as a load balancer would), and SIGKILL-and-replace.
struct Fleet {
    dir: PathBuf,
    database_url: String,
    admin_api: SocketAddr,
    flags: Vec<String>,
    apps: tokio::sync::Mutex<Vec<App>>,
    live: Mutex<Vec<SocketAddr>>,
    /// Every process's log, the killed ones' too.
    logs: Mutex<Vec<PathBuf>>,
    client: HttpClient,
    next: AtomicUsize,
    /// Deliveries in flight at once, at most, not counting urgent ones.
    sending: Semaphore,
    kills: AtomicUsize,
}

impl Fleet {
    async fn start(
        processes: usize,
        dir: &Path,
        database_url: &str,
        admin_api: SocketAddr,
        flags: Vec<String>,
        in_flight: usize,
    ) -> Fleet {
        let fleet = Fleet {
            dir: dir.to_owned(),
            database_url: database_url.to_owned(),
            admin_api,
            flags,
            apps: tokio::sync::Mutex::new(Vec::new()),
            live: Mutex::new(Vec::new()),
            logs: Mutex::new(Vec::new()),
            client: HttpClient::new(),
            next: AtomicUsize::new(0),
            sending: Semaphore::new(in_flight),
            kills: AtomicUsize::new(0),
        };
        for _ in 0..processes {
            fleet.start_one().await;
        }
        fleet
    }

    async fn start_one(&self) {
        let app = App::start(&self.dir, &self.database_url, self.admin_api, &self.flags).await;
        self.logs.lock().unwrap().push(app.log.clone());
        self.live.lock().unwrap().push(app.addr);
        self.apps.lock().await.push(app);
    }

    /// SIGKILL the live process `pid`, then start another; false when
    /// `pid` is not live (an earlier kill took it).
    async fn kill_and_replace(&self, pid: u32) -> bool {
        let mut app = {
            let mut apps = self.apps.lock().await;
            let Some(at) = apps.iter().position(|app| app.child.id() == Some(pid)) else {
                return false;
            };
            apps.remove(at)
        };
        app.child.start_kill().expect("SIGKILL");
        let status = app.child.wait().await.expect("reap the killed process");
        assert!(!status.success(), "killed: {status}");
        self.live.lock().unwrap().retain(|addr| *addr != app.addr);
        self.kills.fetch_add(1, Ordering::Relaxed);
        self.start_one().await;
        true
    }

    /// SIGKILL the oldest live process, then start another.
    async fn kill_oldest_and_replace(&self) {
        let pid = self
            .apps
            .lock()
            .await
            .first()
            .and_then(|app| app.child.id());
        assert!(self.kill_and_replace(pid.expect("a live process")).await);
    }

    /// Deliver to the next live process until one answers 200; its `status`
    /// word (`new` or `duplicate`) and when it came. A refused connection,
    /// a reset (the process was killed) or a 503 is sent again, to the next
    /// process, as Shopify would. An `urgent` delivery does not queue behind
    /// the others: a payment sent after its order's create is sent at once.
    async fn send(&self, delivery: &Delivery, urgent: bool) -> (String, Instant) {
        let _permit = if urgent {
            None
        } else {
            Some(self.sending.acquire().await.unwrap())
        };
        let request = delivery.outgoing();
        let deadline = Instant::now() + PATIENCE;
        loop {
            assert!(
                Instant::now() < deadline,
                "no process took {} within {PATIENCE:?}\n{}",
                delivery.webhook_id,
                self.logs()
            );
            let addr = {
                let live = self.live.lock().unwrap();
                if live.is_empty() {
                    None
                } else {
                    Some(live[self.next.fetch_add(1, Ordering::Relaxed) % live.len()])
                }
            };
            let Some(addr) = addr else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            match self.client.send(addr, &request).await {
                Ok(reply) if reply.status == 200 => {
                    let status = reply.json()["status"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    return (status, Instant::now());
                }
                Ok(reply) if reply.status == 503 => {}
                Ok(reply) => panic!(
                    "{} answered {}: {}",
                    delivery.webhook_id,
                    reply.status,
                    String::from_utf8_lossy(&reply.body)
                ),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn logs(&self) -> String {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .map(|path| {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- {} ---\n{}\n",
                    path.display(),
                    lines[lines.len().saturating_sub(40)..].join("\n")
                )
            })
            .collect()
    }

    /// SIGTERM every live process; each must exit cleanly.
    async fn terminate(&self) {
        let apps = std::mem::take(&mut *self.apps.lock().await);
        for mut app in apps {
            let status = tickmark_tests::terminate::terminate(&mut app.child, "shopsync").await;
            assert!(status.success(), "graceful exit on SIGTERM: {status}");
        }
    }
}

// ---------------------------------------------------------------------------
// Deliveries and orders.

/// One signed Shopify webhook, as Shopify would send it.
#[derive(Debug, Clone)]
struct Delivery {
    webhook_id: String,
    topic: &'static str,
    shop: String,
    body: String,
}

impl Delivery {
    fn outgoing(&self) -> Outgoing {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(self.body.as_bytes());
        let signature =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        Outgoing::post("/hooks/shopify", self.body.clone())
            .header("content-type", "application/json")
            .header("x-shopify-hmac-sha256", signature)
            .header("x-shopify-webhook-id", &self.webhook_id)
            .header("x-shopify-topic", self.topic)
            .header("x-shopify-shop-domain", &self.shop)
    }
}

/// When and whether an order's `orders/paid` is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Payment {
    Before,
    RightAfter,
    WhileWaiting,
    Never,
    TooLate,
}

/// What must happen to an order after its reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Fulfill,
    Release,
    /// Paid around the deadline: exactly one of the two.
    EitherOne,
}

/// One order of the scenario.
#[derive(Debug, Clone)]
struct OrderPlan {
    n: usize,
    shop: String,
    id: String,
    payment: Payment,
    /// How many times each delivery is sent (the same webhook id each time).
    create_copies: usize,
    paid_copies: usize,
    /// Copies sent all at once (else one after another).
    at_once: bool,
}

impl OrderPlan {
    fn new(n: usize) -> OrderPlan {
        let payment = match n % 8 {
            0 | 1 => Payment::Before,
            2 | 3 => Payment::RightAfter,
            4 | 5 => Payment::WhileWaiting,
            6 => Payment::Never,
            _ => Payment::TooLate,
        };
        let s = n % 3;
        OrderPlan {
            n,
            shop: format!("shop-{s}.myshopify.com"),
            // Shopify's ids are unique across shops; they must be here too
            // (the same signed body under one topic is one delivery, whatever
            // its shop header).
            id: ((s as u64 + 1) * 1_000_000 + n as u64).to_string(),
            payment,
            create_copies: 1 + n % 3,
            paid_copies: 1 + (n / 3) % 3,
            at_once: n % 2 == 1,
        }
    }

    fn create_id(&self) -> String {
        format!("create-{}", self.n)
    }

    fn paid_id(&self) -> String {
        format!("paid-{}", self.n)
    }

    fn create(&self) -> Delivery {
        Delivery {
            webhook_id: self.create_id(),
            topic: "orders/create",
            shop: self.shop.clone(),
            body: json!({
                "id": self.id.parse::<u64>().unwrap(),
                "name": format!("#{}", 1000 + self.n),
                "financial_status": "pending",
                "line_items": [{"variant_id": 7_000 + self.n, "quantity": 1 + self.n % 4}],
            })
            .to_string(),
        }
    }

    fn paid(&self) -> Delivery {
        Delivery {
            webhook_id: self.paid_id(),
            topic: "orders/paid",
            shop: self.shop.clone(),
            body: json!({
                "id": self.id.parse::<u64>().unwrap(),
                "name": format!("#{}", 1000 + self.n),
                "financial_status": "paid",
            })
            .to_string(),
        }
    }

    fn target(&self, action: Action) -> Target {
        (self.shop.clone(), self.id.clone(), action)
    }

    /// The idempotency key of `action`'s step of this order's event.
    fn key(&self, action: Action) -> String {
        format!("shopify:{}:{}", self.create_id(), action.step())
    }
}

/// Copies of a delivery still being sent; each task answers the answers
/// (status word, when) of the copies it sent.
type Copying = tokio::task::JoinSet<Vec<(String, Instant)>>;

/// What the test did for one order, and when.
#[derive(Debug, Default)]
struct OrderSent {
    /// Every answer, per webhook id.
    answers: BTreeMap<String, Vec<String>>,
    /// When the first `orders/paid` answer (new or duplicate) came: the
    /// event was accepted before this.
    paid_answered: Option<Instant>,
    /// The `orders/paid` was sent only after the API had applied the
    /// order's release: its wait had settled as timed out.
    paid_after_release: bool,
    /// The `orders/paid` was sent only after the database showed the order
    /// waiting for it.
    paid_while_waiting: bool,
    /// Copies still being sent, per webhook id.
    later: Vec<(String, Copying)>,
}

impl OrderSent {
    fn record(&mut self, webhook_id: &str, answer: String) {
        self.answers
            .entry(webhook_id.to_owned())
            .or_default()
            .push(answer);
    }

    /// Wait for every copy still being sent, and record its answer.
    async fn collect(&mut self) {
        for (webhook_id, mut copying) in std::mem::take(&mut self.later) {
            while let Some(answers) = copying.join_next().await {
                for (answer, _) in answers.unwrap() {
                    self.record(&webhook_id, answer);
                }
            }
        }
    }
}

/// How an order's deliveries are sent.
#[derive(Debug, Clone, Copy)]
struct Copies {
    copies: usize,
    at_once: bool,
    urgent: bool,
}

/// Send `delivery` `how.copies` times, all at once or one after another,
/// as Shopify's redeliveries come; answers when the first copy was answered
/// (the event was accepted by then). The later copies go on in the
/// background, as real redeliveries would, not holding the order's next
/// delivery back; [`OrderSent::collect`] gathers their answers.
async fn send_copies(
    fleet: &Arc<Fleet>,
    delivery: &Delivery,
    how: Copies,
    sent: &mut OrderSent,
) -> Instant {
    let mut later: Copying = tokio::task::JoinSet::new();
    let (answer, at) = if how.at_once {
        for _ in 0..how.copies {
            let (fleet, delivery) = (fleet.clone(), delivery.clone());
            later.spawn(async move { vec![fleet.send(&delivery, how.urgent).await] });
        }
        let mut first = later.join_next().await.unwrap().unwrap();
        first.pop().unwrap()
    } else {
        let first = fleet.send(delivery, how.urgent).await;
        let (fleet, delivery) = (fleet.clone(), delivery.clone());
        later.spawn(async move {
            let mut answers = Vec::new();
            for _ in 1..how.copies {
                answers.push(fleet.send(&delivery, false).await);
            }
            answers
        });
        first
    };
    sent.record(&delivery.webhook_id, answer);
    sent.later.push((delivery.webhook_id.clone(), later));
    at
}

/// Wait, polling, until `condition` holds.
async fn until<F: FnMut() -> bool>(what: &str, fleet: &Fleet, mut condition: F) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}\n{}",
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Send one order's deliveries as its plan says.
async fn run_order(
    fleet: Arc<Fleet>,
    api: FakeAdminApi,
    seen_waiting: Arc<Mutex<HashSet<String>>>,
    plan: OrderPlan,
) -> (usize, OrderSent) {
    let mut sent = OrderSent::default();
    let (create, paid) = (plan.create(), plan.paid());
    let create_copies = Copies {
        copies: plan.create_copies,
        at_once: plan.at_once,
        urgent: false,
    };
    // A payment sent after its create is urgent: the test's own queue must
    // not delay it towards the deadline.
    let (paid_first, paid_after) = (
        Copies {
            copies: plan.paid_copies,
            at_once: plan.at_once,
            urgent: false,
        },
        Copies {
            copies: plan.paid_copies,
            at_once: plan.at_once,
            urgent: true,
        },
    );
    match plan.payment {
        Payment::Before => {
            sent.paid_answered = Some(send_copies(&fleet, &paid, paid_first, &mut sent).await);
            send_copies(&fleet, &create, create_copies, &mut sent).await;
        }
        Payment::RightAfter => {
            send_copies(&fleet, &create, create_copies, &mut sent).await;
            sent.paid_answered = Some(send_copies(&fleet, &paid, paid_after, &mut sent).await);
        }
        Payment::WhileWaiting => {
            send_copies(&fleet, &create, create_copies, &mut sent).await;
            let create_id = plan.create_id();
            let release = plan.target(Action::Release);
            // Waiting, as the database shows it every 100 ms; or, should the
            // whole wait slip between two looks, timed out and released (then
            // this payment is too late, and expected so).
            until(
                &format!("{create_id} to wait for its payment"),
                &fleet,
                || seen_waiting.lock().unwrap().contains(&create_id) || api.applied(&release),
            )
            .await;
            sent.paid_after_release = api.applied(&release);
            sent.paid_while_waiting = !sent.paid_after_release;
            sent.paid_answered = Some(send_copies(&fleet, &paid, paid_after, &mut sent).await);
        }
        Payment::Never => {
            send_copies(&fleet, &create, create_copies, &mut sent).await;
        }
        Payment::TooLate => {
            send_copies(&fleet, &create, create_copies, &mut sent).await;
            let release = plan.target(Action::Release);
            until(
                &format!("{} to be released", plan.create_id()),
                &fleet,
                || api.applied(&release),
            )
            .await;
            sent.paid_after_release = true;
            sent.paid_answered = Some(send_copies(&fleet, &paid, paid_after, &mut sent).await);
        }
    }
    sent.collect().await;
    (plan.n, sent)
}

// ---------------------------------------------------------------------------
// The database.

async fn strings(probe: &Probe, sql: &str) -> Vec<String> {
    match probe {
        Probe::Postgres(pool) => sqlx::query_scalar(sql).fetch_all(pool).await,
        Probe::Sqlite(pool) => sqlx::query_scalar(sql).fetch_all(pool).await,
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// One row of `tickmark_step_status` of an `orders/create` event.
#[derive(Debug, Clone, sqlx::FromRow)]
struct StepRow {
    event_id: String,
    step: String,
    state: String,
    attempts: i64,
    output: Option<String>,
}

async fn order_steps(probe: &Probe) -> Vec<StepRow> {
    const SQL: &str = "SELECT event_id, step, state, CAST(attempts AS BIGINT) AS attempts, \
                       CAST(output AS TEXT) AS output \
                       FROM tickmark_step_status WHERE kind = 'orders/create' \
                       ORDER BY event_id, position";
    match probe {
        Probe::Postgres(pool) => sqlx::query_as(SQL).fetch_all(pool).await,
        Probe::Sqlite(pool) => sqlx::query_as(SQL).fetch_all(pool).await,
    }
    .expect("read tickmark_step_status")
}

/// The pid in a lease owner (`host:pid:random`).
fn pid_of(lease_owner: &str) -> u32 {
    let mut parts = lease_owner.rsplit(':');
    parts.next();
    parts
        .next()
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in lease owner {lease_owner:?}"))
}

// ---------------------------------------------------------------------------
// The scenario.

#[derive(Debug, Clone)]
struct Scenario {
    processes: usize,
    orders: usize,
    /// Orders whose first reserve call is held until its process is killed.
    killed_during: Vec<usize>,
    /// Deliveries in flight at once (besides the urgent payments): what
    /// the database takes without queueing its own writes for seconds.
    in_flight: usize,
}

async fn orders_under_chaos(db: TestDb, scenario: Scenario) {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let plans: Vec<OrderPlan> = (0..scenario.orders).map(OrderPlan::new).collect();

    let mut faults = Faults::default();
    for plan in &plans {
        if plan.n % 10 == 5 {
            faults
                .lose_first_answer
                .insert(plan.target(Action::Reserve));
        }
        if plan.n % 10 == 6 {
            faults.throttle_first.insert(plan.target(Action::Fulfill));
            faults.throttle_first.insert(plan.target(Action::Release));
        }
    }
    for &n in &scenario.killed_during {
        faults
            .hold_first
            .insert(plans[n].target(Action::Reserve), Arc::new(Notify::new()));
    }
    let (api_server, api) = FakeAdminApi::start(faults).await;
    let flags: Vec<String> = [
        "--pay-timeout-secs",
        &PAY_TIMEOUT_SECS.to_string(),
        "--lease-secs",
        &LEASE_SECS.to_string(),
        // The order calls take tokens from the shop's bucket: not the limit
        // under test here.
        "--rate",
        "1000",
        "--burst",
        "1000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let fleet = Arc::new(
        Fleet::start(
            scenario.processes,
            dir.path(),
            &db.url,
            api_server.addr,
            flags,
            scenario.in_flight,
        )
        .await,
    );

    // Which orders the database has shown waiting (`wait_key` is set while
    // a wait for an event is pending, cleared when it settles).
    let stop = Arc::new(AtomicBool::new(false));
    let seen_waiting: Arc<Mutex<HashSet<String>>> = Arc::default();
    let watcher = tokio::spawn({
        let (probe, stop, seen) = (db.probe.clone(), stop.clone(), seen_waiting.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let waiting = strings(
                    &probe,
                    "SELECT dedup_key FROM tickmark_events \
                     WHERE kind = 'orders/create' AND wait_key IS NOT NULL",
                )
                .await;
                seen.lock().unwrap().extend(waiting);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    // The kills: when the API holds an order's first reserve call, SIGKILL
    // the process that made it (the event's lease owner), start another,
    // then let the held call answer (to nobody).
    let chaos = tokio::spawn({
        let (fleet, api, probe) = (fleet.clone(), api.clone(), db.probe.clone());
        let killed: Vec<OrderPlan> = scenario
            .killed_during
            .iter()
            .map(|&n| plans[n].clone())
            .collect();
        async move {
            let mut killed_mid_call = Vec::new();
            for plan in killed {
                let target = plan.target(Action::Reserve);
                until(
                    &format!("the held reserve call of {}", plan.create_id()),
                    &fleet,
                    || api.has_call(&target),
                )
                .await;
                let sql = format!(
                    "SELECT coalesce(lease_owner, '') FROM tickmark_events \
                     WHERE dedup_key = '{}' AND state = 'running'",
                    plan.create_id()
                );
                let owner = strings(&probe, &sql).await;
                match owner.first() {
                    Some(owner) => {
                        if !fleet.kill_and_replace(pid_of(owner)).await {
                            // The process making the held call was killed
                            // already (for an earlier held call it also
                            // made): it died mid-call all the same. Kill one
                            // more, as planned.
                            fleet.kill_oldest_and_replace().await;
                        }
                        killed_mid_call.push(plan.n);
                    }
                    None => {
                        // Only if the process stalled past its lease (or the
                        // call timed out) before the kill: another process
                        // has the step. Kill one anyway.
                        eprintln!(
                            "{} was no longer running when its process was to be killed",
                            plan.create_id()
                        );
                        fleet.kill_oldest_and_replace().await;
                    }
                }
                api.release_hold(&target);
            }
            killed_mid_call
        }
    });

    let mut sending = tokio::task::JoinSet::new();
    for plan in plans.clone() {
        sending.spawn(run_order(
            fleet.clone(),
            api.clone(),
            seen_waiting.clone(),
            plan,
        ));
    }
    let mut sent: HashMap<usize, OrderSent> = HashMap::new();
    while let Some(done) = sending.join_next().await {
        let (n, order) = done.unwrap();
        sent.insert(n, order);
    }
    let killed_mid_call = chaos.await.unwrap();
    let sending_took = started.elapsed();

    let webhooks: usize = sent.values().map(|s| s.answers.len()).sum();
    let finished = || async {
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE state IN ('pending', 'running')")
            .await
            == 0
            && db
                .probe
                .scalar("SELECT count(*) FROM tickmark_events")
                .await
                == webhooks as i64
    };
    let deadline = Instant::now() + PATIENCE;
    while !finished().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for every event to finish\n{}",
            fleet.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();

    let calls = api.calls();
    let effects = api.effects();
    let steps = order_steps(&db.probe).await;
    let events: Vec<String> = strings(
        &db.probe,
        "SELECT dedup_key || ' ' || kind || ' ' || state FROM tickmark_events",
    )
    .await;
    let recorded = strings(
        &db.probe,
        "SELECT event_id FROM shopsync_received WHERE kind = 'orders/paid'",
    )
    .await;

    // --- The deliveries: each webhook id accepted once.
    let mut deliveries = 0;
    for (n, order) in &sent {
        for (webhook, answers) in &order.answers {
            deliveries += answers.len();
            assert!(
                answers.iter().all(|a| a == "new" || a == "duplicate"),
                "order {n}: {webhook} answered {answers:?}"
            );
            // A copy whose answer was lost to a kill is sent again and may
            // find its event accepted: then no copy says `new`. Two never do.
            assert!(
                answers.iter().filter(|a| *a == "new").count() <= 1,
                "order {n}: {webhook} accepted twice: {answers:?}"
            );
        }
    }
    assert_eq!(
        events.len(),
        webhooks,
        "one event per webhook id sent, however often it was sent"
    );
    let unfinished: Vec<&String> = events.iter().filter(|e| !e.ends_with(" done")).collect();
    assert!(unfinished.is_empty(), "every event is done: {unfinished:?}");

    // --- The API: no call refused, every call of a known order.
    let refused: Vec<&ApiCall> = calls
        .iter()
        .filter(|c| c.answer == Answer::Refused)
        .collect();
    assert!(
        refused.is_empty(),
        "no call lacks its key or reuses another call's key: {refused:?}"
    );
    let orders_by_target: HashMap<(String, String), &OrderPlan> = plans
        .iter()
        .map(|p| ((p.shop.clone(), p.id.clone()), p))
        .collect();
    for call in &calls {
        assert!(
            orders_by_target.contains_key(&(call.shop.clone(), call.order.clone())),
            "a call for an order that was never sent: {call:?}"
        );
    }

    // --- Each order: its effects, its calls, its step-status rows.
    let steps_of: HashMap<&str, Vec<&StepRow>> =
        steps.iter().fold(HashMap::new(), |mut by, row| {
            by.entry(row.event_id.as_str()).or_default().push(row);
            by
        });
    let recorded: HashSet<&str> = recorded.iter().map(String::as_str).collect();
    let (mut fulfilled, mut released, mut either, mut woken, mut resent) = (0, 0, 0, 0, 0);
    let mut by_payment: BTreeMap<Payment, usize> = BTreeMap::new();
    // From a payment's answer to its order's fulfil call, for the orders
    // paid while they waited.
    let mut wake_latencies: Vec<Duration> = Vec::new();
    for plan in &plans {
        *by_payment.entry(plan.payment).or_default() += 1;
        let order_sent = &sent[&plan.n];
        let order_calls: Vec<&ApiCall> = calls
            .iter()
            .filter(|c| c.shop == plan.shop && c.order == plan.id)
            .collect();
        let first_reserve = order_calls
            .iter()
            .filter(|c| c.action == Action::Reserve)
            .map(|c| c.at)
            .min()
            .unwrap_or_else(|| panic!("order {} was never reserved", plan.n));
        let expect = match plan.payment {
            Payment::Before => Expect::Fulfill,
            Payment::Never | Payment::TooLate => Expect::Release,
            Payment::WhileWaiting if order_sent.paid_after_release => Expect::Release,
            Payment::RightAfter | Payment::WhileWaiting => {
                // The wait began after the first reserve call reached the API,
                // so its deadline is at least `first_reserve + PAY_TIMEOUT`.
                if order_sent.paid_answered.unwrap() < first_reserve + PAY_TIMEOUT {
                    Expect::Fulfill
                } else {
                    Expect::EitherOne
                }
            }
        };

        // Effects: one reserve, then exactly one of fulfill and release.
        let applied: Vec<(Action, &str)> = effects
            .get(&(plan.shop.clone(), plan.id.clone()))
            .map(|e| e.iter().map(|e| (e.action, e.key.as_str())).collect())
            .unwrap_or_default();
        let outcome = match applied.as_slice() {
            [(Action::Reserve, _), (second, _)]
                if matches!(second, Action::Fulfill | Action::Release) =>
            {
                *second
            }
            other => panic!(
                "order {} ({:?}): the API applied {other:?}, not one reserve then exactly one \
                 of fulfill and release; calls: {order_calls:#?}",
                plan.n, plan.payment
            ),
        };
        match (expect, outcome) {
            (Expect::Fulfill, Action::Fulfill) | (Expect::Release, Action::Release) => {}
            (Expect::EitherOne, _) => either += 1,
            _ => panic!(
                "order {} ({:?}, expected {expect:?}) got {outcome:?}; its payment was answered \
                 {} its first reserve call (pay timeout {PAY_TIMEOUT:?}); calls: {order_calls:#?}",
                plan.n,
                plan.payment,
                match order_sent.paid_answered {
                    None => "never: not sent, so not".to_owned(),
                    Some(at) if at >= first_reserve => format!("{:?} after", at - first_reserve),
                    Some(at) => format!("{:?} before", first_reserve - at),
                },
            ),
        }
        if outcome == Action::Fulfill {
            fulfilled += 1;
        } else {
            released += 1;
        }
        for (action, key) in &applied {
            assert_eq!(
                *key,
                plan.key(*action),
                "order {}: {action:?} applied under its step's key",
                plan.n
            );
        }

        // Calls: every call of an action carries that step's one key; the
        // calls beyond the applied one are re-sends the API absorbed.
        for call in &order_calls {
            assert_eq!(
                call.key.as_deref(),
                Some(plan.key(call.action).as_str()),
                "order {}: every {:?} call carries the key of its step: {call:?}",
                plan.n,
                call.action
            );
            assert!(
                call.action == Action::Reserve || call.action == outcome,
                "order {}: a {:?} call, but the order's outcome is {outcome:?}: {call:?}",
                plan.n,
                call.action
            );
        }
        resent += order_calls.len() - applied.len();
        let outcome_call = order_calls
            .iter()
            .find(|c| c.action == outcome && c.answer != Answer::Throttled)
            .expect("the applied call");
        match outcome {
            Action::Fulfill => assert_eq!(
                outcome_call.body,
                json!({"order_id": plan.id, "paid_event_id": plan.paid_id()}),
                "order {}: fulfil names its own orders/paid",
                plan.n
            ),
            _ => assert!(
                outcome_call.body["pay_deadline"].is_string()
                    && outcome_call.body["order_id"] == plan.id,
                "order {}: release says its deadline: {}",
                plan.n,
                outcome_call.body
            ),
        }
        // A payment accepted while the order waited, fulfilled before the
        // earliest its deadline can be: the accept woke the wait (without
        // the wake-up it would sleep to its deadline).
        if order_sent.paid_while_waiting && outcome == Action::Fulfill {
            wake_latencies.push(
                outcome_call
                    .at
                    .saturating_duration_since(order_sent.paid_answered.unwrap()),
            );
        }
        if order_sent.paid_while_waiting
            && outcome == Action::Fulfill
            && outcome_call.at < first_reserve + PAY_TIMEOUT
        {
            woken += 1;
        }

        // Injected faults were absorbed by re-sending with the same key.
        let reserve_calls: Vec<&&ApiCall> = order_calls
            .iter()
            .filter(|c| c.action == Action::Reserve)
            .collect();
        if plan.n % 10 == 5 {
            assert_eq!(
                reserve_calls.first().map(|c| c.answer),
                Some(Answer::AppliedAnswerLost)
            );
            assert!(
                reserve_calls.iter().any(|c| c.answer == Answer::Replayed),
                "order {}: the reserve whose answer was lost was called again, and \
                 replayed: {reserve_calls:?}",
                plan.n
            );
        }
        if plan.n % 10 == 6 {
            let outcome_calls: Vec<Answer> = order_calls
                .iter()
                .filter(|c| c.action == outcome)
                .map(|c| c.answer)
                .collect();
            assert_eq!(
                outcome_calls.get(..2),
                Some(&[Answer::Throttled, Answer::Applied][..]),
                "order {}: a 429, then the call again",
                plan.n
            );
        }

        // The step-status table says the same.
        let create_id = plan.create_id();
        let rows = steps_of
            .get(create_id.as_str())
            .unwrap_or_else(|| panic!("{create_id} has step rows"));
        let state_of = |step: &str| {
            rows.iter()
                .find(|r| r.step == step)
                .map(|r| r.state.as_str())
                .unwrap_or_else(|| panic!("{create_id} has step {step}: {rows:?}"))
        };
        let (taken, skipped) = if outcome == Action::Fulfill {
            ("fulfill", "release_stock")
        } else {
            ("release_stock", "fulfill")
        };
        assert_eq!(
            [
                state_of("reserve_stock"),
                state_of("paid"),
                state_of(taken),
                state_of(skipped)
            ],
            ["done", "done", "done", "skipped"],
            "{create_id}: {rows:?}"
        );
        let wait: Value = rows
            .iter()
            .find(|r| r.step == "paid")
            .and_then(|r| r.output.as_deref())
            .map(|text| serde_json::from_str(text).unwrap())
            .unwrap_or(Value::Null);
        if outcome == Action::Fulfill {
            assert_eq!(
                wait["matched"]["event_id"],
                plan.paid_id(),
                "{create_id}: the wait matched its own payment: {wait}"
            );
        } else {
            assert_eq!(wait["timed_out"], true, "{create_id}: {wait}");
        }
        if killed_mid_call.contains(&plan.n) {
            let attempts = rows
                .iter()
                .find(|r| r.step == "reserve_stock")
                .map(|r| r.attempts)
                .unwrap();
            assert!(
                attempts >= 2 && reserve_calls.len() >= 2,
                "{create_id}: its process was killed during the reserve call, which ran \
                 again elsewhere (attempts {attempts}, calls {reserve_calls:?})"
            );
        }

        // The payment, when sent, was recorded (once: it is keyed by webhook id).
        if plan.payment != Payment::Never {
            assert!(
                recorded.contains(plan.paid_id().as_str()),
                "{} is in shopsync_received",
                plan.paid_id()
            );
        }
    }
    let paid = plans.iter().filter(|p| p.payment != Payment::Never).count();
    assert_eq!(recorded.len(), paid, "each orders/paid recorded once");
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM shopsync_received WHERE kind = 'orders/create'")
            .await,
        0,
        "orders/create has its own handler: not recorded"
    );
    assert_eq!(
        fleet.kills.load(Ordering::Relaxed),
        scenario.killed_during.len(),
        "a process was SIGKILLed mid-call for each held order"
    );
    let waited_for_payment = sent.values().filter(|s| s.paid_while_waiting).count();
    assert!(
        woken >= 1,
        "of {waited_for_payment} orders paid while they waited, at least one was fulfilled \
         before its deadline: the payment's accept wakes the wait"
    );

    wake_latencies.sort();
    let latency = |q: f64| {
        wake_latencies
            .get(((wake_latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    eprintln!(
        "paid while waiting, from the payment's answer to the fulfil call: median {:?}, \
         90th percentile {:?}, most {:?}",
        latency(0.5),
        latency(0.9),
        latency(1.0)
    );
    eprintln!(
        "shopsync orders on {:?}, {} processes, {} SIGKILLed ({killed_mid_call:?} mid-call): \
         {} orders {by_payment:?}, \
         {deliveries} deliveries of {webhooks} webhooks sent in {sending_took:?}; {fulfilled} \
         fulfilled, {released} released ({either} paid around their deadline), {woken} of \
         {waited_for_payment} paid while waiting fulfilled before their deadline; {} API calls, \
         {resent} of them re-sent and absorbed by their key; all done after {:?}",
        db.backend(),
        scenario.processes,
        scenario.killed_during.len(),
        plans.len(),
        calls.len(),
        started.elapsed()
    );

    fleet.terminate().await;
    api_server.shutdown().await;
}

/// 300 orders on PostgreSQL, three processes at a time, three of them
/// SIGKILLed in the middle of a reserve call and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_every_order_is_reserved_once_then_fulfilled_or_released_once() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    orders_under_chaos(
        db,
        Scenario {
            processes: 3,
            orders: 300,
            killed_during: vec![20, 130, 240],
            in_flight: 12,
        },
    )
    .await;
}

/// The same promises on SQLite: 80 orders, one process at a time, killed
/// once in the middle of a reserve call and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_every_order_is_reserved_once_then_fulfilled_or_released_once() {
    let Some(db) = TestDb::new(Backend::Sqlite).await else {
        return;
    };
    orders_under_chaos(
        db,
        Scenario {
            processes: 1,
            orders: 80,
            killed_during: vec![30],
            // One process writes one SQLite file: every accept and every step
            // takes the same write lock.
            in_flight: 4,
        },
    )
    .await;
}
