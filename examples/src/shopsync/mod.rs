//! The `shopsync` example app: Shopify `products/update` webhooks pushed to
//! a store's Admin API within Shopify's limits, fleet-wide; and an order
//! flow that waits, durably, for the order's payment.
//!
//! A burst of updates to one product is debounced into one push of its
//! newest version ([`PushProduct`]); the pushes of one shop share a token
//! bucket (rate per second, burst) and run at most N at a time, across every
//! `shopsync` process on one database. `orders/create` reserves the order's
//! stock, waits (holding nothing) for an `orders/paid` whose signed body says
//! the order is paid, up to a timeout, then fulfils the order or releases the
//! stock ([`OrderCall`]). Every other topic runs [`Record`].
//!
//! The shop a delivery is for comes in the `X-Shopify-Shop-Domain` header,
//! which Shopify does not sign: [`ShopifyWithShop`] verifies the delivery
//! with the built-in Shopify scheme, then moves the shop into the payload,
//! where the limits' keys are read from.
//!
//! The binary is `examples/src/bin/shopsync.rs`; the guide is
//! `docs/shopsync.md`. Settings that belong to the process, not to an event
//! (the Admin API's URL, the HTTP client) are engine resources
//! ([`AdminApi`]), never stored in a plan.

mod admin_api;
mod database;
mod handlers;
mod order;
mod order_call;
mod path_id;
mod product;
mod provider;
mod push_product;
mod record;
mod settings;

pub use admin_api::{AdminApi, DEFAULT_TIMEOUT};
pub use database::{create_tables, open, RECEIVED_TABLE};
pub use handlers::{handlers, handlers_recording_subjects};
pub use order::{OrderRef, ORDER_ID_POINTER};
pub use order_call::{OrderAction, OrderCall};
pub use product::ProductUpdate;
pub use provider::{
    is_shop_domain, product_key, shop_domain, ShopDomainError, ShopifyWithShop, ORDER_TOPICS,
    PAID_ORDER_ID_POINTER, PRODUCT_TOPICS, SHOP_DOMAIN_HEADER,
};
pub use push_product::PushProduct;
pub use record::Record;
pub use settings::{AdminApiUrl, AdminApiUrlError, FlowSettings, OrderSettings};

/// The source name: deliveries are POSTed to `/hooks/shopify`.
pub const SOURCE: &str = "shopify";

/// The topic whose events are pushed to the Admin API.
pub const PRODUCTS_UPDATE: &str = "products/update";

/// The topic that starts the order flow: reserve, wait for the payment,
/// fulfil or release.
pub const ORDERS_CREATE: &str = "orders/create";

/// The topic the order flow waits for (recorded like every other topic).
pub const ORDERS_PAID: &str = "orders/paid";

/// The name of the order flow's wait step: `fulfill` runs if it matched,
/// `release_stock` if it timed out; its output is
/// `{"matched": {"event_seq", "event_id"}}` or `{"timed_out": true, "deadline"}`.
pub const PAID_WAIT: &str = "paid";

/// The name of the fleet-wide rate limit on Admin API calls (one bucket per
/// shop: `shopify_admin:<shop>`).
pub const RATE_LIMIT: &str = "shopify_admin";

/// The environment variable holding the app's client secret (several,
/// comma-separated, during a rotation).
pub const SECRET_VARIABLE: &str = "SHOPIFY_WEBHOOK_SECRET";
