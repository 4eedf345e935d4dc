//! Guarantee 9: when the database is unreachable the receiver answers 503
//! with `Retry-After` and writes nothing, so the provider retries; once the
//! database is back, the retry is accepted and its steps run once.
//!
//! The database is a throwaway cluster of this test's own
//! ([`PgCluster`]), never the machine's shared PostgreSQL. Both tests need
//! PostgreSQL's server binaries (`initdb`, `pg_ctl` under
//! `/usr/lib/postgresql/<version>/bin`, Debian's `postgresql` package):
//! without them they skip, recorded and reported by `scripts/test`, or fail
//! under `CI=true`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::receiver_support::{assert_answer, now, record_everything, Kind};
use tickmark::store::postgres::{PostgresOptions, PostgresStore};
use tickmark::{Engine, Receiver};
use tickmark_tests::conformance::quick_worker;
use tickmark_tests::http_client::{oneshot, HttpClient, LoopbackServer, Outgoing, Reply};
use tickmark_tests::pg_cluster::{PgCluster, StopMode};
use tickmark_tests::Probe;

/// Longest acceptable wait for a 503: providers time out after about 10 s.
const ANSWER_WITHIN: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_503_then_the_providers_retry_is_accepted_and_runs() {
    tickmark_tests::db::init_tracing();
    let Some(mut cluster) = PgCluster::start_or_skip().await else {
        return;
    };
    let url = cluster.url();
    let options = PostgresOptions {
        max_connections: 4,
        acquire_timeout: Duration::from_secs(2),
    };
    let store = PostgresStore::connect_with(&url, options)
        .await
        .expect("store on the throwaway cluster");
    let probe = Probe::connect(&url).await;
    let engine = Engine::new(Arc::new(store), record_everything())
        .expect("handlers")
        .with_resource(probe.clone());
    let router = Receiver::new(engine.clone())
        .source("stripe", Kind::Stripe.provider())
        .expect("a valid source")
        .router();
    let server = LoopbackServer::start(router.clone()).await;
    let client = HttpClient::new();

    // Once in-process after a crash-like stop, once over a socket after a clean one.
    for (round, mode) in [StopMode::Immediate, StopMode::Fast]
        .into_iter()
        .enumerate()
    {
        let send = |request: Outgoing| {
            let (router, client, addr) = (router.clone(), client.clone(), server.addr);
            async move {
                if round == 0 {
                    oneshot(&router, &request).await
                } else {
                    client.send(addr, &request).await.expect("an answer")
                }
            }
        };
        let before =
            Kind::Stripe.delivery(Kind::Stripe.secret(), &format!("evt_before_{round}"), now());
        assert_answer(&send(before).await, 200, "new", None);

        cluster.stop(mode).await.expect("stop the cluster");
        let during =
            Kind::Stripe.delivery(Kind::Stripe.secret(), &format!("evt_during_{round}"), now());
        let started = Instant::now();
        let reply: Reply = send(during.clone()).await;
        assert_answer(&reply, 503, "error", Some("store_unavailable"));
        let retry_after: u64 = reply
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .expect("a Retry-After in seconds");
        assert!(retry_after >= 1);
        assert!(
            started.elapsed() < ANSWER_WITHIN,
            "the 503 took {:?}",
            started.elapsed()
        );
        let body = String::from_utf8_lossy(&reply.body).to_lowercase();
        assert!(
            !body.contains("sqlx") && !body.contains("connection refused"),
            "internals stay in the log: {body}"
        );

        cluster
            .start_again()
            .await
            .expect("start the cluster again");
        // The provider's retry of the same delivery.
        assert_answer(&send(during.clone()).await, 200, "new", None);
        assert_answer(&send(during).await, 200, "duplicate", None);
    }

    let stats = engine
        .worker(quick_worker("outage"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .expect("worker");
    assert_eq!(stats.events_done, 4);
    for id in [
        "evt_before_0",
        "evt_during_0",
        "evt_before_1",
        "evt_during_1",
    ] {
        assert_eq!(probe.runs(id, "first").await, 1, "{id}");
    }
    assert_eq!(
        probe.scalar("SELECT count(*) FROM tickmark_events").await,
        4,
        "nothing was written for the refused deliveries"
    );
    server.shutdown().await;
}

/// The cluster support itself: a stopped cluster refuses connections, a
/// restarted one serves the same data on the same URL, and dropping it
/// removes its directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throwaway_cluster_stops_restarts_and_cleans_up() {
    use sqlx::Connection;
    let Some(mut cluster) = PgCluster::start_or_skip().await else {
        return;
    };
    let url = cluster.url();
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("CREATE TABLE kept (n INT)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO kept VALUES (7)")
        .execute(&mut conn)
        .await
        .unwrap();
    cluster.restart(StopMode::Immediate).await.expect("restart");
    assert!(
        sqlx::query("SELECT 1").execute(&mut conn).await.is_err(),
        "old connections are gone"
    );
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("reconnect");
    let n: i32 = sqlx::query_scalar("SELECT n FROM kept")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 7);
    cluster.stop(StopMode::Fast).await.expect("stop");
    assert!(sqlx::PgConnection::connect(&url).await.is_err());
    assert!(!cluster.is_running());
    cluster.start_again().await.expect("start again");
    let data = cluster.data_dir();
    assert!(data.exists());
    drop(cluster);
    assert!(!data.exists(), "dropping the cluster removes its files");
}
