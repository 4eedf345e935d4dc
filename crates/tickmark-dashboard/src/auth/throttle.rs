//! Failed token checks, throttled per client address and globally, so the
//! token cannot be guessed at the speed of the network.
//!
//! Every check of a presented token (the login form, the retry form's
//! `token` field, an `Authorization: Bearer` header on a page or on
//! `/metrics`) first passes a [`Gate`]: over budget, the request is answered
//! 429 with `Retry-After` and its token is **not checked at all**, so a right
//! guess made during a lock-out is not revealed either. A wrong token then
//! counts against the client's address ([`Client`]) and against a global
//! budget; a right one counts nothing. Session cookies are not throttled:
//! they are HMAC tags under a 256-bit key, not guessable, and a signed-in
//! operator keeps working while someone else burns the budget.
//!
//! Each budget is a token bucket (kept as GCRA's "theoretical arrival
//! time": one `Instant` per key): `failures` failures at once, then one more
//! each `window / failures`. With the defaults an address is locked after
//! [`DEFAULT_PER_CLIENT`] wrong tokens and then gets one more guess every 6
//! seconds; everyone together gets [`DEFAULT_GLOBAL`] per minute. The global
//! budget is what stops an attacker with many addresses; it also means such
//! an attacker can keep the login form locked for everyone (signed-in
//! browsers are unaffected), the usual price of a lock-out.
//!
//! Memory is bounded: at most [`MAX_CLIENTS`] addresses are tracked, and an
//! address whose bucket has refilled is forgotten. A failure can only be
//! recorded when the global budget admits it, so with the defaults no more
//! than about [`DEFAULT_GLOBAL`] addresses are ever live at once; should the
//! map still be full, a new address is not tracked and only the global
//! budget holds it back.
//!
//! The check and its recording happen under one lock, so requests in flight
//! together cannot overshoot the budget.
//!
//! Hand-written rather than `governor`: what is needed is one bucket per
//! key, a bounded key set (governor's keyed limiter grows until
//! `retain_recent` is called) and an injected clock, in about a hundred
//! lines without `dashmap`, `quanta` and friends.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::client::Client;

/// Wrong tokens one client address may present per [`DEFAULT_WINDOW`]
/// before it is answered 429.
pub const DEFAULT_PER_CLIENT: u32 = 10;

/// Wrong tokens all clients together may present per [`DEFAULT_WINDOW`]
/// before every token check is answered 429.
pub const DEFAULT_GLOBAL: u32 = 100;

/// The window the budgets refill over: a locked budget regains one failure
/// every `window / failures`, and all of them after `window`.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// Most client addresses tracked at once (about 64 bytes each).
pub const MAX_CLIENTS: usize = 4096;

/// How many wrong tokens are tolerated before the dashboard answers 429
/// ([`Dashboard::failure_limits`](crate::Dashboard::failure_limits)).
///
/// ```
/// use std::time::Duration;
/// use tickmark::dashboard::FailureLimits;
///
/// let strict = FailureLimits { per_client: 5, ..FailureLimits::default() };
/// assert_eq!(strict.global, 100);
/// assert_eq!(strict.window, Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureLimits {
    /// Per client address (an IPv6 client is its /64) per `window`
    /// (default [`DEFAULT_PER_CLIENT`]; 0 counts as 1).
    pub per_client: u32,
    /// All clients together per `window` (default [`DEFAULT_GLOBAL`]; 0
    /// counts as 1).
    pub global: u32,
    /// The refill window (default [`DEFAULT_WINDOW`]). Zero turns the
    /// throttle off.
    pub window: Duration,
}

impl Default for FailureLimits {
    fn default() -> Self {
        Self {
            per_client: DEFAULT_PER_CLIENT,
            global: DEFAULT_GLOBAL,
            window: DEFAULT_WINDOW,
        }
    }
}

/// Where the throttle reads "now": the monotonic clock unless told
/// otherwise (a test's). Monotonic, unlike the store's wall
/// [`Clock`](tickmark_driver::store::Clock): a clock set back must not lock anyone out.
#[derive(Clone, Default)]
pub(crate) struct Now {
    read: Option<Arc<dyn Fn() -> Instant + Send + Sync>>,
}

impl Now {
    /// A clock that reads `now`.
    #[cfg(test)]
    pub(crate) fn from_fn(now: impl Fn() -> Instant + Send + Sync + 'static) -> Self {
        Self {
            read: Some(Arc::new(now)),
        }
    }

    fn now(&self) -> Instant {
        match &self.read {
            Some(read) => read(),
            None => Instant::now(),
        }
    }
}

impl fmt::Debug for Now {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.read {
            Some(_) => "Now(given)",
            None => "Now(monotonic)",
        })
    }
}

