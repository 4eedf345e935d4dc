//! The payload of an outbox event: what to send, where, and where it came from.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The payload of an outbox event (source [`SOURCE`](super::SOURCE), kind
/// [`KIND`](super::KIND)), as [`EnqueueWebhook`](super::EnqueueWebhook)
/// writes it and [`DeliverWebhook`](super::DeliverWebhook) reads it.
///
/// ```json
/// {"endpoint": "partner", "type": "order.confirmed", "payload": {"id": "o_1"},
///  "origin": {"source": "shop", "event_id": "evt_1", "step": "tickmark.enqueue_webhook"}}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxMessage {
    /// The name of the endpoint in [`OutboxEndpoints`](super::OutboxEndpoints).
    pub endpoint: String,
    /// The webhook's event type (the body's `type`).
    #[serde(rename = "type")]
    pub event_type: String,
    /// The webhook's data (the body's `data`).
    pub payload: Value,
    /// The event and step that enqueued it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<OutboxOrigin>,
}

/// The event and step that enqueued an outbox message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxOrigin {
    /// The origin event's source.
    pub source: String,
    /// The origin event's id (dedup key).
    pub event_id: String,
    /// The enqueuing step's name.
    pub step: String,
}
