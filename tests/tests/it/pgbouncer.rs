//! The PostgreSQL store through PgBouncer (docs/deploying.md, "PgBouncer,
//! transaction mode" and "PgBouncer, session mode"): each test starts a
//! PgBouncer of its own in front of the shared server
//! (`tickmark_tests::pgbouncer`), with fewer server connections than the
//! store has clients, so that clients share them. Skipped (recorded; failed
//! under `CI=true`) when PgBouncer is not installed: `scripts/setup`
//! installs it.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::{Connection, PgConnection};
use tickmark::store::postgres::PostgresStore;
use tickmark::{Handler, Handlers, NewEvent};
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::pgbouncer::{PgBouncer, PoolMode, SERVER_CONNECTIONS};
use tickmark_tests::test_steps::{Credit, Record};
use tickmark_tests::Probe;
use tickmark_tests::{wait, TestDb};
use tokio::process::Command;

/// The main conformance cases through PgBouncer in transaction mode, with
/// `listen_url` past it for wake-ups.
mod transaction_mode {
    use tickmark_tests::conformance::{
        admin, fencing, flow, inbox, portable_sql, running, tombstones, waits,
    };
    use tickmark_tests::pgbouncer::PoolMode;

    tickmark_tests::per_backend!(db from tickmark_tests::TestDb::through_pgbouncer(PoolMode::Transaction, true, &[]) => [
        inbox::concurrent_duplicate_accepts_yield_one_new,
        inbox::a_duplicate_delivery_never_reruns_a_step,
        inbox::events_without_an_id_are_deduplicated_by_body_hash,
        inbox::an_event_without_handler_is_recorded_as_ignored,
        inbox::a_delayed_event_is_not_claimed_before_its_time,
        running::steps_run_in_order_with_keys_and_earlier_outputs,
        running::a_transactional_steps_effect_commits_with_its_mark,
        running::a_crash_after_a_mark_resumes_at_the_first_unfinished_step,
        running::an_interrupted_step_is_shown_then_rerun_with_the_same_key,
        running::an_accepted_event_wakes_an_idle_worker_without_polling,
        running::a_claim_leases_many_events_at_once,
        running::a_step_longer_than_its_lease_keeps_it_by_heartbeat,
        fencing::a_taken_over_lease_can_neither_mark_nor_heartbeat,
        fencing::a_retried_mark_is_confirmed_only_while_its_lease_holds,
        fencing::an_expired_lease_cannot_mark_even_before_a_takeover,
        fencing::a_refused_transactional_mark_rolls_back_the_steps_writes,
        fencing::a_worker_that_loses_its_lease_stops_its_step,
        flow::racing_claims_never_exceed_a_keys_limit,
        flow::racing_accepts_of_one_key_leave_one_event_waiting,
        flow::workers_on_one_database_share_each_bucket,
        waits::a_waiting_event_holds_nothing_until_a_match_wakes_it,
        waits::accepts_racing_the_start_of_waits_lose_no_wake_up,
        tombstones::an_accept_racing_the_prune_of_its_key_is_a_duplicate,
        tombstones::a_batch_mixing_pruned_and_new_keys_answers_each,
        admin::retry_resumes_a_dead_event_at_its_failed_step_and_wakes_a_worker,
        portable_sql::a_transactional_step_written_once_runs_on_either_backend,
    ]);
}

/// Through a transaction pooler the session default cannot be set, and the
/// role defaults to REPEATABLE READ: the store's transactions set their own
/// level, so the cases that need READ COMMITTED still pass.
mod transaction_mode_repeatable_read {
    use tickmark_tests::conformance::{flow, tombstones, waits};
    use tickmark_tests::pgbouncer::PoolMode;

    tickmark_tests::per_backend!(db from tickmark_tests::TestDb::through_pgbouncer(
            PoolMode::Transaction,
            true,
            &[("default_transaction_isolation", "repeatable read")]) => [
        tombstones::an_accept_racing_the_prune_of_its_key_is_a_duplicate,
        flow::racing_claims_never_exceed_a_keys_limit,
        waits::accepts_racing_the_start_of_waits_lose_no_wake_up,
    ]);
}

