//! The app's settings: where the Admin API is, the flow limits the
//! handlers are built with, and how long an order may stay unpaid.

use std::str::FromStr;
use std::time::Duration;

use axum::http::Uri;

/// The flow limits of `products/update` (the command line's `--rate`,
/// `--burst`, `--debounce-ms` and `--per-shop-concurrency`). Every process
/// on one database should use the same values: the buckets and counts are
/// shared, the numbers are each build's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSettings {
    /// Admin API calls per second per shop: the bucket's refill rate.
    pub rate_per_sec: u32,
    /// Calls one shop may make at once after a quiet spell: the bucket's size.
    pub burst: u32,
    /// A product's updates are coalesced until it has been quiet this long.
    pub debounce: Duration,
    /// At most this many `products/update` events of one shop run at once,
    /// across every process.
    pub per_shop_concurrency: u32,
}

impl FlowSettings {
    /// How many debounce windows a constant stream of updates to one product
    /// may hold its push back: after that, the newest so far is pushed.
    pub const MAX_WAIT_WINDOWS: u32 = 10;

    /// The longest a push waits behind a constant stream of updates:
    /// [`MAX_WAIT_WINDOWS`](Self::MAX_WAIT_WINDOWS) debounce windows.
    pub fn max_wait(&self) -> Duration {
        self.debounce.saturating_mul(Self::MAX_WAIT_WINDOWS)
    }
}

impl Default for FlowSettings {
    /// Shopify's Admin API (REST) limits: a bucket of 40 calls refilling at
    /// 2 per second per shop; a 2 s debounce; 2 pushes of a shop at once.
    fn default() -> Self {
        Self {
            rate_per_sec: 2,
            burst: 40,
            debounce: Duration::from_millis(2000),
            per_shop_concurrency: 2,
        }
    }
}

/// How the order flow waits (the command line's `--pay-timeout-secs`).
/// Stored in each `orders/create` event's plan at accept: a change applies
/// to orders accepted after it, not to those already waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderSettings {
    /// How long after its stock is reserved an order may stay unpaid: an
    /// `orders/paid` of the same shop and order accepted by then fulfils
    /// it; otherwise its stock is released.
    pub pay_timeout: Duration,
}

impl OrderSettings {
    /// Three days: how long a shop commonly holds stock for an unpaid
    /// order (e.g. one awaiting a bank transfer).
    pub const DEFAULT_PAY_TIMEOUT: Duration = Duration::from_secs(3 * 24 * 3600);
}

impl Default for OrderSettings {
    fn default() -> Self {
        Self {
            pay_timeout: Self::DEFAULT_PAY_TIMEOUT,
        }
    }
}

/// The Admin API's base URL: `push_product` POSTs to
/// `<base>/shops/<shop>/products/<id>`, the order calls to
/// `<base>/shops/<shop>/orders/<id>/<action>`. Plain `http://` only (this example's
/// client has no TLS, to keep its dependencies small): put a local stand-in,
/// or a TLS-originating proxy, behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminApiUrl(String);

/// Why an Admin API URL is refused.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminApiUrlError {
    /// Not a URL with a host.
    #[error("not a URL; expected e.g. http://127.0.0.1:9000/admin")]
    Invalid,
    /// Not `http://`.
    #[error("only http:// URLs are supported by this example (put a TLS-originating proxy in front of an https API)")]
    NotHttp,
    /// It has a query string, which the product's path cannot follow.
    #[error(
        "the URL must not have a query string: give the base, e.g. http://127.0.0.1:9000/admin"
    )]
    HasQuery,
}

impl AdminApiUrl {
    /// The URL of one product: `<base>/shops/<shop>/products/<id>`. The shop
    /// and the id must be path-safe (the provider checks the shop; the step
    /// checks the id).
    pub fn product_url(&self, shop: &str, id: &str) -> String {
        format!("{}/shops/{shop}/products/{id}", self.0)
    }

    /// The URL of an action on one order:
    /// `<base>/shops/<shop>/orders/<id>/<action>` (`reserve`, `fulfill`,
    /// `release`). The shop and the id must be path-safe, as for
    /// [`product_url`](Self::product_url).
    pub fn order_url(&self, shop: &str, id: &str, action: &str) -> String {
        format!("{}/shops/{shop}/orders/{id}/{action}", self.0)
    }
}

impl FromStr for AdminApiUrl {
    type Err = AdminApiUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let uri: Uri = text.trim().parse().map_err(|_| AdminApiUrlError::Invalid)?;
        match uri.scheme_str() {
            Some("http") if uri.host().is_some() => {}
            Some("http") | None => return Err(AdminApiUrlError::Invalid),
            Some(_) => return Err(AdminApiUrlError::NotHttp),
        }
        if uri.query().is_some() {
            return Err(AdminApiUrlError::HasQuery);
        }
        Ok(Self(uri.to_string().trim_end_matches('/').to_owned()))
    }
}

impl std::fmt::Display for AdminApiUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_urls_hang_below_the_base() {
        let base: AdminApiUrl = "http://127.0.0.1:9000/admin/".parse().unwrap();
        assert_eq!(
            base.product_url("a.myshopify.com", "7"),
            "http://127.0.0.1:9000/admin/shops/a.myshopify.com/products/7"
        );
        let bare: AdminApiUrl = "http://api.local:8000".parse().unwrap();
        assert_eq!(
            bare.product_url("a.myshopify.com", "7"),
            "http://api.local:8000/shops/a.myshopify.com/products/7"
        );
        assert_eq!(
            base.order_url("a.myshopify.com", "450789469", "reserve"),
            "http://127.0.0.1:9000/admin/shops/a.myshopify.com/orders/450789469/reserve"
        );
    }

    #[test]
    fn only_plain_http_bases_are_accepted() {
        assert_eq!(
            "https://x.example".parse::<AdminApiUrl>(),
            Err(AdminApiUrlError::NotHttp)
        );
        assert_eq!(
            "http://x.example/?a=1".parse::<AdminApiUrl>(),
            Err(AdminApiUrlError::HasQuery)
        );
        for bad in ["", "not a url", "/relative", "http://"] {
            assert!(bad.parse::<AdminApiUrl>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_defaults_are_shopifys_limits() {
        let flow = FlowSettings::default();
        assert_eq!((flow.rate_per_sec, flow.burst), (2, 40));
        assert_eq!(flow.max_wait(), Duration::from_secs(20));
        assert_eq!(
            OrderSettings::default().pay_timeout,
            Duration::from_secs(259_200)
        );
    }
}
