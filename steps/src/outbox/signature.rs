//! Standard Webhooks signatures, sending side: `v1,` + base64 of
//! HMAC-SHA256 over `"{id}.{timestamp}.{body}"`, keyed with the bytes of a
//! `whsec_<base64>` secret. The receiver's
//! `tickmark::receiver::providers::StandardWebhooks` verifies them.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a Standard Webhooks secret.
pub(crate) const SECRET_PREFIX: &str = "whsec_";

/// The key bytes of a `whsec_<base64>` (or bare base64) secret.
pub(crate) fn decode_secret(secret: &str) -> Result<Vec<u8>, &'static str> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    if encoded.is_empty() {
        return Err("empty: expected `whsec_` followed by base64");
    }
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "expected `whsec_` followed by standard base64")
}

/// The `webhook-signature` value for one message: `v1,<base64>`.
pub(crate) fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length; new_from_slice cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;
    use tickmark::receiver::providers::{Delivery, Provider, StandardWebhooks, Verdict};

    use super::*;

    /// The Standard Webhooks libraries' reference vector ("sign function works").
    #[test]
    fn published_vector() {
        let key = decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            sign(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert_eq!(
            decode_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap(),
            key
        );
    }

    #[test]
    fn bad_secrets_are_refused() {
        assert!(decode_secret("whsec_").is_err());
        assert!(decode_secret("").is_err());
        assert!(decode_secret("whsec_!!!").is_err());
    }

    /// What we sign, the receiver's own provider verifies.
    #[test]
    fn the_receiver_verifies_what_we_sign() {
        let secret = "whsec_c2VjcmV0LWtleS1ieXRlcy0wMTIzNDU2Nzg5";
        let key = decode_secret(secret).unwrap();
        let body =
            br#"{"type":"order.confirmed","timestamp":"2024-01-01T00:00:00Z","data":{"id":1}}"#;
        let now = 1_700_000_000;
        let mut headers = http::HeaderMap::new();
        headers.insert("webhook-id", "shop:evt_1:notify".parse().unwrap());
        headers.insert("webhook-timestamp", now.to_string().parse().unwrap());
        headers.insert(
            "webhook-signature",
            sign(&key, "shop:evt_1:notify", now, body).parse().unwrap(),
        );
        let provider = StandardWebhooks::new([secret]).unwrap();
        let delivery = Delivery {
            headers: &headers,
            body,
            public_url: "http://127.0.0.1/hooks/partner",
            now: chrono::Utc.timestamp_opt(now, 0).unwrap(),
        };
        match provider.verify(&delivery) {
            Ok(Verdict::Event(event)) => {
                assert_eq!(event.id.as_deref(), Some("shop:evt_1:notify"));
                assert_eq!(event.kind, "order.confirmed");
            }
            other => panic!("expected a verified event, got {other:?}"),
        }
        let other = StandardWebhooks::new(["whsec_b3RoZXIta2V5"]).unwrap();
        assert!(other.verify(&delivery).is_err());
    }
}
