//! Where a worker's time goes: the engine's own tracing spans (`claim`,
//! `event`, `step`, `mark`), timed from creation to close and summed per
//! name. `bench --phases` installs this layer for the drain.
//!
//! Kept by hand rather than taken from a crate: `tracing-timing` and
//! friends histogram *events*; what is wanted here is four sums of span
//! lifetimes, which is a few lines on `tracing-subscriber`'s `Layer`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The spans that are summed.
const PHASES: [&str; 4] = ["claim", "event", "step", "mark"];

/// Count and summed lifetime of one span name.
#[derive(Debug, Default, Clone, Copy)]
pub struct Phase {
    /// Spans closed.
    pub count: u64,
    /// Their lifetimes, summed.
    pub total: Duration,
}

/// The sums so far, shared with the layer.
#[derive(Debug, Default, Clone)]
pub struct Phases(Arc<Mutex<BTreeMap<&'static str, Phase>>>);

impl Phases {
    /// The layer that fills these sums.
    pub fn layer(&self) -> PhaseLayer {
        PhaseLayer(self.clone())
    }

    /// The sums, by span name.
    pub fn snapshot(&self) -> BTreeMap<&'static str, Phase> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Forget the sums so far (what the set-up recorded).
    pub fn reset(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// A `tracing` layer summing span lifetimes per name.
#[derive(Debug)]
pub struct PhaseLayer(Phases);

struct Born(Instant);

impl<S> Layer<S> for PhaseLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !PHASES.contains(&attrs.metadata().name()) {
            return;
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Born(Instant::now()));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(born) = span.extensions().get::<Born>().map(|b| b.0) else {
            return;
        };
        let mut sums = (self.0).0.lock().unwrap_or_else(PoisonError::into_inner);
        let phase = sums.entry(span.metadata().name()).or_default();
        phase.count += 1;
        phase.total += born.elapsed();
    }
}

/// Print the phases as shares of the slots' time (`slots` × `wall`) and per
/// event.
pub fn print(phases: &BTreeMap<&'static str, Phase>, slots: usize, wall: Duration, events: u64) {
    let slot_time = wall.as_secs_f64() * slots as f64;
    println!();
    println!(
        "where the time went ({slots} slots × {:.2} s = {slot_time:.1} slot-seconds; {events} events)",
        wall.as_secs_f64()
    );
    println!(
        "  {:<8} {:>9} {:>13} {:>12} {:>16}",
        "span", "count", "total s", "mean ms", "% of slot time"
    );
    for name in PHASES {
        let phase = phases.get(name).copied().unwrap_or_default();
        let total = phase.total.as_secs_f64();
        let mean_ms = if phase.count > 0 {
            total * 1000.0 / phase.count as f64
        } else {
            0.0
        };
        println!(
            "  {:<8} {:>9} {:>13.2} {:>12.3} {:>15.1}%",
            name,
            phase.count,
            total,
            mean_ms,
            100.0 * total / slot_time.max(f64::MIN_POSITIVE)
        );
    }
    println!("  (event: claimed and started → its last mark durable; step: run and its mark; mark: the commit wait)");
}
