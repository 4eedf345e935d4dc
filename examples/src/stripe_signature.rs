//! The `Stripe-Signature` header of a delivery, signed as Stripe signs it:
//! for the benchmarks and the soak run, which send signed deliveries to the
//! receiver over HTTP.

use hmac::{Hmac, Mac};

/// `t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>.<body>">` under `secret`.
pub fn stripe_signature(secret: &str, timestamp: i64, body: &str) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .expect("HMAC-SHA256 takes a key of any length");
    mac.update(format!("{timestamp}.{body}").as_bytes());
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}
