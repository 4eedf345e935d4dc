//! Group commit: many concurrent callers, one transaction.
//!
//! Each caller submits one item and awaits its own answer; a small number of
//! flusher tasks take whatever has queued up and write it in one statement and
//! one commit. Under load a batch grows by itself (everything that arrived
//! while the previous commit was in flight); when idle, an item is written at
//! once, alone. Nothing is weakened per item: the batch statement still
//! filters each row on its own state and fencing token, and each caller learns
//! its own outcome.
//!
//! How flushers overlap is the caller's choice ([`Overlap`]): side by side
//! (each writes as soon as it has an item), or one at a time, where a flusher
//! waits for the batch in flight to commit (gathering whatever arrives
//! meanwhile into its own, bigger batch) unless that batch has been in flight
//! for longer than a stall limit, so a batch stuck on a lock holds up the
//! others for that long and no longer.
//!
//! The queue is bounded: at most `capacity` items wait for a flusher. A
//! caller that must get through (a worker's mark) waits for room
//! ([`GroupCommit::submit`]); a caller that can be told to come back (an
//! accept: the provider retries) is refused at once with
//! [`StoreError::Overloaded`] ([`GroupCommit::try_submit`]). So a burst the
//! database cannot keep up with turns into 503s, not into an ever-growing
//! queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, Mutex, Notify};

use super::StoreError;

/// Writes one batch; returns one answer per item, in order.
pub type FlushFn<T, R> =
    Arc<dyn Fn(Vec<T>) -> Pin<Box<dyn Future<Output = Vec<R>> + Send>> + Send + Sync>;

struct Queued<T, R> {
    item: T,
    reply: oneshot::Sender<R>,
}

/// The same kind of error for every caller of a failed batch (a transient
/// one stays transient, so each caller's in-process retry resubmits).
pub fn copy_error(error: &StoreError) -> StoreError {
    let text = error.to_string();
    if error.is_transient() {
        StoreError::Unavailable(sqlx::Error::Protocol(text))
    } else {
        StoreError::Corrupt(text)
    }
}

/// How a queue's flushers overlap.
#[derive(Debug, Clone, Copy)]
pub enum Overlap {
    /// Each flusher writes as soon as it has an item.
    SideBySide,
    /// A flusher with items waits while another batch is in flight, for at
    /// most this long (then it writes anyway: the batch in flight is stuck).
    /// (PostgreSQL's marks; SQLite has one writer and one flusher.)
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    OneAtATime {
        /// How long a batch in flight may hold up the next.
        stall_after: Duration,
    },
}

/// The batches in flight, for [`Overlap::OneAtATime`].
#[derive(Default)]
struct InFlight {
    batches: AtomicUsize,
    committed: Notify,
}

