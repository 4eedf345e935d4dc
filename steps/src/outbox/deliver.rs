//! `DeliverWebhook`: POST one outbox message to its endpoint, signed per
//! Standard Webhooks.

use std::time::Duration;

use bytes::Bytes;
use chrono::SecondsFormat;
use http::header::{CONTENT_TYPE, USER_AGENT};
use http::{HeaderValue, Method, Request};
use http_body_util::Full;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tickmark::{Step, StepContext, StepError, StepResult};

use super::signature::sign;
use super::{OutboxEndpoints, OutboxMessage};
use crate::http_client;

/// How long one delivery attempt may take unless the step says otherwise.
pub const DEFAULT_DELIVERY_TIMEOUT: Duration = Duration::from_secs(15);

/// How much of the endpoint's answer is kept in the output.
const MAX_ANSWER_BYTES: usize = 4 * 1024;

/// Delivers an outbox event (see [`outbox`](super)): one POST of
/// `{"type", "timestamp", "data"}` to the endpoint, with the Standard
/// Webhooks headers
///
/// - `webhook-id`: the outbox event's id (the enqueuing step's idempotency
///   key), the same on every attempt, for the receiver to deduplicate on;
/// - `webhook-timestamp`: this attempt's time, Unix seconds;
/// - `webhook-signature`: `v1,` + base64 HMAC-SHA256 of
///   `"{id}.{timestamp}.{body}"` with the endpoint's secret.
///
/// The body is the same on every attempt (its `timestamp` is when the
/// message was enqueued). **Resources**: [`OutboxEndpoints`] (a missing
/// resource or endpoint is retryable: a deploy that adds it fixes it), and
/// the [`HttpClient`](crate::HttpClient) if registered.
/// **Outcome**: 2xx is done, with `{"endpoint", "webhook_id", "status",
/// "response"}` as output; 5xx, 408, 429 (after its `Retry-After`), a timeout
/// (`timeout_ms`, default 15 s) or a connection error is retried on the
/// handler's schedule; any other status is terminal and dead-letters the
/// outbox event, where an operator can see and retry it.
///
/// Register it through [`outbox::handler()`](super::handler()).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeliverWebhook {
    /// Give up on one attempt after this many milliseconds (default 15 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The body of a delivery, in the field order of the Standard Webhooks
/// examples.
#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    event_type: &'a str,
    timestamp: String,
    data: &'a Value,
}

impl DeliverWebhook {
    /// The request for one attempt, signed at `now` (Unix seconds).
    fn request(
        &self,
        ctx: &StepContext<'_>,
        now: i64,
    ) -> Result<(Request<Full<Bytes>>, OutboxMessage), StepError> {
        let event = ctx.event();
        let message: OutboxMessage = serde_json::from_value(event.payload.clone())
            .map_err(|error| StepError::terminal(format!("not an outbox message: {error}")))?;
        let endpoints = ctx.resource::<OutboxEndpoints>()?;
        let endpoint = endpoints.get(&message.endpoint).ok_or_else(|| {
            StepError::retryable(format!(
                "no outbox endpoint named `{}` in this process's OutboxEndpoints",
                message.endpoint
            ))
        })?;
        let id = HeaderValue::from_str(&event.id).map_err(|_| {
            StepError::terminal(format!(
                "outbox event id `{}` cannot be sent as a webhook-id header",
                event.id.escape_debug()
            ))
        })?;
        let body = serde_json::to_vec(&Body {
            event_type: &message.event_type,
            timestamp: event.received_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            data: &message.payload,
        })
        .map_err(|error| StepError::terminal(format!("body cannot be encoded: {error}")))?;
        let signature = sign(endpoint.key(), &event.id, now, &body);

        let mut request = Request::new(Full::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = endpoint.url().clone();
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(http_client::USER_AGENT),
        );
        headers.insert("webhook-id", id);
        headers.insert("webhook-timestamp", HeaderValue::from(now));
        crate::trace_context::send_trace_context(headers);
        headers.insert(
            "webhook-signature",
            HeaderValue::from_str(&signature).map_err(|_| {
                StepError::terminal("signature is not a header value (cannot happen)")
            })?,
        );
        Ok((request, message))
    }
}

