//! Crashes for real: worker processes killed with SIGKILL (in the middle of a
//! step, and inside a transactional step between its write and its commit),
//! and several worker processes sharing one database (guarantees 3, 4 and 6).

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tickmark::{Backend, EventState, Handler, Handlers, NewEvent, StepState};
use tickmark_tests::announced::{self, StdoutLines};
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::test_steps::{
    AnnounceThenAwaitFile, Credit, CreditThenAwaitKill, Record, STEP_RAN, WRITTEN_AWAITING_KILL,
};
use tickmark_tests::{wait, TestDb};
use tokio::process::{Child, Command};

const WORKER: &str = env!("CARGO_BIN_EXE_tickmark-test-worker");

fn worker_process(db: &TestDb, name: &str, extra: &[&str]) -> Child {
    Command::new(WORKER)
        .args([
            "--database-url",
            &db.url,
            "--name",
            name,
            "--lease-ms",
            "2000",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the test worker")
}

/// Credit, render (paused 10 minutes on its first attempt), notify: a worker
/// killed while it renders dies in step 2 of 3 (also `traces.rs`).
pub(crate) fn credit_render_notify() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("credit", Credit { amount: 100 })
            .named_step(
                "render",
                Record {
                    first_attempt_pause_ms: 600_000,
                    ..Record::default()
                },
            )
            .named_step("notify", Record::default()),
    )
}

