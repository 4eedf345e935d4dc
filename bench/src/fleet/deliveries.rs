//! Signed Stripe-like deliveries for a run's backlog, some of them
//! redelivered (a provider retries until it sees a 2xx).

use rand::{Rng, SeedableRng};
use tickmark_examples::stripe_signature::stripe_signature;

use super::{KIND, SECRET};

/// One delivery: the raw body and its `Stripe-Signature` header.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The JSON body, as sent.
    pub body: String,
    /// `t=…,v1=…` over `"{t}.{body}"` with [`SECRET`].
    pub signature: String,
}

/// Deliveries of `events` distinct events (ids `evt_fleet_{tag}_{i}`), with
/// a share `redelivered` of extra deliveries repeating an earlier one, in a
/// fixed shuffled order (seeded by `tag`).
pub fn deliveries(tag: &str, events: usize, redelivered: f64) -> Vec<Delivery> {
    let seed = tag
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31) ^ u64::from(b));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let t = chrono::Utc::now().timestamp();
    let mut bodies: Vec<String> = Vec::with_capacity(events);
    let mut out = Vec::with_capacity(events + events / 8);
    while bodies.len() < events {
        let body = if !bodies.is_empty() && rng.gen_bool(redelivered.clamp(0.0, 0.9)) {
            bodies[rng.gen_range(0..bodies.len())].clone()
        } else {
            let i = bodies.len();
            let body = serde_json::json!({
                "id": format!("evt_fleet_{tag}_{i}"),
                "object": "event",
                "type": KIND,
                "data": {"object": {
                    "id": format!("in_{tag}_{i}"),
                    "customer": format!("cus_{}", i % 97),
                    "amount_paid": 1200,
                    "currency": "usd"
                }}
            })
            .to_string();
            bodies.push(body.clone());
            body
        };
        let signature = stripe_signature(SECRET, t, &body);
        out.push(Delivery { body, signature });
    }
    out
}
