//! A worker's slots: how many events run steps at once (its concurrency), and
//! how many finished events may still be committing their last mark behind
//! them.
//!
//! An event holds a slot while its steps run. Once its last step has run, the
//! slot is handed on to the next event while the final mark commits: the
//! event's lease stays in the book (the heartbeat renews it) until that mark
//! is durable, and a refused or failed commit is handled as before, as a lost
//! lease. So a slot does not sit idle for a commit's round trip at the end of
//! every event. At most [`finishing_limit`] events wait for their final
//! mark at once; beyond that, an event keeps its slot until
//! its mark commits, so a stalled database cannot make a worker take on more
//! and more events.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// How many events may wait for their final mark, per slot. Many: a mark
/// batch commits in a few milliseconds, and quick events finish many times
/// faster than that, so the more wait, the bigger each batch (1 no-op step
/// at concurrency 16 on PostgreSQL: ~8,300 events/s at 1 per slot, ~9,400
/// at 4; with deep prefetch ~10,000 at 4 and ~13,500 at 32; no better at
/// 64; docs/performance.md).
const FINISHING_PER_SLOT: usize = 32;

/// But no more than this many in all beyond [`MIN_FINISHING_PER_SLOT`] per
/// slot: an earlier step's mark (which its slot waits for) shares the mark
/// batches with them, and thousands of final marks ahead of it made those
/// batches slow (3 no-op steps at concurrency 64: 0.85× the throughput of
/// 4 per slot).
const MAX_FINISHING: usize = 512;

/// Per slot, whatever [`MAX_FINISHING`] says (as before deep prefetch).
const MIN_FINISHING_PER_SLOT: usize = 4;

/// How many events may wait for their final mark in a worker of `concurrency`.
fn finishing_limit(concurrency: usize) -> usize {
    let concurrency = concurrency.max(1);
    concurrency
        .saturating_mul(FINISHING_PER_SLOT)
        .min(MAX_FINISHING)
        .max(concurrency.saturating_mul(MIN_FINISHING_PER_SLOT))
}

/// The slots of one worker.
#[derive(Debug)]
pub struct Slots {
    running: AtomicUsize,
    freed: Notify,
    finishing: Arc<Semaphore>,
}

impl Slots {
    /// Slots for a worker of `concurrency`.
    pub fn new(concurrency: usize) -> Arc<Self> {
        Arc::new(Self {
            running: AtomicUsize::new(0),
            freed: Notify::new(),
            finishing: Arc::new(Semaphore::new(finishing_limit(concurrency))),
        })
    }

    /// How many events hold a slot now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Take a slot for an event (the claim loop checks for room first).
    pub fn take(self: &Arc<Self>) -> Slot {
        self.running.fetch_add(1, Ordering::AcqRel);
        Slot {
            slots: Some(Arc::clone(self)),
            finishing: None,
        }
    }

    /// Wait until a slot is freed (after the caller saw none free).
    pub async fn freed(&self) {
        self.freed.notified().await;
    }

    fn free(&self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
        // A permit is stored when nobody waits, so a claim loop that checks
        // for room and then waits never misses this.
        self.freed.notify_one();
    }
}

/// One event's slot. Dropping it frees the slot (if not handed on already)
/// and ends the event's wait for its final mark.
#[derive(Debug)]
pub struct Slot {
    slots: Option<Arc<Slots>>,
    finishing: Option<OwnedSemaphorePermit>,
}

impl Slot {
    /// The event's steps have all run and its last mark is about to be
    /// committed: hand the slot on to the next event, if fewer than
    /// [`finishing_limit`] events are already waiting for their final mark
    /// (otherwise keep it until this event ends).
    pub fn hand_on(&mut self) {
        let Some(slots) = &self.slots else {
            return;
        };
        let Ok(permit) = Arc::clone(&slots.finishing).try_acquire_owned() else {
            return;
        };
        self.finishing = Some(permit);
        if let Some(slots) = self.slots.take() {
            slots.free();
        }
    }

    /// Whether this event still holds its slot (for tests).
    #[cfg(test)]
    fn holds(&self) -> bool {
        self.slots.is_some()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.free();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_on_slot_is_free_at_once_and_counted_once() {
        let slots = Slots::new(2);
        let mut first = slots.take();
        let _second = slots.take();
        assert_eq!(slots.running(), 2);
        first.hand_on();
        assert!(!first.holds());
        assert_eq!(slots.running(), 1);
        // Handing on twice, then ending, frees nothing more.
        first.hand_on();
        drop(first);
        assert_eq!(slots.running(), 1);
    }

    #[test]
    fn the_window_of_waiting_final_marks_is_bounded() {
        let slots = Slots::new(1);
        let mut waiting = Vec::new();
        for _ in 0..finishing_limit(1) {
            let mut slot = slots.take();
            slot.hand_on();
            assert!(!slot.holds());
            waiting.push(slot);
        }
        let mut next = slots.take();
        next.hand_on();
        assert!(next.holds(), "the window of waiting final marks is full");
        assert_eq!(slots.running(), 1);
        drop(waiting.pop());
        // A final mark committed: the next event may hand on again.
        let mut after = slots.take();
        after.hand_on();
        assert!(!after.holds());
        drop(next);
        assert_eq!(slots.running(), 0);
    }

    #[test]
    fn many_final_marks_wait_per_slot_but_not_thousands_in_all() {
        assert_eq!(finishing_limit(1), 32);
        assert_eq!(finishing_limit(16), 512);
        assert_eq!(finishing_limit(64), 512);
        assert_eq!(finishing_limit(256), 1024, "still 4 per slot");
    }

    #[tokio::test]
    async fn a_freed_slot_wakes_a_waiter_that_checked_before_it_was_freed() {
        let slots = Slots::new(1);
        let slot = slots.take();
        // The loop saw no room ...
        assert_eq!(slots.running(), 1);
        // ... the slot is freed before it starts waiting ...
        drop(slot);
        // ... and the wait still ends.
        tokio::time::timeout(std::time::Duration::from_secs(10), slots.freed())
            .await
            .expect("the stored wake-up ends the wait");
    }
}
