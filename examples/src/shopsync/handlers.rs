//! The app's handlers: `products/update` pushes the product, debounced per
//! product, rate-limited and concurrency-limited per shop; every other topic
//! is recorded.

use std::time::Duration;

use tickmark::flow::RateLimit;
use tickmark::{Handler, Handlers, ANY};

use super::{FlowSettings, PushProduct, Record, PRODUCTS_UPDATE, RATE_LIMIT, SOURCE};

/// The handlers, with `flow`'s limits. The keys are JSON pointers into the
/// payload that [`ShopifyWithShop`](super::ShopifyWithShop) lays out:
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
pub fn handlers(flow: &FlowSettings) -> Handlers {
    Handlers::new()
        .rate_limit(
            RateLimit::new(RATE_LIMIT, flow.rate_per_sec, Duration::from_secs(1)).burst(flow.burst),
        )
        .on(
            SOURCE,
            PRODUCTS_UPDATE,
            Handler::new()
                .named_step("push_product", PushProduct)
                .rate_limited(RATE_LIMIT, "/shop")
                .concurrency_per("/shop", flow.per_shop_concurrency)
                .debounce_per(["/shop", "/product/id"], flow.debounce, flow.max_wait())
                .skip_stale("/product_key", "/product/updated_at"),
        )
        .on(SOURCE, ANY, Handler::new().named_step("record", Record))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_handlers_compile_into_an_engine() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("h.db").display());
        let store = tickmark::connect(&url).await.unwrap();
        tickmark::Engine::new(store, handlers(&FlowSettings::default())).unwrap();
    }
}