impl InFlight {
    /// Wait until no batch is in flight, or `stall_after` has passed.
    async fn wait_turn(&self, stall_after: Duration) {
        let deadline = tokio::time::Instant::now() + stall_after;
        loop {
            let committed = self.committed.notified();
            tokio::pin!(committed);
            // Registered before the check, so a commit in between is seen.
            committed.as_mut().enable();
            if self.batches.load(Ordering::Acquire) == 0 {
                return;
            }
            tokio::select! {
                // In order, not at random: a simulated run repeats (docs/simulation.md).
                biased;
                _ = committed => {}
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}

/// Counts one batch in flight until dropped (however its flush ends).
struct Flying(Arc<InFlight>);

impl Flying {
    fn start(in_flight: &Arc<InFlight>) -> Self {
        in_flight.batches.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(in_flight))
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        self.0.batches.fetch_sub(1, Ordering::AcqRel);
        self.0.committed.notify_waiters();
    }
}

/// A group-commit queue. Dropping it stops its flushers once the queue drains.
pub struct GroupCommit<T, R> {
    sender: mpsc::Sender<Queued<T, R>>,
}

impl<T, R> std::fmt::Debug for GroupCommit<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl<T: Send + 'static, R: Send + 'static> GroupCommit<T, R> {
    /// Start `flushers` tasks that write batches of at most `max_batch` items
    /// with `flush`, overlapping as `overlap` says, with room for `capacity`
    /// items waiting.
    pub fn start(
        flushers: usize,
        overlap: Overlap,
        max_batch: usize,
        capacity: usize,
        flush: FlushFn<T, R>,
    ) -> Self {
        let (sender, receiver) = mpsc::channel::<Queued<T, R>>(capacity.max(1));
        let receiver = Arc::new(Mutex::new(receiver));
        let in_flight = Arc::new(InFlight::default());
        for _ in 0..flushers.max(1) {
            let receiver = Arc::clone(&receiver);
            let flush = Arc::clone(&flush);
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move {
                loop {
                    let mut batch = Vec::new();
                    let flying = {
                        // One flusher gathers at a time; the others are writing.
                        let mut receiver = receiver.lock().await;
                        let Some(first) = receiver.recv().await else {
                            return;
                        };
                        if let Overlap::OneAtATime { stall_after } = overlap {
                            in_flight.wait_turn(stall_after).await;
                        }
                        batch.push(first);
                        while batch.len() < max_batch {
                            match receiver.try_recv() {
                                Ok(next) => batch.push(next),
                                Err(_) => break,
                            }
                        }
                        // Counted before the next flusher may gather.
                        Flying::start(&in_flight)
                    };
                    let (items, replies): (Vec<T>, Vec<oneshot::Sender<R>>) =
                        batch.into_iter().map(|q| (q.item, q.reply)).unzip();
                    let answers = flush(items).await;
                    drop(flying);
                    for (reply, answer) in replies.into_iter().zip(answers) {
                        let _ = reply.send(answer);
                    }
                }
            });
        }
        Self { sender }
    }

    /// Queue `item`, waiting for room if the queue is full, and wait for its
    /// answer.
    pub async fn submit(&self, item: T) -> Result<R, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Queued { item, reply })
            .await
            .map_err(|_| stopped())?;
        Self::answer(answer).await
    }

    /// Queue `item` if there is room (else [`StoreError::Overloaded`] at
    /// once), and wait for its answer.
    pub async fn try_submit(&self, item: T) -> Result<R, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .try_send(Queued { item, reply })
            .map_err(|error| match error {
                TrySendError::Full(_) => StoreError::Overloaded,
                TrySendError::Closed(_) => stopped(),
            })?;
        Self::answer(answer).await
    }

    async fn answer(answer: oneshot::Receiver<R>) -> Result<R, StoreError> {
        answer
            .await
            .map_err(|_| StoreError::Corrupt("a group commit was dropped mid-flight".into()))
    }
}

fn stopped() -> StoreError {
    StoreError::Corrupt("the group-commit queue has stopped".into())
}

