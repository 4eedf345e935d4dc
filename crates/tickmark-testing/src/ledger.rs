//! The effect ledger: an HTTP stub on loopback that a handler's test points
//! its outbound client at. It records every call with its `Idempotency-Key`
//! and answers like an idempotent API (Stripe's): a key seen before gets the
//! first answer again instead of a second effect. At the end,
//! [`EffectLedger::check`] says whether any step's effect happened twice.

mod answer;
mod owner;
mod violation;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::body::Bytes;
use tokio_util::sync::{CancellationToken, DropGuard};

use tickmark_serve::Limits;

pub use owner::EffectOwner;
pub use violation::LedgerViolation;

/// The largest request body the ledger reads: a longer one is answered 413
/// and not recorded.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerCall {
    /// The request method (`POST`).
    pub method: String,
    /// The request path, without the query (`/v1/charges`).
    pub path: String,
    /// The `Idempotency-Key` header, if the call had one.
    pub idempotency_key: Option<String>,
    /// The request body.
    pub body: Bytes,
    /// The step that made the call: the one its key names, or else the one
    /// the test kit says was running when it arrived; `None` if neither.
    /// (A key that holds the running step's key and more, such as
    /// `{ctx.idempotency_key()}-{attempt}`, is the running step's: it would
    /// otherwise read as a step named `send_receipt-2`.)
    pub owner: Option<EffectOwner>,
    /// The step the test kit says was running when the call arrived,
    /// whatever its key names; `None` outside a test engine or between
    /// steps. It made the call: a step that re-sends another step's call
    /// (with a key of its own, or another's) is this one.
    pub running: Option<EffectOwner>,
    /// Whether an earlier call with the same key was replayed instead of
    /// applied (the first answer, sent again).
    pub replayed: bool,
    /// Whether the call took effect: not a replay, not a failure injected
    /// with [`EffectLedger::fail_next`], not refused for reusing a key on
    /// another method or path.
    pub applied: bool,
    /// The status the ledger answered.
    pub status: u16,
}

/// Says which step is running now, for calls whose key does not.
type OwnerNow = Arc<dyn Fn() -> Option<EffectOwner> + Send + Sync>;

/// The HTTP stub that records each call. Cheap to clone (the clones share
/// one record); the server stops when the last clone drops, or at
/// [`shutdown`](Self::shutdown).
///
/// Every method and path is answered `200` with
/// `{"id": "eff_<n>", "idempotency_key": …, "path": …}`, a new effect;
/// except a call whose `Idempotency-Key` was seen before on the same method
/// and path, answered the first answer again (with `Idempotent-Replayed:
/// true`) whatever its body; one whose key was seen on another method or
/// path, `422`; a body over 1 MiB (`MAX_BODY_BYTES`), `413` (not recorded); and
/// failures injected with [`fail_next`](Self::fail_next).
///
/// ```
/// use axum::body::Body;
/// use axum::http::Request;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use tickmark::testing::{EffectLedger, LedgerViolation};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = EffectLedger::start().await?;
/// let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
/// let post = |key: Option<&str>| {
///     let request = Request::post(format!("{}/v1/receipts", ledger.url()));
///     let request = match key {
///         Some(key) => request.header("Idempotency-Key", key),
///         None => request,
///     };
///     request.body(Body::from(r#"{"amount": 100}"#))
/// };
///
/// // A step re-run after a crash, sending its key both times: one effect.
/// client.request(post(Some("stripe:evt_1:send_receipt"))?).await?;
/// client.request(post(Some("stripe:evt_1:send_receipt"))?).await?;
/// assert_eq!(ledger.effects().len(), 1);
/// assert_eq!(ledger.check(), Ok(()));
///
/// // The same without a key: two effects, of a step the test kit names.
/// ledger.clear();
/// client.request(post(None)?).await?;
/// client.request(post(None)?).await?;
/// assert_eq!(ledger.effects().len(), 2);
/// let violations = ledger.check().unwrap_err();
/// assert!(matches!(
///     violations[0],
///     LedgerViolation::DoubleEffectWithoutKey { times: 2, .. }
/// ));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EffectLedger {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: CancellationToken,
    /// Stops the server when the last clone drops.
    _stop_on_drop: Arc<DropGuard>,
}

/// What the server and the handles share.
#[derive(Default)]
struct Shared {
    record: Mutex<Record>,
    owner_now: Mutex<Option<OwnerNow>>,
}