/// Whose budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The client address's.
    Client,
    /// Everyone's.
    Global,
}

/// A token check refused unchecked: the budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Locked {
    /// Until the budget admits one more check.
    pub(crate) retry_after: Duration,
    /// Whose budget it is.
    pub(crate) scope: Scope,
    /// Whether this refusal is the lock-out's first (the one logged).
    pub(crate) first: bool,
}

impl Locked {
    /// `Retry-After` in whole seconds, rounded up, at least 1.
    pub(crate) fn retry_after_secs(&self) -> u64 {
        let secs = self.retry_after.as_secs();
        let rounded = if self.retry_after.subsec_nanos() > 0 {
            secs.saturating_add(1)
        } else {
            secs
        };
        rounded.max(1)
    }
}

/// One budget's parameters: the time one failure costs, and how much debt
/// is tolerated before refusing (`window` minus one failure's cost).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    cost: Duration,
    tolerance: Duration,
}

impl Bucket {
    fn new(failures: u32, window: Duration) -> Self {
        let cost = window / failures.max(1);
        Self {
            cost,
            tolerance: window.saturating_sub(cost),
        }
    }

    /// How long until a key whose bucket is full again at `full_at` may be
    /// checked, if it may not be now.
    fn wait(&self, full_at: Instant, now: Instant) -> Option<Duration> {
        let debt = full_at.saturating_duration_since(now);
        (debt > self.tolerance).then(|| debt.saturating_sub(self.tolerance))
    }

    /// When the bucket is full again after one more failure at `now`.
    fn charge(&self, full_at: Instant, now: Instant) -> Instant {
        let from = full_at.max(now);
        from.checked_add(self.cost).unwrap_or(from)
    }
}

/// One key's state.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When its bucket is full again (GCRA's theoretical arrival time).
    full_at: Instant,
    /// Whether this lock-out was logged already (cleared when the bucket
    /// is full again).
    warned: bool,
}

#[derive(Debug)]
struct State {
    global: Entry,
    clients: HashMap<Client, Entry>,
}

/// The throttle of one dashboard's token.
#[derive(Debug)]
pub(crate) struct Throttle {
    per_client: Bucket,
    global: Bucket,
    capacity: usize,
    now: Now,
    state: Mutex<State>,
}

impl Throttle {
    /// A throttle with `limits`, reading `now`.
    pub(crate) fn new(limits: FailureLimits, now: Now) -> Self {
        Self::with_capacity(limits, now, MAX_CLIENTS)
    }

    /// … tracking at most `capacity` client addresses.
    fn with_capacity(limits: FailureLimits, now: Now, capacity: usize) -> Self {
        let start = now.now();
        Self {
            per_client: Bucket::new(limits.per_client, limits.window),
            global: Bucket::new(limits.global, limits.window),
            capacity,
            state: Mutex::new(State {
                global: Entry {
                    full_at: start,
                    warned: false,
                },
                clients: HashMap::new(),
            }),
            now,
        }
    }

    /// The clock it reads (for a throttle with other limits).
    pub(crate) fn clock(&self) -> Now {
        self.now.clone()
    }

    /// Whether `client` may have a token checked now: a [`Gate`] to record
    /// the check's failure through, or why not. The first refusal of a
    /// lock-out is logged as a warning; the others are not.
    pub(crate) fn gate(&self, client: Option<Client>) -> Result<Gate<'_>, Locked> {
        // Nothing panics while the lock is held; a poisoned lock's state is
        // still a valid state.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let now = self.now.now();
        if let Some(client) = client {
            if let Some(entry) = state.clients.get_mut(&client) {
                if entry.full_at <= now {
                    state.clients.remove(&client);
                } else if let Some(wait) = self.per_client.wait(entry.full_at, now) {
                    let locked = Locked {
                        retry_after: wait,
                        scope: Scope::Client,
                        first: !std::mem::replace(&mut entry.warned, true),
                    };
                    if locked.first {
                        tracing::warn!(
                            %client,
                            retry_after_s = locked.retry_after_secs(),
                            "dashboard: too many wrong tokens from this address; its token \
                             checks are refused (429) until its budget refills"
                        );
                    }
                    return Err(locked);
                }
            }
        }
        let global = &mut state.global;
        if global.full_at <= now {
            global.warned = false;
        } else if let Some(wait) = self.global.wait(global.full_at, now) {
            let locked = Locked {
                retry_after: wait,
                scope: Scope::Global,
                first: !std::mem::replace(&mut global.warned, true),
            };
            if locked.first {
                tracing::warn!(
                    retry_after_s = locked.retry_after_secs(),
                    "dashboard: too many wrong tokens from all clients together; every token \
                     check is refused (429) until the global budget refills"
                );
            }
            return Err(locked);
        }
        Ok(Gate {
            throttle: self,
            state,
            client,
            now,
        })
    }

    /// How many client addresses are tracked now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clients
            .len()
    }
}

