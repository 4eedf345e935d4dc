//! [`ShopifyWithShop`]: Shopify's own verification, plus the shop a delivery
//! is for.
//!
//! Shopify names the shop in the `X-Shopify-Shop-Domain` header, not in the
//! signed body, and the app's limits are per shop: they are keyed by JSON
//! pointers into the payload. So once the built-in [`Shopify`] provider has
//! verified a delivery, its payload is rewritten, for the topics of
//! products (`products/update`, `products/create`, …), to
//!
//! ```json
//! {"shop": "<shop>.myshopify.com", "product_key": "<shop>.myshopify.com/<id>", "product": <the body>}
//! ```
//!
//! (`product_key` only when the body has an `id`), and for every other topic
//! (`orders/create`, `orders/paid`, …) to
//!
//! ```json
//! {"shop": "<shop>.myshopify.com", "body": <the body>}
//! ```
//!
//! so that an order's id is `/body/id`, never under a field named `product`.
//! An order topic's (`orders/…`) payload whose signed body says
//! `"financial_status": "paid"` also carries `"paid_order_id": <the body's
//! id>`: what the wait for `orders/paid` matches on. The topic is not
//! signed, and Shopify sends one order's byte-identical body under several
//! topics, so each of them runs once (docs/receiver.md, "Byte-identical
//! bodies"): an unpaid order's captured `orders/create` body re-sent under
//! `orders/paid` is recorded, and must not fulfil the order. Whether the
//! order is paid is read from the signed body, never from the topic.
//!
//! The header is not signed, but it cannot be used to move a captured
//! delivery to another shop: the same signed body under the same topic is a
//! duplicate of its replay key, whatever its webhook id and shop header.
//! (So two shops' byte-identical bodies under one topic would be one event;
//! Shopify's ids, unique across shops, keep real bodies apart.)
//!
//! The shop must be `<handle>.myshopify.com`, the handle 1 to 63 letters,
//! digits and hyphens, neither first nor last a hyphen (a DNS label, which is
//! what Shopify's handles are); letters are lowered, so `Shop.myshopify.com`
//! and `shop.myshopify.com` share their limits. A delivery whose header is
//! missing or is not such a domain is refused with 400, after its signature
//! verified (an unsigned request is a 401 whatever its headers); a repeated
//! header with 401 `duplicate_header`, like every header a verification reads.

use axum::http::{HeaderMap, HeaderName};
use serde_json::{json, Value};
use tickmark::receiver::providers::{
    Delivery, Provider, ProviderConfigError, Rejection, Shopify, Verdict,
};

/// The header naming the shop a delivery is for.
pub const SHOP_DOMAIN_HEADER: HeaderName = HeaderName::from_static("x-shopify-shop-domain");

/// What every shop domain ends with.
const SHOP_SUFFIX: &str = ".myshopify.com";

/// The longest shop handle (a DNS label).
const MAX_HANDLE_BYTES: usize = 63;

/// The reason given (400 `malformed_body`) when the shop header is missing.
const MISSING_REASON: &str = "the X-Shopify-Shop-Domain header is missing: Shopify sends it with \
     every webhook, naming the shop; check that proxies forward it";

/// The reason given (400 `malformed_body`) when the shop header is not a shop domain.
const INVALID_REASON: &str = "the X-Shopify-Shop-Domain header is not a shop domain: expected \
     <handle>.myshopify.com, the handle 1 to 63 letters, digits or inner hyphens";

/// Verifies Shopify deliveries like [`Shopify`], then moves the shop from
/// the `X-Shopify-Shop-Domain` header into the payload (see the module's
/// documentation for the payload's shape and the rules).
#[derive(Debug, Clone)]
pub struct ShopifyWithShop {
    inner: Shopify,
}

impl ShopifyWithShop {
    /// A verifier for these client secrets (several during a rotation: a
    /// delivery verifies when any matches).
    pub fn new<I, S>(secrets: I) -> Result<Self, ProviderConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self {
            inner: Shopify::new(secrets)?,
        })
    }
}

