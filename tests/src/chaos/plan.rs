//! The seeded plan of a chaos run: which events exist (random customers and
//! amounts), how many times each is delivered (1 to 5), and when each
//! delivery starts. Some copies of an event start together (concurrent
//! duplicates), others seconds apart; events start in random order, so
//! deliveries arrive out of order.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One Stripe `invoice.payment_succeeded` event of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChaosEvent {
    /// The Stripe event id (the dedup key).
    pub id: String,
    /// `data.object.customer`.
    pub customer: String,
    /// `data.object.amount_paid`, in cents.
    pub amount: i64,
    /// The body every delivery of this event carries, byte for byte.
    pub body: String,
}

/// One delivery: which event, and when (from the start of the run) it is first sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedDelivery {
    /// Index into [`Plan::events`].
    pub event: usize,
    /// When the first attempt starts.
    pub at: Duration,
}

/// Events and deliveries.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The distinct events.
    pub events: Vec<ChaosEvent>,
    /// Every delivery, sorted by start time.
    pub deliveries: Vec<PlannedDelivery>,
}

/// Most copies of one event delivered.
pub const MAX_COPIES: usize = 5;

/// Largest gap between two copies of one event that are not concurrent.
const MAX_GAP: Duration = Duration::from_secs(3);

impl Plan {
    /// `events` events over `customers` customers; first copies start within
    /// `window`, later copies up to [`MAX_GAP`] after.
    pub fn new(seed: u64, events: usize, customers: usize, window: Duration) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let customers = customers.max(1);
        let mut planned = Vec::with_capacity(events);
        let mut deliveries = Vec::with_capacity(events * 3);
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
        for index in 0..events {
            let id = format!("evt_chaos_{seed:x}_{index:06}");
            let customer = format!("cus_chaos_{:03}", rng.gen_range(0..customers));
            let amount = rng.gen_range(100..100_000_i64);
            let body = serde_json::json!({
                "id": id,
                "object": "event",
                "type": "invoice.payment_succeeded",
                "livemode": false,
                "data": {"object": {
                    "id": format!("in_chaos_{index:06}"),
                    "object": "invoice",
                    "customer": customer,
                    "amount_paid": amount,
                    "currency": "usd",
                }},
            })
            .to_string();
            planned.push(ChaosEvent {
                id,
                customer,
                amount,
                body,
            });
            let first = Duration::from_millis(rng.gen_range(0..window_ms));
            let copies = rng.gen_range(1..=MAX_COPIES);
            for copy in 0..copies {
                let at = if copy == 0 || rng.gen_bool(0.35) {
                    // Together with the first: concurrent duplicates.
                    first
                } else {
                    let gap_ms = u64::try_from(MAX_GAP.as_millis()).unwrap_or(3000);
                    first + Duration::from_millis(rng.gen_range(0..gap_ms))
                };
                deliveries.push(PlannedDelivery { event: index, at });
            }
        }
        deliveries.sort_by_key(|d| d.at);
        Plan {
            events: planned,
            deliveries,
        }
    }

    /// The balance each customer must end with: the sum of its distinct
    /// events' amounts, sorted by customer.
    pub fn expected_balances(&self) -> Vec<(String, i64)> {
        let mut balances = std::collections::BTreeMap::<String, i64>::new();
        for event in &self.events {
            *balances.entry(event.customer.clone()).or_default() += event.amount;
        }
        balances.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_is_seeded_and_complete() {
        let a = Plan::new(7, 200, 10, Duration::from_secs(10));
        let b = Plan::new(7, 200, 10, Duration::from_secs(10));
        assert_eq!(a.events, b.events);
        assert_eq!(a.deliveries, b.deliveries);
        for index in 0..200 {
            let copies = a.deliveries.iter().filter(|d| d.event == index).count();
            assert!((1..=MAX_COPIES).contains(&copies), "{copies}");
        }
        assert!(a.deliveries.windows(2).all(|w| w[0].at <= w[1].at));
        let total: i64 = a.expected_balances().iter().map(|(_, b)| b).sum();
        assert_eq!(total, a.events.iter().map(|e| e.amount).sum::<i64>());
        assert_ne!(
            a.events,
            Plan::new(8, 200, 10, Duration::from_secs(10)).events
        );
    }
}