/// Session mode changes nothing: `LISTEN` and cached statements work.
mod session_mode {
    use tickmark_tests::conformance::{fencing, inbox, running, tombstones};
    use tickmark_tests::pgbouncer::PoolMode;

    tickmark_tests::per_backend!(db from tickmark_tests::TestDb::through_pgbouncer(PoolMode::Session, false, &[]) => [
        inbox::concurrent_duplicate_accepts_yield_one_new,
        inbox::a_duplicate_delivery_never_reruns_a_step,
        running::steps_run_in_order_with_keys_and_earlier_outputs,
        running::a_transactional_steps_effect_commits_with_its_mark,
        running::an_accepted_event_wakes_an_idle_worker_without_polling,
        running::a_claim_leases_many_events_at_once,
        fencing::a_taken_over_lease_can_neither_mark_nor_heartbeat,
        fencing::a_refused_transactional_mark_rolls_back_the_steps_writes,
        tombstones::an_accept_racing_the_prune_of_its_key_is_a_duplicate,
    ]);
}

fn credit_render_notify() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new()
            .named_step("credit", Credit { amount: 1 })
            .named_step(
                "render",
                Record {
                    pause_ms: 100,
                    ..Record::default()
                },
            )
            .named_step("notify", Record::default()),
    )
}

/// Without `listen_url` the store does not listen through a transaction
/// pooler; an idle worker finds an event accepted meanwhile by polling,
/// within its polling interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listen_url_an_idle_worker_finds_new_events_by_polling() {
    let Some(db) = TestDb::through_pgbouncer(PoolMode::Transaction, false, &[]).await else {
        return;
    };
    let handlers = || {
        Handlers::new().on(
            "shop",
            "order.paid",
            Handler::new().named_step("first", Record::default()),
        )
    };
    let worker = engine(&db, handlers())
        .worker(quick_worker("poller").with_poll_every(Duration::from_millis(300)))
        .expect("valid worker settings");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let accepter = engine(&db, handlers());
    accepter
        .accept(NewEvent::with_id(
            "shop",
            "evt_polled",
            "order.paid",
            json!({}),
        ))
        .await
        .unwrap();
    wait::until(
        "the polling worker ran the event",
        Duration::from_secs(20),
        || async { db.probe.runs("evt_polled", "first").await == 1 },
    )
    .await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(
        db.probe
            .scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE usename = current_user AND query LIKE 'LISTEN%'"
            )
            .await,
        0,
        "nothing listens"
    );
}