impl Provider for ShopifyWithShop {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn verify(&self, delivery: &Delivery<'_>) -> Result<Verdict, Rejection> {
        // The signature first: only a genuinely signed delivery is told
        // about its shop header.
        match self.inner.verify(delivery)? {
            Verdict::Event(mut event) => {
                let shop = shop_domain(delivery.headers).map_err(ShopDomainError::rejection)?;
                let body = std::mem::take(&mut event.payload);
                event.payload = with_shop(&shop, &event.kind, body);
                Ok(Verdict::Event(event))
            }
            // Shopify has no handshake today; one would pass through as is.
            handshake => Ok(handshake),
        }
    }

    fn check_headers(&self, headers: &HeaderMap) -> Result<(), Rejection> {
        // The shop header is checked after the signature, in `verify`: here
        // only what Shopify's scheme checks before the body.
        self.inner.check_headers(headers)
    }

    fn shortest_secret_bytes(&self) -> Option<usize> {
        self.inner.shortest_secret_bytes()
    }

    fn signs_public_url(&self) -> bool {
        self.inner.signs_public_url()
    }
}

/// Why a delivery's shop header cannot be used.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShopDomainError {
    /// No `X-Shopify-Shop-Domain` header.
    #[error("{MISSING_REASON}")]
    Missing,
    /// The header appears more than once: no value is picked.
    #[error("the X-Shopify-Shop-Domain header appears more than once: a delivery names one shop; check for proxies that duplicate headers")]
    Duplicated,
    /// The header is not `<handle>.myshopify.com`.
    #[error("{INVALID_REASON}")]
    Invalid,
}

impl ShopDomainError {
    /// The receiver's rejection: 401 `duplicate_header` for a repeated
    /// header (as for every header a verification reads), otherwise 400
    /// `malformed_body` with the reason. (The receiver's [`Rejection`] has no
    /// variant for a missing or invalid header that is not a signature, id or
    /// kind; `MalformedBody` is its one 400 that takes a free reason.)
    pub fn rejection(self) -> Rejection {
        match self {
            ShopDomainError::Duplicated => Rejection::DuplicateHeader {
                header: SHOP_DOMAIN_HEADER.as_str().to_owned(),
            },
            ShopDomainError::Missing => Rejection::MalformedBody {
                reason: MISSING_REASON,
            },
            ShopDomainError::Invalid => Rejection::MalformedBody {
                reason: INVALID_REASON,
            },
        }
    }
}

/// The shop named by the `X-Shopify-Shop-Domain` header, lower-cased.
pub fn shop_domain(headers: &HeaderMap) -> Result<String, ShopDomainError> {
    let mut values = headers.get_all(&SHOP_DOMAIN_HEADER).iter();
    let value = values.next().ok_or(ShopDomainError::Missing)?;
    if values.next().is_some() {
        return Err(ShopDomainError::Duplicated);
    }
    let shop = value
        .to_str()
        .map_err(|_| ShopDomainError::Invalid)?
        .to_ascii_lowercase();
    if is_shop_domain(&shop) {
        Ok(shop)
    } else {
        Err(ShopDomainError::Invalid)
    }
}

/// The shop a payload laid out by [`ShopifyWithShop`] is for. Missing or
/// unusable, it will be so on every retry: a terminal failure that says why.
pub fn payload_shop(payload: &Value) -> Result<&str, tickmark::StepError> {
    payload["shop"]
        .as_str()
        .filter(|shop| is_shop_domain(shop))
        .ok_or_else(|| {
            tickmark::StepError::terminal(
                "the payload has no usable `shop`: events of this handler come through \
                 the shopify source, which sets it from X-Shopify-Shop-Domain",
            )
        })
}

