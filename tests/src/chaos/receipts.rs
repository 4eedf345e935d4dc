//! A stand-in for an external receipt service, on loopback: it answers 200 to
//! every `POST /receipts` and counts every call and every distinct
//! `Idempotency-Key`. A real service would answer a repeated key with the
//! first answer and do nothing again; here, the count of distinct keys is the
//! number of receipts that service would have sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

use crate::http_client::LoopbackServer;

/// What the receipt service saw.
#[derive(Debug, Default, Clone)]
pub struct ReceiptTally {
    /// Every POST.
    pub calls: u64,
    /// Calls per `Idempotency-Key`.
    pub keys: HashMap<String, u64>,
    /// Calls without an `Idempotency-Key` (there should be none).
    pub without_key: u64,
}

/// The running service.
#[derive(Debug)]
pub struct ReceiptService {
    server: LoopbackServer,
    tally: Arc<Mutex<ReceiptTally>>,
}

impl ReceiptService {
    /// Serve on `127.0.0.1:0`.
    pub async fn start() -> ReceiptService {
        let tally = Arc::new(Mutex::new(ReceiptTally::default()));
        let router = Router::new()
            .route("/receipts", post(receive))
            .with_state(Arc::clone(&tally));
        ReceiptService {
            server: LoopbackServer::start(router).await,
            tally,
        }
    }

    /// The URL the nodes post to.
    pub fn url(&self) -> String {
        format!("http://{}/receipts", self.server.addr)
    }

    /// A copy of the counts so far.
    pub fn tally(&self) -> ReceiptTally {
        self.tally
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn receive(
    State(tally): State<Arc<Mutex<ReceiptTally>>>,
    headers: HeaderMap,
) -> (StatusCode, &'static str) {
    let key = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let mut tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
    tally.calls += 1;
    match key {
        Some(key) => *tally.keys.entry(key).or_default() += 1,
        None => tally.without_key += 1,
    }
    (StatusCode::OK, "{\"received\":true}")
}
