//! The app's handlers: `products/update` pushes the product, debounced per
//! product, rate-limited and concurrency-limited per shop; `orders/create`
//! reserves the order's stock, waits for an `orders/paid` whose signed body
//! says it is paid, then fulfils it or releases the stock; every other topic
//! (`orders/paid` included) is recorded.

use std::time::Duration;

use tickmark::flow::RateLimit;
use tickmark::wait::WaitFor;
use tickmark::{Handler, Handlers, ANY};
use tickmark_steps::shopify_compliance::{self, AnswerDataRequest, RedactCustomer, RedactShop};

use super::order::ORDER_ID_POINTER;
use super::{
    FlowSettings, OrderCall, OrderSettings, PushProduct, Record, ORDERS_CREATE, ORDERS_PAID,
    PAID_ORDER_ID_POINTER, PAID_WAIT, PRODUCTS_UPDATE, RATE_LIMIT, SOURCE,
};

/// The handlers, with `flow`'s limits and `orders`' timeout. The keys are
/// JSON pointers into the payload that
/// [`ShopifyWithShop`](super::ShopifyWithShop) lays out.
///
/// `products/update`:
///
/// - `rate_limited(RATE_LIMIT, "/shop")`: one token bucket per shop
///   (`flow.rate_per_sec` per second, `flow.burst` when full), taken before
///   each run of `push_product`, fleet-wide;
/// - `concurrency_per("/shop", n)`: at most `flow.per_shop_concurrency`
///   events of one shop running at once, fleet-wide;
/// - `debounce_per(["/shop", "/product/id"], window, max_wait)`: a burst of
///   updates to one product runs once, after `flow.debounce` of quiet (at
///   most [`FlowSettings::max_wait`] after the burst began);
/// - `skip_stale("/product_key", "/product/updated_at")`: one product's
///   events run one at a time, and an update older than the one last pushed
///   is recorded as stale, not pushed; with it, the debounce keeps the update
///   with the newest `updated_at`, whatever order they arrived in.
///
/// `orders/create`, four steps:
///
/// - `reserve_stock`: POST `…/orders/<id>/reserve`;
/// - `paid` (a durable wait, holding no lease and no worker slot): for an
///   `orders/paid` of the same shop and order whose signed body says it is
///   paid (`/shop` and [`PAID_ORDER_ID_POINTER`] in it, `/shop` and
///   `/body/id` here), up to `orders.pay_timeout` from when the wait began.
///   One accepted before the `orders/create` counts too. The topic is not
///   signed: a copy of an unpaid order's body under `orders/paid` is
///   recorded (each topic of one body runs once), but matches nothing;
/// - `skip_stale(/body/id, /body/id)`: an order is created once. Its
///   events run one at a time, and a second `orders/create` of the same
///   order (a captured `orders/paid` body re-sent under that topic, which
///   is its own event too) is recorded as stale, never run: no second
///   reserve or fulfil under another event's keys. (Shopify's order ids are
///   unique across shops.)
/// - `fulfill`, only if `paid` matched: POST `…/orders/<id>/fulfill`;
/// - `release_stock`, only if `paid` timed out: POST `…/orders/<id>/release`.
///
/// Each call takes a token from the shop's bucket, like `push_product`: the
/// Admin API's limit is per shop, whatever the call. (The per-shop
/// concurrency limit is `products/update`'s alone.)
///
/// Every other topic runs `record`, `orders/paid` included. What makes an
/// `orders/paid` findable by the wait is not its handler but the wait
/// itself: at accept, the engine records an event's match keys for every
/// (source, kind) some registered handler waits for — so every process that
/// accepts deliveries must run a build with this handler (see
/// docs/shopsync.md on deploying it).
pub fn handlers(flow: &FlowSettings, orders: &OrderSettings) -> Handlers {
    build(flow, orders, false)
}

/// [`handlers`], each recording the subjects of its events (the customer by
/// id and email, the shop) as keyed hashes, so that Shopify's compliance
/// topics erase them: needs `TICKMARK_SUBJECT_KEY` (docs/privacy.md).
pub fn handlers_recording_subjects(flow: &FlowSettings, orders: &OrderSettings) -> Handlers {
    build(flow, orders, true)
}

/// The handlers; with `subjects`, each records its events' subjects (the
/// compliance topics' own too: a data request's answer holds the
/// customer's data, and goes with the customer). Shopify's mandatory
/// compliance topics are handled either way, by the ready-made steps of
/// `tickmark_steps::shopify_compliance`: without a subject key they
/// dead-letter, saying so.
fn build(flow: &FlowSettings, orders: &OrderSettings, subjects: bool) -> Handlers {
    let subjects_of = |handler: Handler, body: &str| {
        if subjects {
            shopify_compliance::record_subjects(handler, body, "/shop")
        } else {
            handler
        }
    };
    Handlers::new()
        .rate_limit(
            RateLimit::new(RATE_LIMIT, flow.rate_per_sec, Duration::from_secs(1)).burst(flow.burst),
        )
        .on(
            SOURCE,
            PRODUCTS_UPDATE,
            subjects_of(Handler::new(), "/product")
                .named_step("push_product", PushProduct)
                .rate_limited(RATE_LIMIT, "/shop")
                .concurrency_per("/shop", flow.per_shop_concurrency)
                .debounce_per(["/shop", "/product/id"], flow.debounce, flow.max_wait())
                .skip_stale("/product_key", "/product/updated_at"),
        )
        .on(
            SOURCE,
            ORDERS_CREATE,
            subjects_of(Handler::new(), "/body")
                .named_step("reserve_stock", OrderCall::reserve())
                .rate_limited(RATE_LIMIT, "/shop")
                .wait(
                    PAID_WAIT,
                    WaitFor::event(SOURCE, ORDERS_PAID)
                        .matching_on(
                            ["/shop", PAID_ORDER_ID_POINTER],
                            ["/shop", ORDER_ID_POINTER],
                        )
                        .timeout(orders.pay_timeout),
                )
                .named_step("fulfill", OrderCall::fulfill())
                .if_matched(PAID_WAIT)
                .rate_limited(RATE_LIMIT, "/shop")
                .named_step("release_stock", OrderCall::release())
                .if_timed_out(PAID_WAIT)
                .rate_limited(RATE_LIMIT, "/shop")
                .skip_stale(ORDER_ID_POINTER, ORDER_ID_POINTER),
        )
        .on(
            SOURCE,
            "customers/redact",
            subjects_of(Handler::new(), "/body")
                .named_step("redact_customer", RedactCustomer::body_at("/body")),
        )
        .on(
            SOURCE,
            "shop/redact",
            subjects_of(Handler::new(), "/body")
                .named_step("redact_shop", RedactShop::body_at("/body")),
        )
        .on(
            SOURCE,
            "customers/data_request",
            subjects_of(Handler::new(), "/body")
                .named_step("answer_data_request", AnswerDataRequest::body_at("/body")),
        )
        .on(
            SOURCE,
            ANY,
            subjects_of(Handler::new(), "/body").named_step("record", Record),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_handlers_compile_into_an_engine() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("h.db").display());
        let store = tickmark::connect(&url).await.unwrap();
        tickmark::Engine::new(
            store,
            handlers(&FlowSettings::default(), &OrderSettings::default()),
        )
        .unwrap();
    }
}
