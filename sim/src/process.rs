//! A simulated worker process: its life (alive, paused, crashed), and the
//! switch that turns the store's faults on and off.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One incarnation of a simulated process.
#[derive(Debug)]
pub struct ProcessState {
    /// `p1.2`: process 1, third start.
    pub name: String,
    crashed: AtomicBool,
    crashed_at: Mutex<Option<Instant>>,
    paused_until: Mutex<Option<Instant>>,
    died: CancellationToken,
}

impl ProcessState {
    /// A process that just started.
    pub fn new(name: String) -> Arc<Self> {
        Arc::new(Self {
            name,
            crashed: AtomicBool::new(false),
            crashed_at: Mutex::new(None),
            paused_until: Mutex::new(None),
            died: CancellationToken::new(),
        })
    }

    /// It died: nothing of it may run afterwards.
    pub fn crash(&self) {
        self.crashed.store(true, Ordering::SeqCst);
        *self.crashed_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.died.cancel();
    }

    /// Fires when it crashes: a client's connection to it breaks.
    pub fn died(&self) -> &CancellationToken {
        &self.died
    }

    /// Whether it crashed at an earlier simulated instant than now. The
    /// tasks a crash kills are dropped in the instant of the crash (the
    /// paused clock moves only when every task waits); one of its tasks
    /// still running later survived the crash.
    pub fn crashed_before_now(&self) -> bool {
        self.crashed_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at < Instant::now())
    }

    /// At an await point of a crashed process: never go on.
    async fn stop_if_crashed(&self) {
        if self.is_crashed() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether it died.
    pub fn is_crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Stop it until `until` (a GC pause, SIGSTOP, a frozen VM).
    pub fn pause_until(&self, until: Instant) {
        *self.paused_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }

    /// End any pause now.
    pub fn resume(&self) {
        *self.paused_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether it is paused now.
    pub fn is_paused(&self) -> bool {
        self.paused_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|until| until > Instant::now())
    }

    /// Wait out a pause, if one is on.
    pub async fn await_running(&self) {
        loop {
            let until = *self.paused_until.lock().unwrap_or_else(|p| p.into_inner());
            match until {
                Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                _ => return self.stop_if_crashed().await,
            }
        }
    }

    /// Sleep `duration` of this process's time: a pause stretches it.
    pub async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
        self.await_running().await;
    }
}

/// Whether faults are being injected now (the chaos phase), and how often.
#[derive(Debug)]
pub struct FaultSwitch {
    on: AtomicBool,
    /// Chance that a store call fails before reaching the database.
    pub fail_before: f64,
    /// Chance that a write commits and its caller is told it failed.
    pub fail_after: f64,
}

impl FaultSwitch {
    /// Faults on, at these rates.
    pub fn new(fail_before: f64, fail_after: f64) -> Arc<Self> {
        Arc::new(Self {
            on: AtomicBool::new(true),
            fail_before,
            fail_after,
        })
    }

    /// Stop injecting faults (the run heals).
    pub fn heal(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    /// Whether faults are on.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }
}
