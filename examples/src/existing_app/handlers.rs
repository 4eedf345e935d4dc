//! The shop service's handlers: what runs, in a worker, for each event.
//!
//! Every step here is transactional: its write is in tickmark's transaction
//! on the service's own pool, and commits with the step's mark, so it
//! happens once however often the event is delivered or its worker crashes.
//! Payloads are decoded into the service's own types: a body that does not
//! fit parks the event with serde's message (it waits for a fix and an
//! operator's retry) instead of crediting zero.

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{Handler, Handlers, Step, StepContext, StepError, StepResult};

/// The source of the events this service records itself (`POST /orders`).
pub const APP_SOURCE: &str = "app";
/// Stripe's deliveries, at `POST /webhooks/stripe`.
pub const STRIPE_SOURCE: &str = "stripe";
/// Shopify's deliveries, at `POST /webhooks/shopify`.
pub const SHOPIFY_SOURCE: &str = "shopify";

/// The service's handlers.
pub fn handlers() -> Handlers {
    Handlers::new()
        .on(
            APP_SOURCE,
            "order.created",
            Handler::new().step(ConfirmOrder),
        )
        .on(
            STRIPE_SOURCE,
            "invoice.payment_succeeded",
            Handler::new().step(CreditCustomer),
        )
        .on(
            SHOPIFY_SOURCE,
            "orders/paid",
            Handler::new().step(MarkOrderPaid),
        )
}

/// What `POST /orders` records with the order, in the same transaction.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderCreated {
    /// The order's id.
    pub order_id: String,
}

/// Confirms a new order: one row in `order_confirmations`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ConfirmOrder;

#[typetag::serde(name = "existing_app_confirm_order")]
#[async_trait::async_trait]
impl Step for ConfirmOrder {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let created: OrderCreated = ctx.payload()?;
        ctx.transaction()?
            .query("INSERT INTO order_confirmations (order_id) VALUES ($1)")
            .bind(created.order_id.clone())
            .execute()
            .await?;
        Ok(json!({ "confirmed": created.order_id }))
    }
}

/// Stripe's event, as far as this service reads it.
#[derive(Debug, Deserialize)]
pub struct StripeEvent<T> {
    /// The object the event is about.
    pub data: StripeData<T>,
}

/// Stripe's `data` envelope.
#[derive(Debug, Deserialize)]
pub struct StripeData<T> {
    /// The object.
    pub object: T,
}

/// A paid invoice.
#[derive(Debug, Deserialize)]
pub struct Invoice {
    /// The customer it bills.
    pub customer: String,
    /// What was paid, in cents.
    pub amount_paid: i64,
}

/// Credits the customer's balance with a paid invoice.
#[derive(Debug, Serialize, Deserialize)]
pub struct CreditCustomer;

#[typetag::serde(name = "existing_app_credit_customer")]
#[async_trait::async_trait]
impl Step for CreditCustomer {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let event: StripeEvent<Invoice> = ctx.payload()?;
        let invoice = event.data.object;
        ctx.transaction()?
            .query(
                "INSERT INTO customer_balances (customer, balance_cents) VALUES ($1, $2) \
                 ON CONFLICT (customer) DO UPDATE \
                 SET balance_cents = customer_balances.balance_cents + EXCLUDED.balance_cents",
            )
            .bind(invoice.customer.clone())
            .bind(invoice.amount_paid)
            .execute()
            .await?;
        Ok(json!({ "customer": invoice.customer, "credited": invoice.amount_paid }))
    }
}

/// A Shopify order, as far as this service reads it.
#[derive(Debug, Deserialize)]
pub struct ShopifyOrder {
    /// Shopify's order id.
    pub id: i64,
    /// `paid` once the money is in.
    pub financial_status: String,
}

/// Marks the service's order paid when Shopify says it is.
#[derive(Debug, Serialize, Deserialize)]
pub struct MarkOrderPaid;

#[typetag::serde(name = "existing_app_mark_order_paid")]
#[async_trait::async_trait]
impl Step for MarkOrderPaid {
    fn transactional(&self) -> bool {
        true
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let order: ShopifyOrder = ctx.payload()?;
        if order.financial_status != "paid" {
            // The signed body decides, not the topic (docs/receiver.md).
            return Ok(json!({ "paid": false }));
        }
        let marked = ctx
            .transaction()?
            .query("UPDATE orders SET paid = true WHERE shopify_order_id = $1")
            .bind(order.id)
            .execute()
            .await?;
        if marked == 0 {
            return Err(StepError::retryable(format!(
                "no order has Shopify id {}: it may not be created yet",
                order.id
            )));
        }
        Ok(json!({ "paid": true }))
    }
}