/// The calls and what the keys were answered.
#[derive(Default)]
struct Record {
    calls: Vec<LedgerCall>,
    /// The first answer to each key, replayed on its re-sends.
    answers: HashMap<String, KeptAnswer>,
    /// Effects applied so far: the next one's id is `eff_{applied + 1}`.
    applied: u64,
    /// Calls still to answer with an injected failure, and its status.
    failures: Option<(usize, u16)>,
}

/// The answer kept for a key.
struct KeptAnswer {
    method: String,
    path: String,
    body: Bytes,
}

impl EffectLedger {
    /// Start the stub on `127.0.0.1` with a port of the system's choosing
    /// ([`url`](Self::url) says which). It answers every method and path.
    ///
    /// It is served by [`tickmark_serve::serve`] with the default
    /// [`Limits`], as every listener tickmark starts is: among them, 128
    /// connections at once from one address (every test client is
    /// `127.0.0.1`), each kept idle for 10 seconds at most.
    pub async fn start() -> io::Result<Self> {
        let limits = Limits::default();
        let listener =
            tickmark_serve::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), &limits).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let router = answer::router(Arc::clone(&shared));
        let stop = CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            if let Err(error) = tickmark_serve::serve(listener, router, limits, stopped).await {
                tracing::warn!(%error, "the effect ledger stopped serving");
            }
        });
        Ok(Self {
            shared,
            addr,
            _stop_on_drop: Arc::new(stop.clone().drop_guard()),
            stop,
        })
    }

    /// Where the stub listens: `http://127.0.0.1:PORT`, no trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the stub listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every call recorded, in the order they arrived.
    pub fn calls(&self) -> Vec<LedgerCall> {
        self.shared.record().calls.clone()
    }

    /// Effects applied: calls that were not replays of an earlier key (nor
    /// injected failures, nor refused).
    pub fn effects(&self) -> Vec<LedgerCall> {
        let record = self.shared.record();
        record.calls.iter().filter(|c| c.applied).cloned().collect()
    }

    /// Ok when every logical effect happened once; otherwise every
    /// violation, each naming the step and the fix.
    ///
    /// Calls are grouped by (owner, method, path). A group breaks the rule
    /// when it holds more than one call without a key, or a call without a
    /// key and one with ([`LedgerViolation::DoubleEffectWithoutKey`]), or
    /// more than one distinct key ([`LedgerViolation::KeysDisagree`]).
    /// Replays never count. Calls answered with an injected failure
    /// ([`fail_next`](Self::fail_next)) do: in production a 5xx can come
    /// after the effect was applied (a proxy's timeout), so re-sending such
    /// a call without its key may apply it twice.
    pub fn check(&self) -> Result<(), Vec<LedgerViolation>> {
        let found = violation::violations(&self.shared.record().calls);
        if found.is_empty() {
            Ok(())
        } else {
            Err(found)
        }
    }

    /// Forget every call, every key's answer and any failures still to
    /// inject (between test scenarios). Effect ids keep counting up.
    pub fn clear(&self) {
        let mut record = self.shared.record();
        record.calls.clear();
        record.answers.clear();
        record.failures = None;
    }

    /// Answer the next `n` calls with `status` (e.g. 500, 503) without
    /// applying them or keeping their keys, to test a step's retries. A
    /// status that is not one (below 100 or above 999) answers 500. Replaces
    /// any failures still to inject; `n = 0` cancels them.
    pub fn fail_next(&self, n: usize, status: u16) {
        self.shared.record().failures = (n > 0).then_some((n, status));
    }

    /// Who to blame for calls whose key is not a tickmark key (or that have
    /// none): the test kit installs a closure returning the step running
    /// now, called as each call arrives (with no lock of the ledger held).
    /// It should return `None` when it cannot tell (several steps running
    /// at once).
    pub(crate) fn attribute_with(
        &self,
        owner_now: impl Fn() -> Option<EffectOwner> + Send + Sync + 'static,
    ) {
        *self
            .shared
            .owner_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(owner_now));
    }

    /// Stop serving now (the record stays readable). Connections open are
    /// let finish their requests, for 10 seconds at most.
    pub fn shutdown(&self) {
        self.stop.cancel();
    }
}

impl fmt::Debug for EffectLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EffectLedger")
            .field("url", &self.url())
            .field("calls", &self.shared.record().calls.len())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// The record, even if a thread panicked holding it (every change to
    /// it is made whole under the lock, so what is there is consistent).
    fn record(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The step running now, as the installed closure says.
    fn owner_now(&self) -> Option<EffectOwner> {
        let owner_now = self
            .owner_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        owner_now.and_then(|owner_now| owner_now())
    }
}