impl<T, R> GroupCommit<T, R> {
    /// Room left in the queue (for tests).
    #[cfg(test)]
    fn room(&self) -> usize {
        self.sender.capacity()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn concurrent_items_share_batches_and_each_gets_its_own_answer() {
        let batches = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&batches);
        let flush: FlushFn<u32, u32> = Arc::new(move |items: Vec<u32>| {
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                items.into_iter().map(|i| i * 10).collect()
            })
        });
        let queue = Arc::new(GroupCommit::start(1, Overlap::SideBySide, 64, 128, flush));
        let calls = (0..100u32).map(|i| {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move { (i, queue.submit(i).await.unwrap()) })
        });
        for call in calls.collect::<Vec<_>>() {
            let (i, answer) = call.await.unwrap();
            assert_eq!(answer, i * 10);
        }
        let used = batches.load(Ordering::SeqCst);
        assert!(used < 100, "100 concurrent items took {used} commits");
    }

    /// Wait (polling a condition, with a generous deadline) until `condition` holds.
    async fn until(condition: impl Fn() -> bool) {
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while !condition() {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the condition holds in time");
    }

    /// A full queue refuses `try_submit` at once (Overloaded) while
    /// `submit` waits for room; once the flusher moves on, all get through,
    /// each with its own answer.
    #[tokio::test]
    async fn a_full_queue_refuses_try_submit_and_makes_submit_wait() {
        let (release, released) = tokio::sync::watch::channel(false);
        let flushing = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&flushing);
        let flush: FlushFn<u32, u32> = Arc::new(move |items: Vec<u32>| {
            counted.fetch_add(1, Ordering::SeqCst);
            let mut released = released.clone();
            Box::pin(async move {
                // Hold every batch until the test says so.
                let _ = released.wait_for(|go| *go).await;
                items
            })
        });
        let queue = Arc::new(GroupCommit::start(1, Overlap::SideBySide, 1, 2, flush));
        let submit = |i: u32| {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move { (i, queue.submit(i).await) })
        };
        // One item held by the flusher, two waiting: the queue is full.
        let mut calls = vec![submit(0)];
        until(|| flushing.load(Ordering::SeqCst) == 1).await;
        calls.push(submit(1));
        calls.push(submit(2));
        until(|| queue.room() == 0).await;
        assert!(matches!(
            queue.try_submit(9).await,
            Err(StoreError::Overloaded)
        ));
        // `submit` waits for room instead.
        calls.push(submit(3));
        release.send(true).unwrap();
        for call in calls {
            let (i, answer) = call.await.unwrap();
            assert_eq!(answer.unwrap(), i);
        }
        assert_eq!(queue.try_submit(4).await.unwrap(), 4);
    }

    /// One at a time: while a batch is in flight the next waits and grows,
    /// so batches never overlap; but a batch stuck past the stall limit does
    /// not hold the others up.
    #[tokio::test]
    async fn one_at_a_time_batches_do_not_overlap_unless_one_is_stuck() {
        let flying = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (counted, seen) = (Arc::clone(&flying), Arc::clone(&most));
        let flush: FlushFn<u32, u32> = Arc::new(move |items: Vec<u32>| {
            let (flying, most) = (Arc::clone(&counted), Arc::clone(&seen));
            Box::pin(async move {
                let now = flying.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                if items.contains(&u32::MAX) {
                    // Stuck (on a lock, say) until the test ends.
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                flying.fetch_sub(1, Ordering::SeqCst);
                items
            })
        });
        let overlap = Overlap::OneAtATime {
            stall_after: std::time::Duration::from_secs(3600),
        };
        let queue = Arc::new(GroupCommit::start(3, overlap, 64, 128, flush));
        let calls: Vec<_> = (0..60u32)
            .map(|i| {
                let queue = Arc::clone(&queue);
                tokio::spawn(async move { (i, queue.submit(i).await.unwrap()) })
            })
            .collect();
        for call in calls {
            let (i, answer) = call.await.unwrap();
            assert_eq!(answer, i);
        }
        assert_eq!(most.load(Ordering::SeqCst), 1, "batches overlapped");

        let overlap = Overlap::OneAtATime {
            stall_after: std::time::Duration::from_millis(20),
        };
        let flush: FlushFn<u32, u32> = Arc::new(|items: Vec<u32>| {
            Box::pin(async move {
                if items.contains(&u32::MAX) {
                    std::future::pending::<()>().await;
                }
                items
            })
        });
        let queue = Arc::new(GroupCommit::start(3, overlap, 1, 128, flush));
        let stuck = {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move { queue.submit(u32::MAX).await })
        };
        for i in 0..5 {
            let answer = tokio::time::timeout(std::time::Duration::from_secs(20), queue.submit(i))
                .await
                .expect("a stuck batch holds the next one up for the stall limit only");
            assert_eq!(answer.unwrap(), i);
        }
        assert!(!stuck.is_finished());
        stuck.abort();
    }
}
