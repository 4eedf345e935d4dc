//! Running alone, process-wide: what a claim alone promises (nothing else
//! runs beside the suspect, so a crash meanwhile is its own) holds for the
//! whole process, not one worker, because a crash takes the whole process.
//! The workers of one [`Engine`](crate::Engine) share one gate: a worker may
//! claim alone only while no worker of the engine holds an event, and while
//! one runs alone the others claim nothing.
//!
//! Engines built separately in one process (tests standing in for several
//! processes) have separate gates.

use std::sync::Mutex;

/// The engine-wide gate between batch claims and a claim alone.
#[derive(Debug, Default)]
pub(crate) struct AloneGate {
    state: Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    /// Workers that hold (or are claiming) events of a batch.
    holding: usize,
    /// A worker is claiming or running an event alone.
    alone: bool,
}

impl AloneGate {
    fn with<T>(&self, f: impl FnOnce(&mut GateState) -> T) -> T {
        // A panic while the lock is held leaves plain counters: go on.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    /// A worker is about to claim a batch while holding nothing: counted as
    /// holding until [`released`](Self::released). Refused (`false`) while
    /// another worker runs alone.
    pub fn enter_batch(&self) -> bool {
        self.with(|state| {
            if state.alone {
                return false;
            }
            state.holding += 1;
            true
        })
    }

    /// A worker that entered a batch holds nothing any more.
    pub fn released(&self) {
        self.with(|state| state.holding = state.holding.saturating_sub(1));
    }

    /// A worker holding nothing wants to claim alone: granted only while no
    /// worker holds anything and none runs alone; held until
    /// [`alone_ended`](Self::alone_ended).
    pub fn enter_alone(&self) -> bool {
        self.with(|state| {
            if state.alone || state.holding > 0 {
                return false;
            }
            state.alone = true;
            true
        })
    }

    /// The worker alone holds nothing any more (its event ended, or its
    /// claim found no suspect).
    pub fn alone_ended(&self) {
        self.with(|state| state.alone = false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_only_when_nobody_holds_anything_and_batches_wait_for_it() {
        let gate = AloneGate::default();
        assert!(gate.enter_batch());
        assert!(!gate.enter_alone(), "a worker holds a batch");
        gate.released();
        assert!(gate.enter_alone());
        assert!(!gate.enter_alone(), "one alone at a time");
        assert!(!gate.enter_batch(), "no batch beside a run alone");
        gate.alone_ended();
        assert!(gate.enter_batch());
    }
}
