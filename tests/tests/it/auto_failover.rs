//! Failover decided by a real HA manager, pg_auto_failover (docs/deploying.md):
//! a monitor and two data nodes of the test's own ([`Formation`]: temp dirs,
//! free loopback ports, never the machine's shared server). tickmark gets
//! the formation's URL as `pg_autoctl show uri` gives it (both nodes,
//! `target_session_attrs=read-write`). The test kills the primary's machine
//! (its keeper and PostgreSQL, SIGKILL) and promotes nothing: the monitor
//! notices, the standby's keeper promotes it.
//!
//! - a receiver answers 503 meanwhile, then 200 on the promoted standby in
//!   the same process; what was answered 200 before the kill is there; the
//!   old primary's keeper, started again, rejoins as a standby, and the
//!   process stays on the new primary;
//! - under the chaos run's steady stream of deliveries to several payments
//!   nodes (`chaos --failover auto`), nothing acknowledged is lost, nothing
//!   is credited twice, and once the old primary has rejoined it holds
//!   exactly the new primary's rows: no write of tickmark landed on it.
//!
//! They need Debian's `pg-auto-failover-cli` and
//! `postgresql-<major>-auto-failover` packages (scripts/setup installs them)
//! and PostgreSQL's server binaries: without them they skip, recorded, or
//! fail under `CI=true`.

use std::sync::Arc;
use std::time::Duration;

use crate::chaos_support::run_chaos;
use crate::receiver_support::{assert_answer, now, record_everything, Kind};
use sqlx::Connection;
use tickmark::store::postgres::{PostgresOptions, PostgresStore};
use tickmark::{Engine, Receiver, StoreError};
use tickmark_tests::conformance::quick_worker;
use tickmark_tests::http_client::oneshot;
use tickmark_tests::pg_auto_failover::Formation;
use tickmark_tests::Probe;
use tokio::time::Instant;

const OPTIONS: PostgresOptions = PostgresOptions {
    max_connections: 4,
    acquire_timeout: Duration::from_secs(2),
};

/// How long the formation may take to promote the standby and to take the
/// old primary back (about 5 s and 2 s with the test's monitor settings).
const WITHIN: Duration = Duration::from_secs(90);

