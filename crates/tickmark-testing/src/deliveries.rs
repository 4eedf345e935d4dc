//! Deliveries as providers send them: one event many times, at once and
//! late; events of one resource out of order.

use std::time::Duration;

use futures_util::future::join_all;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use tickmark_core::inbox::Accepted;
use tickmark_driver::event::NewEvent;

use super::error::TestError;
use super::findings::{Finding, Findings};
use super::test_engine::TestEngine;

/// What the inbox made of several copies of one event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Deliveries {
    /// Copies recorded as a new event (one, when the dedup key is stable).
    pub new: usize,
    /// Copies refused as duplicates.
    pub duplicates: usize,
}

/// The order [`TestEngine::deliver_in`] sends events in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// As given.
    AsGiven,
    /// Last first.
    Reversed,
    /// Shuffled by a seeded generator (the same seed, the same order).
    Shuffled {
        /// The generator's seed.
        seed: u64,
    },
}

impl TestEngine {
    /// Deliver `copies` copies of `event` at once, each its own accept, as a
    /// provider's retries that overlap would arrive.
    pub async fn deliver_times(
        &self,
        event: NewEvent,
        copies: usize,
    ) -> Result<Deliveries, TestError> {
        let accepts = (0..copies).map(|_| self.deliver(event.clone()));
        let mut deliveries = Deliveries::default();
        for accepted in join_all(accepts).await {
            match accepted? {
                Accepted::Duplicate => deliveries.duplicates += 1,
                _ => deliveries.new += 1,
            }
        }
        Ok(deliveries)
    }

    /// Deliver `events` one after another in `order` (out of order for the
    /// events of one sequenced resource, say).
    pub async fn deliver_in(
        &self,
        mut events: Vec<NewEvent>,
        order: Order,
    ) -> Result<Vec<Accepted>, TestError> {
        match order {
            Order::AsGiven => {}
            Order::Reversed => events.reverse(),
            Order::Shuffled { seed } => {
                events.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
            }
        }
        let mut accepted = Vec::with_capacity(events.len());
        for event in events {
            accepted.push(self.deliver(event).await?);
        }
        Ok(accepted)
    }

    /// Deliver `event` as a provider does when answers are slow: `copies`
    /// copies at once, a run, then one more copy late, and another run.
    /// `Ok` when one copy was recorded, the event is done, and each of its
    /// steps started once (crashes armed or always-replay aside); otherwise
    /// a finding that names the step.
    pub async fn deliver_like_a_provider(
        &self,
        event: NewEvent,
        copies: usize,
        within: Duration,
    ) -> Result<Deliveries, TestError> {
        let (source, id) = (event.source.clone(), event.dedup_key.clone());
        let mut deliveries = self.deliver_times(event.clone(), copies).await?;
        self.run_until_idle_within(within).await?;
        match self.deliver(event).await? {
            Accepted::Duplicate => deliveries.duplicates += 1,
            _ => deliveries.new += 1,
        }
        let report = self.run_until_idle_within(within).await?;
        self.assert_done(&source, &id).await?;
        let mut findings = Vec::new();
        if deliveries.new != 1 {
            findings.push(Finding {
                step: "(the inbox)".to_owned(),
                crash: None,
                crashed_step: None,
                problem: format!(
                    "{} of {} copies were recorded as new events",
                    deliveries.new,
                    copies + 1
                ),
                fix: "give NewEvent the provider's event id (NewEvent::with_id), or the hash of \
                      the exact body (NewEvent::from_body), not a value that changes per delivery"
                    .to_owned(),
            });
        }
        if report.crashes == 0 {
            let status = self.status(&source, &id).await?;
            for step in &status.steps {
                let runs = self.runs_of(&source, &id, &step.step);
                // A failed attempt runs the step again, on purpose.
                let attempts = usize::try_from(step.attempts).unwrap_or(0).max(1);
                if runs > attempts {
                    findings.push(Finding {
                        step: step.step.clone(),
                        crash: None,
                        crashed_step: None,
                        problem: format!(
                            "it ran {runs} times in {attempts} attempt(s) for {} deliveries",
                            copies + 1
                        ),
                        fix: "report this: the engine runs a step once per event unless a run \
                              crashed or failed"
                            .to_owned(),
                    });
                }
            }
        }
        if findings.is_empty() {
            Ok(deliveries)
        } else {
            Err(TestError::NotIdempotent(Findings {
                event: format!("{source}/{id}"),
                findings,
            }))
        }
    }
}
