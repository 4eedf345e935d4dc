//! `EnqueueWebhook`: put an outbound webhook in the outbox, exactly once per
//! event.

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{Accepted, NewEvent, Step, StepContext, StepError, StepResult};

use super::{OutboxEndpoints, OutboxMessage, OutboxOrigin, KIND, SOURCE};
use crate::value_from::ValueFrom;

/// Enqueues an outbound webhook: an event of source `outbox`, kind
/// `webhook.deliver`, whose id is this step's idempotency key
/// (`{source}:{event id}:{step}`). A re-run of this step is therefore a
/// duplicate in the inbox, never a second message; the message itself is
/// delivered by [`DeliverWebhook`](super::DeliverWebhook), in any worker,
/// with its own retries.
///
/// - **Config**: the endpoint's name (in [`OutboxEndpoints`]), the webhook's
///   event type, and where the payload comes from ([`ValueFrom`]).
/// - **Resources**: none needed; when [`OutboxEndpoints`] is registered in
///   this process, an unknown endpoint name is a terminal error here rather
///   than a dead letter later.
/// - **Outcome**: `{"outbox_id", "outcome": "new" | "duplicate"}`. A payload
///   that cannot be resolved is terminal; so is an engine without the outbox
///   handler (the message would be recorded as ignored).
///
/// ```
/// use tickmark::Handler;
/// use tickmark_steps::outbox::EnqueueWebhook;
/// use tickmark_steps::ValueFrom;
///
/// let handler = Handler::new().named_step(
///     "tell_partner",
///     EnqueueWebhook::new("partner", "invoice.paid", ValueFrom::event_at("/data/object")),
/// );
/// assert_eq!(handler.step_names(), ["tell_partner"]);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnqueueWebhook {
    /// The endpoint's name in [`OutboxEndpoints`].
    pub endpoint: String,
    /// The webhook's event type (the body's `type`).
    pub event_type: String,
    /// The webhook's data (the body's `data`).
    pub payload: ValueFrom,
}

impl EnqueueWebhook {
    /// Send `payload` as an `event_type` webhook to endpoint `endpoint`.
    pub fn new(
        endpoint: impl Into<String>,
        event_type: impl Into<String>,
        payload: ValueFrom,
    ) -> Self {
        Self {
            endpoint: endpoint.into(),
            event_type: event_type.into(),
            payload,
        }
    }
}

#[typetag::serde(name = "tickmark.enqueue_webhook")]
#[async_trait::async_trait]
impl Step for EnqueueWebhook {
    fn reads(&self) -> Vec<&str> {
        self.payload.reads_step().into_iter().collect()
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        if let Ok(endpoints) = ctx.resource::<OutboxEndpoints>() {
            if endpoints.get(&self.endpoint).is_none() {
                return Err(StepError::terminal(format!(
                    "no outbox endpoint named `{}` in OutboxEndpoints",
                    self.endpoint
                )));
            }
        }
        let message = OutboxMessage {
            endpoint: self.endpoint.clone(),
            event_type: self.event_type.clone(),
            payload: self.payload.resolve(ctx)?.into_owned(),
            origin: Some(OutboxOrigin {
                source: ctx.event().source.clone(),
                event_id: ctx.event().id.clone(),
                step: ctx.step_name().to_owned(),
            }),
        };
        let payload = serde_json::to_value(&message)
            .map_err(|error| StepError::terminal(format!("message cannot be encoded: {error}")))?;
        let id = ctx.idempotency_key().to_owned();
        let outcome = match ctx
            .enqueue(NewEvent::with_id(SOURCE, id.clone(), KIND, payload))
            .await?
        {
            Accepted::New { .. } => "new",
            Accepted::Duplicate => "duplicate",
            Accepted::Ignored { .. } => {
                return Err(StepError::terminal(format!(
                    "outbox event `{id}` was recorded as ignored: this engine has no handler for \
                     ({SOURCE}, {KIND}); register `tickmark_steps::outbox::handler()`, then \
                     retry the outbox event"
                )))
            }
        };
        Ok(json!({ "outbox_id": id, "outcome": outcome }))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tickmark::{FailureKind, Resources, StepOutputs};

    use super::*;
    use crate::test_support::{context, event};

    #[tokio::test]
    async fn an_unknown_endpoint_is_terminal_when_endpoints_are_known() {
        let event = event("evt_1", json!({}));
        let outputs = StepOutputs::default();
        let mut resources = Resources::default();
        resources.insert(
            OutboxEndpoints::new()
                .endpoint("partner", "http://h/", "whsec_c2VjcmV0")
                .unwrap(),
        );
        let mut ctx = context(&event, "notify", &outputs, &resources);
        let error = EnqueueWebhook::new("partnr", "t", ValueFrom::event())
            .run(&mut ctx)
            .await
            .unwrap_err();
        assert!(error.is_terminal());
        assert!(error.message().contains("`partnr`"), "{error}");
        // Known endpoint, but this context has no inbox (built outside a
        // worker): retryable, from the engine.
        let error = EnqueueWebhook::new("partner", "t", ValueFrom::event())
            .run(&mut ctx)
            .await
            .unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);
    }

    #[test]
    fn the_stored_form() {
        let step: &dyn Step = &EnqueueWebhook::new("p", "order.confirmed", ValueFrom::event());
        assert_eq!(
            serde_json::to_value(step).unwrap(),
            json!({"type": "tickmark.enqueue_webhook", "config": {
                "endpoint": "p", "event_type": "order.confirmed", "payload": {"from": "event"},
            }})
        );
    }
}