/// The port of the server the store's pool is connected to, and whether it
/// is in recovery.
async fn server_of(store: &PostgresStore) -> (i32, bool) {
    sqlx::query_as("SELECT inet_server_port(), pg_is_in_recovery()")
        .fetch_one(store.pool())
        .await
        .expect("ask the server who it is")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_auto_failover_promotes_the_standby_and_the_receiver_follows_it_without_a_restart() {
    tickmark_tests::db::init_tracing();
    let Some(mut formation) = Formation::start_or_skip().await else {
        return;
    };
    let primary = formation.primary().await.expect("the monitor's primary");
    assert_eq!(primary, 0, "node1 is created first and becomes the primary");
    let standby = 1;
    // One standby: number_sync_standbys stays 0, and the primary still waits
    // for the standby (`ANY 1 (…)`), so nothing answered 200 can be lost.
    assert_eq!(formation.number_sync_standbys().await.unwrap(), 0);
    let names = formation
        .synchronous_standby_names(primary, WITHIN)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(names.starts_with("ANY 1 ("), "{names}");

    drop(Probe::connect(&formation.node_url(primary)).await);
    let store = PostgresStore::connect_with(&formation.url(), OPTIONS)
        .await
        .expect("connect through the formation's URL");
    assert_eq!(
        server_of(&store).await,
        (i32::from(formation.port(primary)), false)
    );
    let probe = Probe::Postgres(store.pool().clone());
    let engine = Engine::new(Arc::new(store.clone()), record_everything())
        .expect("handlers")
        .with_resource(probe.clone());
    let router = Receiver::new(engine.clone())
        .source("stripe", Kind::Stripe.provider())
        .expect("a valid source")
        .router();
    let stripe = |id: &str| Kind::Stripe.delivery(Kind::Stripe.secret(), id, now());

    assert_answer(
        &oneshot(&router, &stripe("evt_before")).await,
        200,
        "new",
        None,
    );

    let killed_at = formation
        .kill_node(primary)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let during = oneshot(&router, &stripe("evt_during")).await;
    assert_answer(&during, 503, "error", Some("store_unavailable"));
    assert!(during.header("retry-after").is_some(), "a Retry-After");

    // No promotion by hand: the provider retries until pg_auto_failover has
    // promoted the standby and the process has found it.
    let deadline = Instant::now() + WITHIN;
    let accepted = loop {
        let reply = oneshot(&router, &stripe("evt_during")).await;
        if reply.status == 200 {
            break reply;
        }
        assert_answer(&reply, 503, "error", Some("store_unavailable"));
        assert!(
            Instant::now() < deadline,
            "still 503 {WITHIN:?} after the kill\n{}",
            formation.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_answer(&accepted, 200, "new", None);
    eprintln!("accepted again {:?} after the kill", killed_at.elapsed());
    assert_eq!(
        server_of(&store).await,
        (i32::from(formation.port(standby)), false)
    );

    // The old primary comes back: it rejoins as a standby, and the process
    // stays where the writes are.
    let restarted_at = Instant::now();
    formation
        .restart_keeper(primary)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    formation
        .wait_until_rejoined(primary, WITHIN)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "the old primary rejoined as a standby {:?} after its keeper restarted",
        restarted_at.elapsed()
    );
    let mut on_old = sqlx::PgConnection::connect(&formation.node_url(primary))
        .await
        .expect("connect to the old primary");
    let refused = sqlx::query("CREATE TABLE written_on_the_old_primary (n INT)")
        .execute(&mut on_old)
        .await
        .expect_err("the old primary is a standby now");
    assert!(StoreError::from(refused).is_transient());
    assert_answer(
        &oneshot(&router, &stripe("evt_after_rejoin")).await,
        200,
        "new",
        None,
    );
    assert_answer(
        &oneshot(&router, &stripe("evt_before")).await,
        200,
        "duplicate",
        None,
    );
    assert_eq!(
        server_of(&store).await,
        (i32::from(formation.port(standby)), false)
    );

    let stats = engine
        .worker(quick_worker("after-auto-failover"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .expect("worker");
    assert_eq!(stats.events_done, 3);
    for id in ["evt_before", "evt_during", "evt_after_rejoin"] {
        assert_eq!(probe.runs(id, "first").await, 1, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_auto_failover_loses_no_acknowledged_delivery_and_writes_nothing_to_the_old_primary()
{
    if let Some(missing) = tickmark_tests::pg_auto_failover::missing() {
        // Recorded (or a failure under CI=true), with what to install.
        tickmark_tests::skip::record(&tickmark_tests::skip::current_test(), &missing);
        return;
    }
    let run = run_chaos(
        &[
            "--failover",
            "auto",
            "--events",
            "300",
            "--nodes",
            "3",
            "--duration",
            "20",
            // Drained in a fraction of a second when the nodes follow the
            // new primary; bounded so that a broken switch fails within
            // nextest's limit with the run's own report.
            "--drain",
            "30",
        ],
        Duration::from_secs(170),
    )
    .await;
    let json = &run.json;
    assert!(run.passed && json["ok"] == true, "{json}\n{}", run.output);
    let failover = &json["failover"];
    assert!(
        failover["replication"]
            .as_str()
            .is_some_and(|r| r.starts_with("auto (pg_auto_failover; ANY 1 (")),
        "a synchronous standby: {json}"
    );
    assert!(
        failover["acked_before_kill"].as_u64().unwrap() > 0,
        "deliveries were acknowledged before the kill: {json}"
    );
    assert_eq!(failover["acked_lost"], 0, "{json}");
    assert!(
        failover["kill_to_accepted_ms"].as_u64().is_some(),
        "deliveries were accepted again after the kill: {json}"
    );
    let rejoin = &failover["rejoin"];
    assert_eq!(rejoin["in_recovery"], true, "{json}");
    assert_eq!(
        rejoin["old_primary_timeline"], rejoin["new_primary_timeline"],
        "{json}"
    );
    assert_eq!(rejoin["rows_match"], true, "{json}");
    assert_eq!(rejoin["events_on_old_primary"], 300, "{json}");
    assert!(json["answers_503"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["events_accepted"], 300, "{json}");
    assert_eq!(json["events_done"], 300, "{json}");
    assert_eq!(json["ledger_mismatches"], 0, "{json}");
    assert_eq!(json["invoices"], 300, "{json}");
    assert_eq!(json["receipt_keys"], 300, "{json}");
}
