//! Shopify's mandatory compliance webhooks, as ready-made steps: every
//! public app must handle `customers/redact`, `shop/redact` and
//! `customers/data_request`
//! (<https://shopify.dev/docs/apps/build/compliance/privacy-law-compliance>).
//!
//! - [`RedactCustomer`] erases what tickmark holds about the customer (by
//!   id and by email);
//! - [`RedactShop`] erases what it holds about the shop;
//! - [`AnswerDataRequest`] gathers what it holds about the customer into
//!   its output, for the app to hand to the store owner.
//!
//! They erase tickmark's own rows (docs/privacy.md); the app's own tables
//! are the app's to erase, in a step of its own beside these. The events
//! are found by their subjects, so the handlers of the app's other topics
//! must record them: [`record_subjects`] declares the subjects of Shopify's
//! payloads on a handler. Each step's `body` is the JSON pointer of
//! Shopify's body in the payload (`""`: the payload is the body).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tickmark::privacy::Subject;
use tickmark::{Handler, Step, StepContext, StepError, StepResult};

/// A customer, by Shopify's customer id.
pub const CUSTOMER: &str = "shopify_customer";
/// A customer, by email.
pub const EMAIL: &str = "email";
/// A shop, by its `<handle>.myshopify.com` domain.
pub const SHOP: &str = "shopify_shop";

/// `handler`, recording the subjects of a Shopify payload whose body is at
/// `body` and whose shop domain is at `shop`: the customer's id
/// (`customer/id`) and email (`customer/email`, and an order's `email`),
/// and the shop.
pub fn record_subjects(handler: Handler, body: &str, shop: &str) -> Handler {
    handler
        .subject(CUSTOMER, format!("{body}/customer/id"))
        .subject(EMAIL, format!("{body}/customer/email"))
        .subject(EMAIL, format!("{body}/email"))
        .subject(SHOP, shop)
}

/// `customers/redact`: erase the customer (by id and by email).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RedactCustomer {
    /// Where Shopify's body is in the payload (`""`: the payload).
    pub body: String,
}

/// `shop/redact` (sent 48 hours after the app is uninstalled): erase the shop.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RedactShop {
    /// Where Shopify's body is in the payload (`""`: the payload).
    pub body: String,
}

/// `customers/data_request`: what tickmark holds about the customer, as
/// this step's output (sealed at rest like every output when keys are set).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AnswerDataRequest {
    /// Where Shopify's body is in the payload (`""`: the payload).
    pub body: String,
}

impl RedactCustomer {
    /// With Shopify's body at JSON pointer `body` of the payload.
    pub fn body_at(body: &str) -> Self {
        Self {
            body: body.to_owned(),
        }
    }
}

impl RedactShop {
    /// With Shopify's body at JSON pointer `body` of the payload.
    pub fn body_at(body: &str) -> Self {
        Self {
            body: body.to_owned(),
        }
    }
}

impl AnswerDataRequest {
    /// With Shopify's body at JSON pointer `body` of the payload.
    pub fn body_at(body: &str) -> Self {
        Self {
            body: body.to_owned(),
        }
    }
}

/// Shopify's body in the payload.
fn body<'a>(ctx: &'a StepContext<'_>, pointer: &str) -> Result<&'a Value, StepError> {
    ctx.event().payload.pointer(pointer).ok_or_else(|| {
        StepError::terminal(format!("the payload has no Shopify body at `{pointer}`"))
    })
}

/// The value at `pointer` of `body` as a subject's value.
fn text_at(body: &Value, pointer: &str) -> Option<String> {
    match body.pointer(pointer)? {
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

/// The customer's subjects: by id and by email.
fn customer(body: &Value) -> Vec<Subject> {
    let mut subjects = Vec::new();
    if let Some(id) = text_at(body, "/customer/id") {
        subjects.push(Subject::new(CUSTOMER, id));
    }
    if let Some(email) = text_at(body, "/customer/email") {
        subjects.push(Subject::new(EMAIL, email));
    }
    subjects
}

/// Erase `subjects`; a retryable error while some of their events run.
async fn erase(ctx: &StepContext<'_>, subjects: &[Subject], reason: &str) -> StepResult {
    if subjects.is_empty() {
        return Err(StepError::terminal("the body names no subject to erase"));
    }
    let (mut erased, mut cancelled, mut running) = (0, 0, 0);
    for subject in subjects {
        let report = ctx.erase_subject(subject, reason).await?;
        erased += report.erased.len();
        cancelled += report.cancelled.len();
        running += report.still_running.len();
    }
    if running > 0 {
        return Err(StepError::retryable(format!(
            "{running} events of the subject are running; erased once they finish, on the next attempt"
        )));
    }
    Ok(json!({ "erased": erased, "cancelled": cancelled }))
}

#[typetag::serde(name = "shopify_redact_customer")]
#[async_trait::async_trait]
impl Step for RedactCustomer {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let subjects = customer(body(ctx, &self.body)?);
        erase(ctx, &subjects, "shopify customers/redact").await
    }
}

#[typetag::serde(name = "shopify_redact_shop")]
#[async_trait::async_trait]
impl Step for RedactShop {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let shop = text_at(body(ctx, &self.body)?, "/shop_domain")
            .map(|domain| Subject::new(SHOP, domain));
        erase(ctx, shop.as_slice(), "shopify shop/redact").await
    }
}

#[typetag::serde(name = "shopify_answer_data_request")]
#[async_trait::async_trait]
impl Step for AnswerDataRequest {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let body = body(ctx, &self.body)?;
        let request_id = body.pointer("/data_request/id").cloned();
        let mut events = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for subject in customer(body) {
            for record in ctx.subject_events(&subject).await? {
                if record.event.seq == ctx.event().seq || !seen.insert(record.event.seq) {
                    continue;
                }
                events.push(json!({
                    "source": record.event.source,
                    "id": record.event.id,
                    "kind": record.event.kind,
                    "received_at": record.event.received_at,
                    "state": record.state,
                    "payload": record.event.payload,
                }));
            }
        }
        Ok(json!({ "data_request_id": request_id, "events": events }))
    }
}