#[typetag::serde(name = "tickmark.deliver_webhook")]
#[async_trait::async_trait]
impl Step for DeliverWebhook {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let (request, message) = self.request(ctx, chrono::Utc::now().timestamp())?;
        let timeout = self
            .timeout_ms
            .map_or(DEFAULT_DELIVERY_TIMEOUT, Duration::from_millis);
        let exchange = http_client::client_for(ctx)
            .exchange(request, timeout, MAX_ANSWER_BYTES, ctx.cancellation())
            .await
            .map_err(|error| {
                StepError::retryable(format!("endpoint `{}`: {error}", message.endpoint))
            })?;
        exchange.check(&[]).map_err(|error| {
            let text = format!("endpoint `{}`: {error}", message.endpoint);
            match (error.is_terminal(), error.retry_after()) {
                (true, _) => StepError::terminal(text),
                (false, Some(delay)) => StepError::retryable_after(delay, text),
                (false, None) => StepError::retryable(text),
            }
        })?;
        Ok(json!({
            "endpoint": message.endpoint,
            "webhook_id": ctx.event().id,
            "status": exchange.status.as_u16(),
            "response": exchange.body_value(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;
    use serde_json::json;
    use tickmark::receiver::providers::{Delivery, Provider, StandardWebhooks, Verdict};
    use tickmark::{Event, FailureKind, Resources, StepOutputs};

    use super::*;
    use crate::test_support::{context, Answer, Server};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn outbox_event(endpoint: &str) -> Event {
        Event {
            seq: 7,
            source: "outbox".into(),
            id: "shop:evt_1:notify".into(),
            kind: "webhook.deliver".into(),
            payload: json!({"endpoint": endpoint, "type": "order.confirmed", "payload": {"order": "o_1"}}),
            received_at: chrono::Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
        }
    }

    fn resources(url: &str) -> Resources {
        let mut resources = Resources::default();
        resources.insert(
            OutboxEndpoints::new()
                .endpoint("partner", url, SECRET)
                .unwrap(),
        );
        resources
    }

    #[tokio::test]
    async fn a_signed_request_verifies_with_the_receiver() {
        let event = outbox_event("partner");
        let outputs = StepOutputs::default();
        let resources = resources("http://127.0.0.1:9/hooks");
        let ctx = context(&event, "tickmark.deliver_webhook", &outputs, &resources);
        let now = chrono::Utc::now().timestamp();
        let (request, _) = DeliverWebhook::default().request(&ctx, now).unwrap();
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri(), "http://127.0.0.1:9/hooks");
        let headers = request.headers().clone();
        assert_eq!(headers["webhook-id"], "shop:evt_1:notify");
        assert_eq!(headers["webhook-timestamp"], now.to_string().as_str());
        use http_body_util::BodyExt;
        let body = request.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            body.as_ref(),
            br#"{"type":"order.confirmed","timestamp":"2023-11-14T22:13:20Z","data":{"order":"o_1"}}"#
        );
        let verdict = StandardWebhooks::new([SECRET])
            .unwrap()
            .verify(&Delivery {
                headers: &headers,
                body: &body,
                public_url: "",
                now: chrono::Utc::now(),
            })
            .unwrap();
        let Verdict::Event(verified) = verdict else {
            panic!("expected an event, got {verdict:?}");
        };
        assert_eq!(verified.id.as_deref(), Some("shop:evt_1:notify"));
        assert_eq!(verified.kind, "order.confirmed");
        assert_eq!(verified.payload["data"], json!({"order": "o_1"}));
    }

    #[tokio::test]
    async fn statuses_decide_the_outcome() {
        for (status, expected) in [
            (200, None),
            (204, None),
            (500, Some(FailureKind::Retryable)),
            (429, Some(FailureKind::Retryable)),
            (408, Some(FailureKind::Retryable)),
            (400, Some(FailureKind::Terminal)),
            (410, Some(FailureKind::Terminal)),
            (301, Some(FailureKind::Terminal)),
        ] {
            let server = Server::start(vec![Answer::new(status, "answer")]).await;
            let event = outbox_event("partner");
            let outputs = StepOutputs::default();
            let resources = resources(&server.url("/hooks"));
            let mut ctx = context(&event, "tickmark.deliver_webhook", &outputs, &resources);
            let result = DeliverWebhook::default().run(&mut ctx).await;
            match (result, expected) {
                (Ok(output), None) => {
                    assert_eq!(output["status"], status);
                    assert_eq!(output["webhook_id"], "shop:evt_1:notify");
                    assert_eq!(output["endpoint"], "partner");
                }
                (Err(error), Some(kind)) => {
                    assert_eq!(error.kind(), kind, "{status}: {error}");
                    assert!(error.message().contains("endpoint `partner`"), "{error}");
                }
                (other, _) => panic!("{status}: unexpected {other:?}"),
            }
            assert_eq!(server.seen().len(), 1);
        }
    }

    #[tokio::test]
    async fn missing_endpoints_are_retryable_and_garbage_is_terminal() {
        let outputs = StepOutputs::default();
        let event = outbox_event("elsewhere");
        let resources = resources("http://127.0.0.1:9/");
        let mut ctx = context(&event, "d", &outputs, &resources);
        let error = DeliverWebhook::default().run(&mut ctx).await.unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);

        let none = Resources::default();
        let mut ctx = context(&event, "d", &outputs, &none);
        let error = DeliverWebhook::default().run(&mut ctx).await.unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);

        let mut garbage = outbox_event("partner");
        garbage.payload = json!({"hello": 1});
        let mut ctx = context(&garbage, "d", &outputs, &resources);
        assert!(DeliverWebhook::default()
            .run(&mut ctx)
            .await
            .unwrap_err()
            .is_terminal());
    }
}
