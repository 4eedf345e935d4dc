//! A step that waited for SQLite's write lock and gave up: on SQLite a
//! transactional step's own transaction holds the file's write lock for the
//! whole of its run (it begins `IMMEDIATE`), so a write the step makes
//! through any other connection (the application's own pool, a second
//! `engine.transaction()`) waits for a lock that is only let go when the
//! step returns, until that connection's busy timeout, and fails as
//! "database is locked". The event is then pending on a retry that will
//! wait the same way: not a handler held back on purpose.

use std::time::Duration;

use tickmark_core::EventStatus;
use tickmark_driver::store::Backend;

use super::boundaries::Crash;
use super::findings::Finding;

/// What SQLite says when a connection gave up waiting for a lock
/// (`SQLITE_BUSY`, code 5, and `SQLITE_LOCKED`, code 6, as sqlx shows them).
const LOCK_WAIT_ERRORS: &[&str] = &[
    "database is locked",
    "database table is locked",
    "database is busy",
    "sqlite_busy",
    "sqlite_locked",
    "(code: 5)",
    "(code: 6)",
];

/// The fix for a step that waited on its own transaction's lock.
pub(crate) const FIX: &str = "write through ctx.transaction(), the step's own transaction, \
    not through a second connection (your application's own pool, another \
    engine.transaction()): on SQLite the step's transaction holds the database's write lock \
    until the step returns, so the second connection waits for it until its busy timeout and \
    fails (\"database is locked\"), and so does every retry";

/// A transactional step still running on SQLite when the run's time ran
/// out: most likely waiting for the write lock its own transaction holds
/// (the engine's own pool waits 30 s for it, longer than most test runs).
pub(crate) fn stuck(
    step: String,
    crash: Option<Crash>,
    crashed_step: Option<String>,
    within: Duration,
) -> Finding {
    Finding {
        step,
        crash,
        crashed_step,
        problem: format!(
            "it did not return within {:.1} s; it is transactional, and on SQLite its \
             transaction holds the database's write lock until it returns, so a write it makes \
             through a second connection waits for that lock, until that connection's busy \
             timeout (30 s for the engine's own pool) or forever",
            within.as_secs_f64()
        ),
        fix: format!(
            "{FIX}; if it writes nothing beside its transaction, look for what else it waits on \
             (or give the run more time: CrashTest::within)"
        ),
    }
}

/// The step of `status` whose last error is SQLite giving up on a lock, on
/// SQLite; `None` otherwise.
pub(crate) fn waited_for_the_lock(backend: Backend, status: &EventStatus) -> Option<String> {
    if backend != Backend::Sqlite {
        return None;
    }
    status
        .steps
        .iter()
        .find(|step| step.last_error.as_deref().is_some_and(is_lock_wait))
        .map(|step| step.step.clone())
}

/// Whether `error` is SQLite's "gave up waiting for a lock".
fn is_lock_wait(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    LOCK_WAIT_ERRORS.iter().any(|known| error.contains(known))
}

#[cfg(test)]
mod tests {
    use super::is_lock_wait;

    #[test]
    fn sqlites_lock_errors_as_sqlx_shows_them_are_lock_waits() {
        assert!(is_lock_wait(
            "error returned from database: (code: 5) database is locked"
        ));
        assert!(is_lock_wait("(code: 517) database is locked"));
        assert!(is_lock_wait("SQLITE_BUSY"));
        assert!(!is_lock_wait("connection refused"));
        assert!(!is_lock_wait("UNIQUE constraint failed: accounts.id"));
    }
}
