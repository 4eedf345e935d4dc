//! `send_receipt`: POST the receipt to `--receipt-url` with the step's
//! idempotency key in an `Idempotency-Key` header, so a re-run after a crash
//! (or a retry after a timeout) is absorbed by the receiving service.

use std::fmt;

use axum::body::{Body, Bytes};
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{Step, StepContext, StepError, StepResult};

use super::{Invoice, Settings};

/// The HTTP client the step posts with (a resource: one pool per process).
#[derive(Clone)]
pub struct ReceiptClient(Client<HttpConnector, Body>);

impl ReceiptClient {
    /// A plain-HTTP client with a connection pool.
    pub fn new() -> Self {
        Self(Client::builder(TokioExecutor::new()).build_http())
    }
}

impl Default for ReceiptClient {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ReceiptClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReceiptClient")
    }
}

/// Posts `{"event_id", "invoice", "customer", "amount_paid", "currency",
/// "balance"}`. A 2xx is done; a 5xx, 408, 429, a timeout or a connection
/// error is retried on the handler's schedule; any other answer dead-letters
/// the event. Without `--receipt-url` the step is skipped (its output says so).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SendReceipt;

#[typetag::serde(name = "payments.send_receipt")]
#[async_trait::async_trait]
impl Step for SendReceipt {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let settings = ctx.resource::<Settings>()?;
        let Some(url) = &settings.receipt_url else {
            return Ok(json!({ "skipped": true, "reason": "no --receipt-url configured" }));
        };
        let client = ctx.resource::<ReceiptClient>()?;
        let invoice = Invoice::from_event(ctx.event())?;
        let mut receipt = invoice.to_json();
        receipt["event_id"] = json!(ctx.event().id);
        receipt["balance"] = ctx
            .output("credit_account")
            .map(|credit| credit["balance"].clone())
            .unwrap_or_default();
        let request = Request::post(url.uri().clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", ctx.idempotency_key())
            .body(Body::from(receipt.to_string()))
            .map_err(StepError::terminal)?;

        let call = async {
            let response = client.0.request(request).await?;
            let status = response.status();
            // Read (a bounded part of) the answer so the connection can be reused.
            let body = response
                .into_body()
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .unwrap_or_else(|_| Bytes::new());
            Ok::<_, hyper_util::client::legacy::Error>((status, body))
        };
        let (status, body) = tokio::select! {
            answered = tokio::time::timeout(settings.receipt_timeout, call) => match answered {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => {
                    return Err(StepError::retryable(format!("receipt service unreachable at {url}: {error}")))
                }
                Err(_) => {
                    return Err(StepError::retryable(format!(
                        "receipt service at {url} did not answer within {:?}",
                        settings.receipt_timeout
                    )))
                }
            },
            _ = ctx.cancellation().cancelled() => {
                return Err(StepError::retryable("cancelled while posting the receipt"));
            }
        };
        let snippet = String::from_utf8_lossy(body.get(..200).unwrap_or(&body[..])).into_owned();
        classify(status, &snippet)?;
        Ok(json!({ "sent": true, "status": status.as_u16(), "url": url.to_string() }))
    }
}

/// 2xx is success; 5xx, 408 and 429 are worth retrying; anything else is a
/// refusal no retry will change.
fn classify(status: StatusCode, answer: &str) -> Result<(), StepError> {
    let message = format!("receipt service answered {status}: {answer}");
    if status.is_success() {
        Ok(())
    } else if status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
    {
        Err(StepError::retryable(message))
    } else {
        Err(StepError::terminal(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified() {
        assert!(classify(StatusCode::OK, "").is_ok());
        assert!(classify(StatusCode::ACCEPTED, "").is_ok());
        for retry in [500, 502, 503, 504, 408, 429] {
            let status = StatusCode::from_u16(retry).unwrap();
            assert!(!classify(status, "").unwrap_err().is_terminal(), "{retry}");
        }
        for terminal in [400, 401, 404, 409, 422, 301] {
            let status = StatusCode::from_u16(terminal).unwrap();
            assert!(
                classify(status, "").unwrap_err().is_terminal(),
                "{terminal}"
            );
        }
    }
}