/// Worker processes through a transaction pooler, one SIGKILLed while its
/// steps run: a rescuer (through the pooler too) finishes the rest; every
/// event is done, its transactional credit applied exactly once, and only
/// steps that were in flight at the kill ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_killed_mid_stream_through_a_transaction_pooler_loses_nothing() {
    let Some(db) = TestDb::through_pgbouncer(PoolMode::Transaction, true, &[]).await else {
        return;
    };
    const EVENTS: i64 = 30;
    let engine = engine(&db, credit_render_notify());
    for n in 0..EVENTS {
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
    let pooled_url = db.pooled_url().expect("a store through PgBouncer");
    let mut victim = Command::new(env!("CARGO_BIN_EXE_tickmark-test-worker"))
        .args(["--database-url", &pooled_url, "--probe-url", &db.url])
        .args([
            "--name",
            "victim",
            "--lease-ms",
            "2000",
            "--concurrency",
            "4",
        ])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the test worker");
    wait::until(
        "the victim has run a third of the events' second steps",
        Duration::from_secs(60),
        || async { db.probe.runs_of("render").await >= EVENTS / 3 },
    )
    .await;
    victim.start_kill().expect("SIGKILL");
    let status = victim.wait().await.unwrap();
    assert!(!status.success(), "killed, not exited: {status:?}");
    let unfinished = db
        .probe
        .scalar("SELECT count(*) FROM tickmark_events WHERE state <> 'done'")
        .await;
    assert!(unfinished > 0, "the kill came mid-stream");
    // Running or leased ahead (a claim leases more than it starts at once).
    let held = db
        .probe
        .scalar("SELECT count(*) FROM tickmark_events WHERE state = 'running' AND lease_owner = 'victim'")
        .await;

    let stats = engine
        .worker(quick_worker("rescuer"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();

    let scalar = |sql: &'static str| db.probe.scalar(sql);
    assert_eq!(
        scalar("SELECT count(*) FROM tickmark_events WHERE state = 'done'").await,
        EVENTS
    );
    assert_eq!(
        scalar("SELECT count(*) FROM tickmark_steps WHERE state = 'done'").await,
        3 * EVENTS
    );
    assert_eq!(scalar("SELECT count(*) FROM test_ledger").await, EVENTS);
    assert_eq!(
        scalar("SELECT count(DISTINCT event_id) FROM test_ledger").await,
        EVENTS,
        "every credit applied exactly once"
    );
    let reruns = scalar("SELECT count(*) FROM test_step_runs").await - 2 * EVENTS;
    let taken_over =
        scalar("SELECT CAST(coalesce(sum(takeovers), 0) AS BIGINT) FROM tickmark_events").await;
    assert_eq!(taken_over, i64::try_from(stats.takeovers).unwrap());
    assert!(
        (0..=taken_over).contains(&reruns),
        "only steps in flight at the kill re-ran: {reruns} re-runs, {taken_over} takeovers"
    );
    assert!(
        (1..=held).contains(&taken_over),
        "the events the victim held were taken over, and no others: {taken_over} of {held}"
    );
}

/// The application's own statements on tickmark's database go through a
/// transaction pooler on `PostgresStore::executor()`: many at once, on
/// fewer server connections than clients, each answered with its own
/// parameters, and a transaction of the application's commits as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_own_queries_run_through_a_transaction_pooler_on_the_executor() {
    let Some(db) = TestDb::through_pgbouncer(PoolMode::Transaction, false, &[]).await else {
        return;
    };
    let store = tickmark::store::postgres::PostgresStore::connect(
        &db.pooled_url().expect("through PgBouncer"),
    )
    .await
    .unwrap();
    assert!(store.executor().pinned());
    sqlx::query("CREATE TABLE app_notes (n INT PRIMARY KEY, doubled INT NOT NULL)")
        .execute(store.executor())
        .await
        .unwrap();
    let mut writes = tokio::task::JoinSet::new();
    for n in 0..64_i32 {
        let store = store.clone();
        writes.spawn(async move {
            let doubled: i32 = sqlx::query_scalar(
                "INSERT INTO app_notes (n, doubled) VALUES ($1, $1 * 2) RETURNING doubled",
            )
            .bind(n)
            .fetch_one(store.executor())
            .await
            .unwrap();
            assert_eq!(doubled, n * 2, "answered with its own parameters");
        });
    }
    while let Some(written) = writes.join_next().await {
        written.unwrap();
    }
    let mut tx = store.executor().begin().await.unwrap();
    sqlx::query("UPDATE app_notes SET doubled = 0 WHERE n < $1")
        .bind(10_i32)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("DELETE FROM app_notes WHERE n >= $1")
        .bind(60_i32)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        db.probe
            .scalar("SELECT count(*) FROM app_notes WHERE doubled = 0")
            .await,
        10
    );
    assert_eq!(db.probe.scalar("SELECT count(*) FROM app_notes").await, 60);
}