/// A token check the throttle admitted. It holds the throttle's lock until
/// it is dropped (a right token: nothing recorded) or [`failed`](Self::failed)
/// (a wrong one), so keep it across the check only, never across an `.await`.
#[must_use = "a wrong token must be recorded with `failed`"]
pub(crate) struct Gate<'t> {
    throttle: &'t Throttle,
    state: MutexGuard<'t, State>,
    client: Option<Client>,
    now: Instant,
}

impl Gate<'_> {
    /// The token was wrong: count it against the client and the global
    /// budget.
    pub(crate) fn failed(mut self) {
        let (throttle, now) = (self.throttle, self.now);
        let state = &mut *self.state;
        state.global.full_at = throttle.global.charge(state.global.full_at, now);
        let Some(client) = self.client else {
            return;
        };
        if !state.clients.contains_key(&client) && state.clients.len() >= throttle.capacity {
            state.clients.retain(|_, entry| entry.full_at > now);
        }
        if let Some(entry) = state.clients.get_mut(&client) {
            entry.full_at = throttle.per_client.charge(entry.full_at, now);
        } else if state.clients.len() < throttle.capacity {
            state.clients.insert(
                client,
                Entry {
                    full_at: throttle.per_client.charge(now, now),
                    warned: false,
                },
            );
        } else {
            tracing::debug!(%client, "dashboard: throttle full; this address meets only the global budget");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A clock that moves only when told to.
    #[derive(Clone)]
    struct Manual {
        start: Instant,
        elapsed_ms: Arc<AtomicU64>,
    }

    impl Manual {
        fn new() -> Self {
            Self {
                start: Instant::now(),
                elapsed_ms: Arc::new(AtomicU64::new(0)),
            }
        }

        fn advance(&self, by: Duration) {
            self.elapsed_ms
                .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        }

        fn now(&self) -> Now {
            let clock = self.clone();
            Now::from_fn(move || {
                clock.start + Duration::from_millis(clock.elapsed_ms.load(Ordering::SeqCst))
            })
        }
    }

    fn client(ip: &str) -> Option<Client> {
        Some(Client::of(ip.parse().unwrap()))
    }

    fn limits(per_client: u32, global: u32) -> FailureLimits {
        FailureLimits {
            per_client,
            global,
            window: Duration::from_secs(60),
        }
    }

    /// `n` wrong tokens from `who`, each admitted.
    fn fail(throttle: &Throttle, who: Option<Client>, n: u32) {
        for i in 0..n {
            throttle
                .gate(who)
                .unwrap_or_else(|locked| panic!("failure {i} refused: {locked:?}"))
                .failed();
        }
    }

    #[test]
    fn a_client_gets_its_budget_then_429_until_it_refills() {
        let clock = Manual::new();
        let throttle = Throttle::new(limits(10, 100), clock.now());
        let me = client("192.0.2.1");
        fail(&throttle, me, 10);
        let locked = throttle.gate(me).err().expect("the 11th is refused");
        assert_eq!(locked.scope, Scope::Client);
        assert_eq!(locked.retry_after, Duration::from_secs(6));
        assert_eq!(locked.retry_after_secs(), 6);

        // Refused checks cost nothing: still 6 s to wait, then one guess.
        for _ in 0..50 {
            assert!(throttle.gate(me).is_err());
        }
        clock.advance(Duration::from_millis(5_999));
        assert_eq!(throttle.gate(me).err().unwrap().retry_after_secs(), 1);
        clock.advance(Duration::from_millis(1));
        fail(&throttle, me, 1);
        assert!(throttle.gate(me).is_err(), "one refilled, one spent");

        // A whole window later the whole budget is back, and forgotten.
        clock.advance(Duration::from_secs(60));
        fail(&throttle, me, 10);
        assert!(throttle.gate(me).is_err());
    }

    #[test]
    fn a_lock_out_is_logged_once_until_the_bucket_refills() {
        let clock = Manual::new();
        let throttle = Throttle::new(limits(2, 4), clock.now());
        let me = client("192.0.2.1");
        fail(&throttle, me, 2);
        let firsts = |throttle: &Throttle, who| {
            (0..5)
                .map(|_| throttle.gate(who).err().expect("locked").first)
                .collect::<Vec<_>>()
        };
        assert_eq!(firsts(&throttle, me), [true, false, false, false, false]);
        // Half refilled, locked again at once: the same lock-out, not logged.
        clock.advance(Duration::from_secs(30));
        fail(&throttle, me, 1);
        assert_eq!(firsts(&throttle, me), [false; 5]);
        // Quiet for a whole window: the next lock-out is logged again.
        clock.advance(Duration::from_secs(60));
        fail(&throttle, me, 2);
        assert!(throttle.gate(me).err().unwrap().first);
        // The global budget has its own: two more addresses spend it.
        fail(&throttle, client("192.0.2.2"), 2);
        assert_eq!(
            firsts(&throttle, client("192.0.2.3")),
            [true, false, false, false, false]
        );
    }

    #[test]
    fn right_tokens_cost_nothing() {
        let clock = Manual::new();
        let throttle = Throttle::new(limits(3, 100), clock.now());
        let me = client("192.0.2.1");
        for _ in 0..100 {
            drop(throttle.gate(me).expect("admitted"));
        }
        fail(&throttle, me, 3);
        assert!(throttle.gate(me).is_err());
    }

    #[test]
    fn clients_are_isolated_and_the_global_budget_binds_them_all() {
        let clock = Manual::new();
        let throttle = Throttle::new(limits(3, 10), clock.now());
        fail(&throttle, client("192.0.2.1"), 3);
        assert!(throttle.gate(client("192.0.2.1")).is_err());
        fail(&throttle, client("192.0.2.2"), 3);
        fail(&throttle, client("192.0.2.3"), 3);
        // 9 spent globally: one left, for anyone, address or none.
        fail(&throttle, None, 1);
        for who in [client("192.0.2.4"), None] {
            let locked = throttle.gate(who).err().expect("global budget spent");
            assert_eq!(locked.scope, Scope::Global);
            assert_eq!(locked.retry_after, Duration::from_secs(6));
        }
        // A client over its own budget is told its own wait.
        let own = throttle.gate(client("192.0.2.1")).err().unwrap();
        assert_eq!(own.scope, Scope::Client);
        assert_eq!(own.retry_after, Duration::from_secs(20));
    }

    #[test]
    fn an_ipv6_client_is_its_64() {
        let clock = Manual::new();
        let throttle = Throttle::new(limits(4, 100), clock.now());
        for host in [
            "2001:db8:0:1::1",
            "2001:db8:0:1::2",
            "2001:db8:0:1:a:b:c:d",
            "2001:db8:0:1::ffff",
        ] {
            fail(&throttle, client(host), 1);
        }
        assert!(throttle.gate(client("2001:db8:0:1::9")).is_err());
        assert!(throttle.gate(client("2001:db8:0:2::1")).is_ok());
    }

    #[test]
    fn memory_is_bounded_and_refilled_clients_are_forgotten() {
        let clock = Manual::new();
        let throttle = Throttle::with_capacity(limits(2, 1000), clock.now(), 3);
        for i in 1..=3 {
            fail(&throttle, client(&format!("192.0.2.{i}")), 2);
        }
        assert_eq!(throttle.tracked(), 3);
        // Full, and nobody has refilled: a new address is not tracked (only
        // the global budget holds it), the others stay locked.
        fail(&throttle, client("192.0.2.9"), 5);
        assert_eq!(throttle.tracked(), 3);
        for i in 1..=3 {
            assert!(throttle.gate(client(&format!("192.0.2.{i}"))).is_err());
        }
        // Once their buckets refill, they make room.
        clock.advance(Duration::from_secs(60));
        for i in 10..20 {
            fail(&throttle, client(&format!("192.0.2.{i}")), 1);
            assert!(throttle.tracked() <= 3);
        }
        assert!(throttle.gate(client("192.0.2.19")).is_ok());
    }

    #[test]
    fn a_zero_window_turns_it_off_and_zero_budgets_mean_one() {
        let clock = Manual::new();
        let off = Throttle::new(
            FailureLimits {
                window: Duration::ZERO,
                ..FailureLimits::default()
            },
            clock.now(),
        );
        fail(&off, client("192.0.2.1"), 1000);
        let one = Throttle::new(limits(0, 0), clock.now());
        fail(&one, None, 1);
        assert!(one.gate(None).is_err());
    }

    #[test]
    fn retry_after_rounds_up() {
        let locked = |ms| Locked {
            retry_after: Duration::from_millis(ms),
            scope: Scope::Client,
            first: true,
        };
        assert_eq!(locked(1).retry_after_secs(), 1);
        assert_eq!(locked(0).retry_after_secs(), 1);
        assert_eq!(locked(6_000).retry_after_secs(), 6);
        assert_eq!(locked(6_001).retry_after_secs(), 7);
    }
}
