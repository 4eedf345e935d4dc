//! Running alone, process-wide: what a claim alone promises (nothing else
//! runs beside the suspect, so a crash meanwhile is its own) holds for the
//! whole process, not one worker, because a crash takes the whole process.
//! The workers of one [`Engine`](crate::Engine) share one gate: a worker may
//! claim alone only while no worker of the engine holds an event, and while
//! one runs alone the others claim nothing.
//!
//! Under a steady backlog the workers are never all empty by themselves, so
//! a worker that learns a suspect waits makes the whole engine *drain*: no
//! worker starts another batch claim, each finishes what it holds, and the
//! first one empty once all are claims the suspect alone (then the next
//! one, until none is left). A suspect is therefore taken within a
//! heartbeat interval of being due (a busy worker asks that often) plus the
//! time its engine takes to finish what it holds.
//!
//! Engines built separately in one process (tests standing in for several
//! processes) have separate gates.

use tokio::sync::watch;

/// The engine-wide gate between batch claims and a claim alone.
#[derive(Debug)]
pub struct AloneGate {
    state: watch::Sender<GateState>,
}

impl Default for AloneGate {
    fn default() -> Self {
        Self {
            state: watch::Sender::new(GateState::default()),
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GateState {
    /// Workers that hold (or are claiming) events of a batch.
    holding: usize,
    /// A worker is claiming or running an event alone.
    alone: bool,
    /// A suspect waits for this engine: no batch claim starts until a
    /// claim alone found none left.
    draining: bool,
}

impl AloneGate {
    /// Change the state; waiters are woken only if it changed.
    fn update<T>(&self, f: impl FnOnce(&mut GateState) -> T) -> T {
        let mut answer = None;
        self.state.send_if_modified(|state| {
            let before = *state;
            answer = Some(f(state));
            *state != before
        });
        answer.expect("send_if_modified runs its closure")
    }

    /// Follow the gate's changes, to wait for one ([`watch::Receiver::changed`]).
    pub fn subscribe(&self) -> watch::Receiver<GateState> {
        self.state.subscribe()
    }

    /// A worker is about to claim a batch while holding nothing: counted as
    /// holding until [`released`](Self::released). Refused (`false`) while
    /// another worker runs alone, or while the engine drains for a suspect.
    pub fn enter_batch(&self) -> bool {
        self.update(|state| {
            if state.alone || state.draining {
                return false;
            }
            state.holding += 1;
            true
        })
    }

    /// A worker that entered a batch holds nothing any more.
    pub fn released(&self) {
        self.update(|state| state.holding = state.holding.saturating_sub(1));
    }

    /// A suspect waits: every worker of the engine stops starting batch
    /// claims, finishes what it holds, and one claims the suspect alone.
    pub fn drain(&self) {
        self.update(|state| state.draining = true);
    }

    /// Whether the engine drains for a suspect: claim no more batches.
    pub fn draining(&self) -> bool {
        self.state.borrow().draining
    }

    /// A worker holding nothing wants to claim alone: granted only while no
    /// worker holds anything and none runs alone; held until
    /// [`alone_ended`](Self::alone_ended).
    pub fn enter_alone(&self) -> bool {
        self.update(|state| {
            if state.alone || state.holding > 0 {
                return false;
            }
            state.alone = true;
            true
        })
    }

    /// The worker alone holds nothing any more: its claim alone found no
    /// suspect (`none_left`: the drain is over, batches may start again),
    /// or failed (the drain goes on, and a claim alone is tried again).
    pub fn alone_ended(&self, none_left: bool) {
        self.update(|state| {
            state.alone = false;
            if none_left {
                state.draining = false;
            }
        });
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
        gate.alone_ended(true);
        assert!(gate.enter_batch());
    }

    #[test]
    fn a_drain_starts_no_batch_until_a_claim_alone_finds_no_suspect_left() {
        let gate = AloneGate::default();
        assert!(gate.enter_batch());
        assert!(gate.enter_batch(), "two workers hold batches");
        gate.drain();
        assert!(gate.draining());
        gate.released();
        assert!(!gate.enter_batch(), "a worker empty first starts no batch");
        assert!(!gate.enter_alone(), "the other still holds its batch");
        gate.released();
        assert!(gate.enter_alone(), "both empty: one claims alone");
        gate.alone_ended(false);
        assert!(gate.draining(), "a failed claim alone leaves the drain on");
        assert!(!gate.enter_batch());
        assert!(gate.enter_alone());
        gate.alone_ended(true);
        assert!(!gate.draining());
        assert!(gate.enter_batch());
    }

    #[tokio::test]
    async fn a_waiting_worker_sees_the_gate_change() {
        let gate = AloneGate::default();
        let mut changes = gate.subscribe();
        changes.borrow_and_update();
        assert!(gate.enter_batch());
        gate.drain();
        changes.changed().await.expect("the gate lives");
        assert!(changes.borrow_and_update().draining);
        gate.drain();
        assert!(!changes.has_changed().unwrap(), "no change, no wake-up");
    }
}