/// Whether `text` is a (lower-case) shop domain: `<handle>.myshopify.com`,
/// the handle a DNS label of 1 to 63 letters, digits and inner hyphens.
pub fn is_shop_domain(text: &str) -> bool {
    let Some(handle) = text.strip_suffix(SHOP_SUFFIX) else {
        return false;
    };
    !handle.is_empty()
        && handle.len() <= MAX_HANDLE_BYTES
        && !handle.starts_with('-')
        && !handle.ends_with('-')
        && handle
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// `<shop>/<id>`, the resource a product update is about, when `body` has an
/// `id` (a number, or a non-empty string).
pub fn product_key(shop: &str, body: &Value) -> Option<String> {
    let id = match body.get("id")? {
        Value::Number(number) => number.to_string(),
        Value::String(text) if !text.is_empty() => text.clone(),
        _ => return None,
    };
    Some(format!("{shop}/{id}"))
}

/// The prefix of the topics about products: their body is a product.
pub const PRODUCT_TOPICS: &str = "products/";

/// The prefix of the topics about orders: their body is an order.
pub const ORDER_TOPICS: &str = "orders/";

/// Where an order topic's payload says, from its signed body, that the
/// order is paid: the order's id, present only when the body's
/// `financial_status` is `paid`. The wait for `orders/paid` matches on it.
pub const PAID_ORDER_ID_POINTER: &str = "/paid_order_id";

/// The payload the handlers read: the shop and the body; for a topic of
/// products, the body is `product`, with the product key (when the body has
/// an id); for any other topic, it is `body`, and for a topic of orders
/// whose body says it is paid, `paid_order_id` too.
fn with_shop(shop: &str, topic: &str, body: Value) -> Value {
    let mut payload = json!({ "shop": shop });
    if topic.starts_with(PRODUCT_TOPICS) {
        if let Some(key) = product_key(shop, &body) {
            payload["product_key"] = Value::String(key);
        }
        payload["product"] = body;
    } else {
        if topic.starts_with(ORDER_TOPICS) && body["financial_status"] == "paid" {
            if let Some(id) = body.get("id") {
                payload["paid_order_id"] = id.clone();
            }
        }
        payload["body"] = body;
    }
    payload
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use base64::Engine as _;
    use hmac::{Hmac, Mac};

    use super::*;

    const SECRET: &str = "shpss_provider_test_secret";
    const BODY: &str =
        r#"{"id":632910392,"title":"IPod Nano - 8GB","updated_at":"2024-01-02T10:00:00-05:00"}"#;

    fn signature(secret: &str, body: &str) -> String {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body.as_bytes());
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    }

    fn headers(signature: &str, shops: &[&[u8]]) -> HeaderMap {
        headers_of("products/update", signature, shops)
    }

    fn headers_of(topic: &str, signature: &str, shops: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-shopify-hmac-sha256", signature.parse().unwrap());
        headers.insert("x-shopify-webhook-id", "wh-1".parse().unwrap());
        headers.insert("x-shopify-topic", topic.parse().unwrap());
        for shop in shops {
            headers.append(&SHOP_DOMAIN_HEADER, HeaderValue::from_bytes(shop).unwrap());
        }
        headers
    }

    fn verify(headers: &HeaderMap, body: &str) -> Result<Verdict, Rejection> {
        ShopifyWithShop::new([SECRET]).unwrap().verify(&Delivery {
            headers,
            body: body.as_bytes(),
            public_url: "",
            now: chrono::Utc::now(),
        })
    }

    fn payload(verdict: Result<Verdict, Rejection>) -> Value {
        match verdict {
            Ok(Verdict::Event(event)) => event.payload,
            other => panic!("not an event: {other:?}"),
        }
    }

    #[test]
    fn the_shop_and_the_product_key_join_the_body() {
        let signed = headers(&signature(SECRET, BODY), &[b"Cool-Shop.myshopify.com"]);
        let payload = payload(verify(&signed, BODY));
        assert_eq!(payload["shop"], "cool-shop.myshopify.com");
        assert_eq!(payload["product_key"], "cool-shop.myshopify.com/632910392");
        assert_eq!(payload["product"]["title"], "IPod Nano - 8GB");
    }

    #[test]
    fn a_body_without_an_id_has_no_product_key() {
        let body = r#"{"name":"no id here"}"#;
        let signed = headers(&signature(SECRET, body), &[b"a.myshopify.com"]);
        let payload = payload(verify(&signed, body));
        assert_eq!(payload["shop"], "a.myshopify.com");
        assert!(payload.get("product_key").is_none(), "{payload}");
        assert_eq!(
            product_key("s", &json!({"id": "gid-7"})).as_deref(),
            Some("s/gid-7")
        );
        assert_eq!(product_key("s", &json!({"id": ""})), None);
    }

    #[test]
    fn other_topics_keep_their_body_under_body() {
        let body = r#"{"id":450789469,"total_price":"11.00"}"#;
        for topic in ["orders/create", "orders/paid", "customers/create"] {
            let signed = headers_of(topic, &signature(SECRET, body), &[b"A.myshopify.com"]);
            let payload = payload(verify(&signed, body));
            assert_eq!(
                payload,
                json!({"shop": "a.myshopify.com", "body": {"id": 450789469, "total_price": "11.00"}}),
                "{topic}"
            );
        }
        // Every topic of products keeps the product's layout.
        let signed = headers_of(
            "products/delete",
            &signature(SECRET, body),
            &[b"a.myshopify.com"],
        );
        let payload = payload(verify(&signed, body));
        assert_eq!(payload["product_key"], "a.myshopify.com/450789469");
        assert_eq!(payload["product"]["id"], 450789469);
        assert!(payload.get("body").is_none(), "{payload}");
    }

    /// Whether an order is paid comes from its signed body, whatever the
    /// (unsigned) topic: only an order topic whose body says
    /// `financial_status: paid` carries `paid_order_id`.
    #[test]
    fn an_order_is_paid_when_its_signed_body_says_so() {
        let paid = r#"{"id":450789469,"financial_status":"paid"}"#;
        let pending = r#"{"id":450789469,"financial_status":"pending"}"#;
        let layout = |topic: &str, body: &str| {
            let signed = headers_of(topic, &signature(SECRET, body), &[b"a.myshopify.com"]);
            payload(verify(&signed, body))
        };
        for topic in ["orders/paid", "orders/create"] {
            assert_eq!(layout(topic, paid)["paid_order_id"], 450789469, "{topic}");
            assert!(
                layout(topic, pending).get("paid_order_id").is_none(),
                "{topic}"
            );
        }
        // Not an order topic, or no id: no payment to match.
        assert!(layout("customers/create", paid)
            .get("paid_order_id")
            .is_none());
        assert!(layout("orders/paid", r#"{"financial_status":"paid"}"#)
            .get("paid_order_id")
            .is_none());
    }

    #[test]
    fn a_missing_or_invalid_shop_is_400_and_a_repeated_one_401() {
        let sig = signature(SECRET, BODY);
        let missing = verify(&headers(&sig, &[]), BODY).unwrap_err();
        assert_eq!(
            (missing.status().as_u16(), missing.code()),
            (400, "malformed_body")
        );
        assert!(
            missing.to_string().contains("X-Shopify-Shop-Domain"),
            "{missing}"
        );
        for bad in [
            &b"shop.example.com"[..],
            b".myshopify.com",
            b"-shop.myshopify.com",
            b"shop-.myshopify.com",
            b"sh_op.myshopify.com",
            b"a.b.myshopify.com",
            b"shop.myshopify.com.evil.com",
            b"sh\xc3\xa9p.myshopify.com",
        ] {
            let error = verify(&headers(&sig, &[bad]), BODY).unwrap_err();
            assert_eq!(
                error.status().as_u16(),
                400,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("{}.myshopify.com", "a".repeat(64));
        let error = verify(&headers(&sig, &[long.as_bytes()]), BODY).unwrap_err();
        assert_eq!(error.status().as_u16(), 400);
        let twice = headers(&sig, &[b"a.myshopify.com", b"b.myshopify.com"]);
        let error = verify(&twice, BODY).unwrap_err();
        assert_eq!(
            (error.status().as_u16(), error.code()),
            (401, "duplicate_header")
        );
    }

    #[test]
    fn the_signature_is_checked_before_the_shop() {
        let forged = headers(&signature("not the secret", BODY), &[]);
        let error = verify(&forged, BODY).unwrap_err();
        assert_eq!(
            (error.status().as_u16(), error.code()),
            (401, "bad_signature")
        );
    }
}
