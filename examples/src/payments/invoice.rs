//! The fields of a Stripe `invoice.payment_succeeded` event the steps use.

use serde_json::Value;
use tickmark::{Event, StepError};

/// The paid invoice inside the event (`data.object`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invoice {
    /// `data.object.id`, e.g. `in_1…` (may be absent in hand-made events).
    pub id: Option<String>,
    /// `data.object.customer`, e.g. `cus_…`.
    pub customer: String,
    /// `data.object.amount_paid`, in the currency's smallest unit (cents).
    pub amount_paid: i64,
    /// `data.object.currency`, e.g. `usd`, when present.
    pub currency: Option<String>,
}

impl Invoice {
    /// Read the invoice from a verified event. A missing or mistyped field is
    /// a terminal failure: retrying will not change a stored payload.
    pub fn from_event(event: &Event) -> Result<Self, StepError> {
        let object = &event.payload["data"]["object"];
        let customer = object["customer"].as_str().ok_or_else(|| {
            StepError::terminal("data.object.customer is missing or not a string")
        })?;
        let amount_paid = object["amount_paid"].as_i64().ok_or_else(|| {
            StepError::terminal("data.object.amount_paid is missing or not an integer")
        })?;
        if amount_paid < 0 {
            return Err(StepError::terminal("data.object.amount_paid is negative"));
        }
        Ok(Self {
            id: object["id"].as_str().map(str::to_owned),
            customer: customer.to_owned(),
            amount_paid,
            currency: object["currency"].as_str().map(str::to_owned),
        })
    }

    /// The invoice as the receipt's JSON fields.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "invoice": self.id,
            "customer": self.customer,
            "amount_paid": self.amount_paid,
            "currency": self.currency,
        })
    }
}
