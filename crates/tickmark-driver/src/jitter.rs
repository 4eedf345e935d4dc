//! Random jitter, from one place: the spread of durable retry delays and of
//! in-process retries of transient store errors. Each thread draws from the
//! system's generator unless it was seeded, which is how the simulator
//! (`sim/`, docs/simulation.md) makes a run replay exactly from its seed.

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// A number in `[0, 1)`: from this thread's seeded generator if it has one,
/// else from the system's.
pub fn unit() -> f64 {
    SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
        Some(rng) => rng.gen::<f64>(),
        None => rand::random::<f64>(),
    })
}

/// Draw this thread's jitter from a generator seeded with `seed` (`None`:
/// the system's again). Only for deterministic simulation: real workers
/// need independent jitter, or their retries line up.
pub fn seed_this_thread(seed: Option<u64>) {
    SEEDED.with(|seeded| *seeded.borrow_mut() = seed.map(StdRng::seed_from_u64));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_thread_repeats_its_draws() {
        seed_this_thread(Some(7));
        let first: Vec<f64> = (0..4).map(|_| unit()).collect();
        seed_this_thread(Some(7));
        let again: Vec<f64> = (0..4).map(|_| unit()).collect();
        seed_this_thread(None);
        assert_eq!(first, again);
        assert!(first.iter().all(|u| (0.0..1.0).contains(u)));
    }
}
