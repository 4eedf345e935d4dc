//! The one source of randomness of a simulated run: every choice (which
//! process crashes, how long a step takes, whether a store call fails) is a
//! draw from this generator, in the order the simulation makes them, so a
//! seed decides the whole run.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A seeded generator shared by the simulation's tasks (all on one thread).
#[derive(Debug, Clone)]
pub struct Dice {
    rng: Arc<Mutex<StdRng>>,
}

impl Dice {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
        }
    }

    fn with<T>(&self, draw: impl FnOnce(&mut StdRng) -> T) -> T {
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        draw(&mut rng)
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        self.with(|rng| rng.gen_bool(p.clamp(0.0, 1.0)))
    }

    /// A whole number in `range`.
    pub fn below(&self, range: Range<u64>) -> u64 {
        self.with(|rng| rng.gen_range(range))
    }

    /// A duration in `range` milliseconds.
    pub fn millis(&self, range: Range<u64>) -> Duration {
        Duration::from_millis(self.below(range))
    }

    /// One of `items`.
    pub fn pick<'a, T>(&self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            return None;
        }
        let index = self.below(0..items.len() as u64) as usize;
        items.get(index)
    }
}