/// A worker process is SIGKILLed in the middle of step 2 of 3. Once its lease
/// expires another worker resumes: step 1 ran once (its transactional effect
/// exactly once), step 2 at most twice, step 3 once.
async fn a_worker_killed_in_the_middle_of_step_two(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let engine = engine(&db, credit_render_notify());
    for _ in 0..3 {
        engine
            .accept(NewEvent::with_id(
                "shop",
                "evt_kill",
                "order.paid",
                json!({}),
            ))
            .await
            .unwrap();
    }

    let mut victim = worker_process(&db, "victim", &[]);
    wait::until(
        "the victim is inside step 2",
        Duration::from_secs(60),
        || async { db.probe.runs("evt_kill", "render").await == 1 },
    )
    .await;
    victim.start_kill().expect("SIGKILL");
    let status = victim.wait().await.unwrap();
    assert!(!status.success(), "killed, not exited: {status:?}");

    let record = db.record_of("shop", "evt_kill").await;
    assert_eq!((record.state, record.next_step), (EventState::Running, 1));
    assert_eq!(record.lease_owner.as_deref(), Some("victim"));

    let stats = engine
        .worker(quick_worker("rescuer"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.takeovers, 1);

    assert_eq!(
        db.probe.ledger_rows("evt_kill").await,
        1,
        "credit applied exactly once"
    );
    assert_eq!(
        db.probe.runs("evt_kill", "render").await,
        2,
        "the interrupted step re-ran once"
    );
    assert_eq!(db.probe.runs("evt_kill", "notify").await, 1);
    let record = db.record_of("shop", "evt_kill").await;
    assert_eq!((record.state, record.takeovers), (EventState::Done, 1));
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    let attempts: Vec<_> = steps.iter().map(|s| (s.state, s.attempts)).collect();
    assert_eq!(
        attempts,
        [
            (StepState::Done, 1),
            (StepState::Done, 2),
            (StepState::Done, 1)
        ]
    );
}

/// Guarantee 6 for real: a worker process is SIGKILLed *inside* a
/// transactional step, after its write and before the commit (the step prints
/// a line once it has written; the test kills on that line, not after a
/// sleep). The write was never visible outside its transaction, the kill
/// rolls it back, and the re-run's write commits with its mark: the ledger
/// row exists exactly once. A step whose write committed on its own (not in
/// the engine's transaction) would show its row before the kill, and twice
/// after the re-run.
async fn a_worker_killed_inside_a_transactional_step(backend: Backend) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("credit", CreditThenAwaitKill { amount: 100 })
            .named_step("notify", Record::default()),
    );
    let engine = engine(&db, handlers);
    engine
        .accept(NewEvent::with_id(
            "shop",
            "evt_tx_kill",
            "order.paid",
            json!({}),
        ))
        .await
        .unwrap();

    // A long lease, so that it cannot run out between the step's line and the
    // kill however slowly this machine runs (on SQLite the step's open
    // transaction holds the write turn, which holds the victim's heartbeat
    // back); the lease is moved into the past once the victim is dead.
    let mut victim = worker_process(&db, "victim", &["--lease-ms", "30000"]);
    let mut output = announced::stdout_lines(&mut victim);
    let announced = line_starting_with(&mut output, WRITTEN_AWAITING_KILL).await;
    assert_eq!(
        announced,
        format!("{WRITTEN_AWAITING_KILL} evt_tx_kill 1"),
        "the step wrote its row and sees it in its own transaction"
    );
    assert_eq!(
        db.probe.ledger_rows("evt_tx_kill").await,
        0,
        "the step's write is not visible before its commit"
    );
    victim.start_kill().expect("SIGKILL");
    let status = victim.wait().await.unwrap();
    assert!(!status.success(), "killed, not exited: {status:?}");
    assert_eq!(
        db.probe.ledger_rows("evt_tx_kill").await,
        0,
        "the kill rolled the uncommitted write back"
    );
    let record = db.record_of("shop", "evt_tx_kill").await;
    assert_eq!((record.state, record.next_step), (EventState::Running, 0));
    assert_eq!(record.lease_owner.as_deref(), Some("victim"));
    db.probe.expire_lease(record.event.seq).await;

    let stats = engine
        .worker(quick_worker("rescuer"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(stats.takeovers, 1);
    assert_eq!(
        db.probe.ledger_rows("evt_tx_kill").await,
        1,
        "the transactional effect exactly once"
    );
    assert_eq!(
        db.probe
            .scalar("SELECT CAST(coalesce(sum(amount), 0) AS BIGINT) FROM test_ledger WHERE event_id = 'evt_tx_kill'")
            .await,
        100
    );
    assert_eq!(db.probe.runs("evt_tx_kill", "notify").await, 1);
    let record = db.record_of("shop", "evt_tx_kill").await;
    assert_eq!((record.state, record.takeovers), (EventState::Done, 1));
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    let attempts: Vec<_> = steps.iter().map(|s| (s.state, s.attempts)).collect();
    assert_eq!(attempts, [(StepState::Done, 2), (StepState::Done, 1)]);
    assert_eq!(
        steps[0].output.as_ref().expect("output")["rows_seen"],
        1,
        "the re-run saw no leftover of the killed attempt"
    );
}

/// A worker hands its slot on to the next event while an event's final mark
/// is still being committed (`crates/tickmark-core/src/runner/slots.rs`). Here that mark is
/// held in flight for certain: the test locks the event's row before the
/// step returns, so the mark waits on the lock. Meanwhile the worker (one
/// slot) runs the next event to the end. Then the worker is SIGKILLed with
/// the mark still in flight, and the orphaned statement is ended the way a
/// dead client's would be. The event is finished exactly once: by the
/// worker that took over its expired lease, whose mark is the one on record;
/// the killed worker's mark never applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_worker_killed_while_its_final_mark_is_in_flight() {
    use sqlx::{Connection, Row};

    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let folder = tempfile::tempdir().unwrap();
    let go = folder.path().join("go");
    let handlers = Handlers::new()
        .on(
            "shop",
            "order.settled",
            Handler::new().named_step(
                "settle",
                AnnounceThenAwaitFile {
                    go: Some(go.clone()),
                },
            ),
        )
        .on(
            "shop",
            "order.noted",
            Handler::new().named_step("note", AnnounceThenAwaitFile { go: None }),
        );
    let engine = engine(&db, handlers);
    for (id, kind) in [("evt_final", "order.settled"), ("evt_next", "order.noted")] {
        engine
            .accept(NewEvent::with_id("shop", id, kind, json!({})))
            .await
            .unwrap();
    }

    let mut victim = worker_process(&db, "victim", &["--concurrency", "1"]);
    let mut output = announced::stdout_lines(&mut victim);
    line_starting_with(&mut output, &format!("{STEP_RAN} evt_final 1")).await;

    // The claim has committed and the step is waiting for the go: lock the
    // event's row, then let the step return. Its final mark now waits on
    // this lock.
    let mut locker = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let locker_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut locker)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("SELECT 1 FROM tickmark_events WHERE dedup_key = 'evt_final' FOR UPDATE")
        .execute(&mut locker)
        .await
        .unwrap();
    std::fs::write(&go, b"go").unwrap();

    let blocked_marks = format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE {locker_pid} = ANY(pg_blocking_pids(pid)) AND query LIKE '%tickmark_mark_done_many%'"
    );
    wait::until(
        "the final mark waits on the row lock",
        Duration::from_secs(60),
        || async { db.probe.scalar(&blocked_marks).await == 1 },
    )
    .await;

    // With its one slot handed on, the worker runs the next event to the
    // end while the first event's final mark is still in flight.
    line_starting_with(&mut output, &format!("{STEP_RAN} evt_next 1")).await;
    wait::until(
        "the next event is done",
        Duration::from_secs(60),
        || async {
            let next = db.store.event_find("shop", "evt_next").await.unwrap();
            next.is_some_and(|r| r.state == EventState::Done)
        },
    )
    .await;
    let pending = db.record_of("shop", "evt_final").await;
    assert_eq!(
        (pending.state, pending.next_step),
        (EventState::Running, 0),
        "the first event's final mark has not committed"
    );

    victim.start_kill().expect("SIGKILL");
    let status = victim.wait().await.unwrap();
    assert!(!status.success(), "killed, not exited: {status:?}");
    // A dead client's statement is ended by the server once it notices;
    // end it now (and anything else of the victim's waiting on the lock).
    let ended: Vec<bool> = sqlx::query(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE {locker_pid} = ANY(pg_blocking_pids(pid))"
    ))
    .fetch_all(&mut locker)
    .await
    .unwrap()
    .iter()
    .map(|row| row.get(0))
    .collect();
    assert!(!ended.is_empty() && ended.iter().all(|&e| e), "{ended:?}");
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();

    let stats = engine
        .worker(quick_worker("rescuer"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(
        stats.takeovers, 1,
        "the rescuer took over the expired lease"
    );

    let record = db.record_of("shop", "evt_final").await;
    assert_eq!((record.state, record.takeovers), (EventState::Done, 1));
    assert_eq!(record.lease_owner.as_deref(), Some("rescuer"));
    let steps = db.store.step_status(record.event.seq).await.unwrap();
    let marked: Vec<_> = steps.iter().map(|s| (s.state, s.attempts)).collect();
    assert_eq!(
        marked,
        [(StepState::Done, 2)],
        "one mark on record: the rescuer's, on the second attempt"
    );
    assert_eq!(
        steps[0].output.as_ref().and_then(|o| o.get("attempt")),
        Some(&json!(2)),
        "the killed worker's mark never applied"
    );
    assert_eq!(
        db.probe.runs("evt_final", "settle").await,
        2,
        "the step whose mark was lost ran again, with the same key"
    );
    assert_eq!(db.probe.runs("evt_next", "note").await, 1);
}

/// The next line of the worker's stdout that starts with `prefix`.
async fn line_starting_with(lines: &mut StdoutLines, prefix: &str) -> String {
    announced::line_starting_with(lines, prefix)
        .await
        .unwrap_or_else(|why| panic!("no line starting with {prefix:?} from the worker: {why:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_worker_killed_inside_a_transactional_step() {
    a_worker_killed_inside_a_transactional_step(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_worker_killed_inside_a_transactional_step() {
    a_worker_killed_inside_a_transactional_step(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_worker_killed_in_the_middle_of_step_two() {
    a_worker_killed_in_the_middle_of_step_two(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_worker_killed_in_the_middle_of_step_two() {
    a_worker_killed_in_the_middle_of_step_two(Backend::Postgres).await;
}

/// 50 events × 3 steps shared by several worker processes: every event done,
/// every step marked done exactly once, every effect once, work shared.
///
/// Neither claim depends on how this two-core machine schedules the
/// processes. Nothing is killed here, so a takeover (and with it a second
/// attempt) could only come from a worker starved past its lease: the lease
/// is 30 s, not the 2 s of the crash tests, so that would take a 20 s stall.
/// And every "second" step waits until at least two processes have run a
/// step: a rendezvous that the first process to start cannot pass alone, so
/// the work is shared by construction, and it ends only if another process
/// can claim events while the first holds its leases.
async fn many_processes_share_the_work(backend: Backend, processes: usize) {
    let Some(db) = TestDb::new(backend).await else {
        return;
    };
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("credit", Credit { amount: 1 })
            .named_step(
                "second",
                Record {
                    pause_ms: 20,
                    until_processes: 2,
                    ..Record::default()
                },
            )
            .named_step("third", Record::default()),
    );
    let engine = engine(&db, handlers);
    for n in 0..50 {
        engine
            .accept(NewEvent::with_id(
                "shop",
                format!("evt_{n:02}"),
                "order.paid",
                json!({"n": n}),
            ))
            .await
            .unwrap();
    }
    let children: Vec<Child> = (0..processes)
        .map(|n| {
            worker_process(
                &db,
                &format!("worker-{n}"),
                &["--until-idle", "--lease-ms", "30000"],
            )
        })
        .collect();
    for child in children {
        let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("workers finish")
            .unwrap();
        assert!(output.status.success(), "worker failed: {output:?}");
    }

    let scalar = |sql: &'static str| db.probe.scalar(sql);
    assert_eq!(
        scalar("SELECT count(*) FROM tickmark_events WHERE state = 'done'").await,
        50
    );
    assert_eq!(
        scalar("SELECT count(*) FROM tickmark_steps WHERE state = 'done'").await,
        150
    );
    assert_eq!(
        scalar("SELECT CAST(coalesce(sum(takeovers), 0) AS BIGINT) FROM tickmark_events").await,
        0,
        "no event was taken over"
    );
    assert_eq!(
        scalar("SELECT count(*) FROM tickmark_steps WHERE state = 'done' AND attempts = 1").await,
        150,
        "every step done on its first attempt"
    );
    assert_eq!(scalar("SELECT count(*) FROM test_ledger").await, 50);
    assert_eq!(
        scalar("SELECT count(DISTINCT event_id) FROM test_ledger").await,
        50
    );
    assert_eq!(
        scalar("SELECT count(*) FROM test_step_runs").await,
        100,
        "no step ran twice"
    );
    assert_eq!(
        scalar("SELECT count(*) FROM (SELECT DISTINCT event_id, step FROM test_step_runs) AS runs")
            .await,
        100
    );
    let sharing = scalar("SELECT count(DISTINCT pid) FROM test_step_runs").await;
    assert!(
        sharing >= 2,
        "the processes shared the work ({sharing} did it all)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_four_worker_processes_share_fifty_events() {
    many_processes_share_the_work(Backend::Postgres, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_three_worker_processes_share_fifty_events() {
    many_processes_share_the_work(Backend::Sqlite, 3).await;
}

/// Transient store errors are retried in-process: every connection of the
/// engine is killed by the server while events run, and every event still
/// finishes, each step once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dropped_connections_are_retried_in_process() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let name = format!("tickmark_drop_{}", std::process::id());
    let url = format!("{}&application_name={name}", db.url);
    let store = tickmark::connect(&url).await.unwrap();
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step(
                "first",
                Record {
                    pause_ms: 100,
                    ..Record::default()
                },
            )
            .named_step("second", Credit { amount: 1 })
            .named_step("third", Record::default()),
    );
    let engine = tickmark::Engine::new(store, handlers)
        .unwrap()
        .with_resource(db.probe.clone());
    for n in 0..20 {
        engine
            .accept(NewEvent::with_id(
                "shop",
                format!("evt_{n:02}"),
                "order.paid",
                json!({}),
            ))
            .await
            .unwrap();
    }
    let worker = engine
        .worker(quick_worker("survivor"))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let running = tokio::spawn(worker.run_until_idle());
    stats.wait_for(|s| s.steps_done >= 5).await.unwrap();
    let killed = db
        .probe
        .scalar(&format!(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{name}') AS killed"
        ))
        .await;
    assert!(killed >= 1, "connections were killed");
    let stats = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the worker recovers")
        .unwrap()
        .unwrap();
    assert_eq!(stats.events_done, 20);
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE state = 'done'")
            .await,
        20
    );
    assert_eq!(
        db.probe.scalar("SELECT count(*) FROM test_ledger").await,
        20,
        "credits once each"
    );
    assert_eq!(
        db.probe
            .scalar("SELECT count(DISTINCT event_id) FROM test_ledger")
            .await,
        20
    );
}
