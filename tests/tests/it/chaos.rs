//! The chaos run, short (`docs/chaos.md`): the `chaos` binary (debug build)
//! drives real `tickmark-chaos-node` processes while it SIGKILLs them every
//! 1–3 s, freezes one past its lease and restarts PostgreSQL once; it exits 0
//! only when nothing was lost, nothing was credited twice, and every re-run
//! was absorbed (guarantees 3, 5, 6 and 9 under faults).
//!
//! PostgreSQL runs on a throwaway cluster of the run's own (`PgCluster`),
//! never the machine's shared server; SQLite shares one file between the
//! nodes, with kills only.

use std::time::{Duration, Instant};

use crate::chaos_support::run_chaos;

/// Run `chaos` with `args` within `limit`; assert it passed and return its
/// JSON line.
async fn chaos(args: &[&str], limit: Duration) -> serde_json::Value {
    let started = Instant::now();
    let run = run_chaos(args, limit).await;
    assert!(
        run.passed,
        "chaos {args:?} failed after {:?}:\n{}",
        started.elapsed(),
        run.output
    );
    assert_eq!(run.json["ok"], true, "{}", run.json);
    run.json
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_300_events_3_nodes_kills_a_zombie_and_a_database_restart() {
    if tickmark_tests::db::postgres_url().is_none() {
        return;
    }
    let json = chaos(
        &[
            "--events",
            "300",
            "--nodes",
            "3",
            "--duration",
            "20",
            "--backend",
            "postgres",
        ],
        Duration::from_secs(150),
    )
    .await;
    assert_eq!(json["events_accepted"], 300);
    assert_eq!(json["events_done"], 300);
    assert!(json["kills"].as_u64().unwrap() >= 3, "{json}");
    assert_eq!(json["zombies"], 1, "{json}");
    assert!(json["zombie_fenced"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["db_restarts"], 1, "{json}");
    assert!(json["answers_503"].as_u64().unwrap() > 0, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_150_events_2_nodes_on_one_file_with_kills() {
    let json = chaos(
        &[
            "--events",
            "150",
            "--nodes",
            "2",
            "--duration",
            "12",
            "--backend",
            "sqlite",
        ],
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(json["events_accepted"], 150);
    assert_eq!(json["events_done"], 150);
    assert!(json["kills"].as_u64().unwrap() >= 2, "{json}");
}