/// What cannot work is refused when connecting, before any connection:
/// `listen_url` without a transaction pooler, a transaction pooler with a
/// host list or `target_session_attrs`, an unknown pooler mode.
#[tokio::test]
async fn a_pooler_setting_that_cannot_work_is_refused_with_its_reason() {
    for (url, says) in [
        (
            "postgres://u@127.0.0.1:1/db?listen_url=postgres%3A%2F%2Fu%40db%2Fdb",
            "listen_url is for pooler=transaction",
        ),
        (
            "postgres://u@127.0.0.1:1/db?pooler=session&listen_url=postgres%3A%2F%2Fdb",
            "listen_url is for pooler=transaction",
        ),
        (
            "postgres://u@127.0.0.1:1,127.0.0.1:2/db?pooler=transaction",
            "takes the pooler's one address",
        ),
        (
            "postgres://u@127.0.0.1:1/db?pooler=transaction&target_session_attrs=read-write",
            "takes the pooler's one address",
        ),
        (
            "postgres://u@127.0.0.1:1/db?pooler=statement",
            "pooler=statement is not supported",
        ),
    ] {
        let error = tickmark::store::postgres::PostgresStore::connect(url)
            .await
            .expect_err(url)
            .to_string();
        assert!(error.contains(says), "{url}: {error}");
    }
}

/// A migration that fails through a transaction pooler holds no lock once
/// it has failed, and the next start, the cause removed, migrates at once.
/// (sqlx's migrator takes a session-level advisory lock, which neither a
/// rollback nor the client's disconnection releases on a server connection
/// the pooler keeps: the next start, on another server connection, waited
/// in `pg_advisory_lock` for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_migration_through_a_transaction_pooler_leaves_no_lock_behind() {
    let Some(bouncer) = PgBouncer::start(PoolMode::Transaction, &[]).await else {
        return;
    };
    let direct = Probe::connect(bouncer.direct_url()).await;
    // The first migration creates this table, so it fails.
    direct
        .execute("CREATE TABLE tickmark_events (squatter INT)")
        .await;
    let error = PostgresStore::connect(&bouncer.url(false))
        .await
        .expect_err("the first migration fails")
        .to_string();
    assert!(error.contains("tickmark_events"), "{error}");

    wait::until(
        "no server connection of the pooler holds an advisory lock",
        Duration::from_secs(10),
        || async {
            direct
                .scalar(
                    "SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
                     WHERE l.locktype = 'advisory' AND a.usename = current_user",
                )
                .await
                == 0
        },
    )
    .await;

    direct.execute("DROP TABLE tickmark_events").await;
    let store = tokio::time::timeout(
        Duration::from_secs(20),
        PostgresStore::connect(&bouncer.url(false)),
    )
    .await
    .unwrap_or_else(|_| panic!("the next start hung\n{}", bouncer.log()))
    .expect("the next start migrates");
    assert!(store.executor().pinned());
    assert!(
        direct
            .scalar("SELECT count(*) FROM tickmark_migrations WHERE success")
            .await
            >= 1
    );
}

/// Through a transaction pooler, a URL without `pooler=transaction` fails
/// at start-up, where sqlx's prepared statements meet those that other
/// clients left on the shared server connections; the error says what to
/// add to the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pooler_transaction_the_start_up_error_says_to_add_it() {
    let Some(bouncer) = PgBouncer::start(PoolMode::Transaction, &[]).await else {
        return;
    };
    let url = bouncer.url_without_pooler();
    // Earlier clients (another process of the application, or one that
    // exited) left a `sqlx_s_1` on every server connection: as many clients
    // at once as the pooler has servers, each in a transaction, so each on
    // a server of its own.
    let all_in = Arc::new(tokio::sync::Barrier::new(SERVER_CONNECTIONS as usize));
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..SERVER_CONNECTIONS {
        let (url, all_in) = (url.clone(), all_in.clone());
        clients.spawn(async move {
            let mut conn = PgConnection::connect(&url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let one: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            assert_eq!(one, 1);
            all_in.wait().await;
            tx.commit().await.unwrap();
            let _ = conn.close().await;
        });
    }
    while let Some(client) = clients.join_next().await {
        client.unwrap();
    }

    let error = PostgresStore::connect(&url)
        .await
        .expect_err("sqlx's prepared statements collide through a transaction pooler")
        .to_string();
    for says in [
        r#"prepared statement "sqlx_s_1" already exists"#,
        "pooler=transaction",
        "docs/deploying.md",
    ] {
        assert!(error.contains(says), "the error must say `{says}`: {error}");
    }
}
