//! The soak's short version, for CI (the hour-long run is `scripts/soak`,
//! `docs/performance.md`): a minute of signed deliveries, 20 % redeliveries
//! (half of them late: older than the retention, their events pruned), with
//! `tickmark prune --older-than 10s --dedup-window 40s --i-know` every 5 s.
//! It asserts correctness only, never speed: no redelivery answered `new`,
//! late ones included; no effect applied twice; every accepted event
//! finished; prune ran and deleted; the CSV, the plot and the summary written.

use std::process::Command;

use tickmark_tests::cargo_bin::cargo_bin;
use tickmark_tests::db::postgres_url;

#[test]
fn a_short_soak_answers_every_redelivery_as_a_duplicate_and_applies_every_effect_once() {
    let Some(url) = postgres_url() else {
        return;
    };
    let tickmark = cargo_bin("tickmark", "tickmark");
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_soak"))
        .args(["--minutes", "1", "--rate", "40", "--late-share", "0.5"])
        .args(["--retention", "10s", "--dedup-window", "40s"])
        .args(["--prune-every", "5s", "--sample-every", "5s"])
        .arg("--tickmark-bin")
        .arg(&tickmark)
        .arg("--out")
        .arg(out.path())
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "warn,soak=info")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "soak failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stderr.contains("soak started") && !stderr.contains('\x1b'),
        "its log, written to a pipe, is there and has no colour codes:\n{stderr}"
    );
    assert!(stdout.contains("correctness: PASSED"), "{stdout}");

    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap()).unwrap();
    let c = &summary["correctness"];
    let n = |key: &str| {
        c[key]
            .as_i64()
            .unwrap_or_else(|| panic!("{key} in {summary:#}"))
    };
    // Every new event once; every redelivery a duplicate, late ones too.
    assert!(n("accepted") > 500, "{summary:#}");
    assert!(n("redeliveries") > 100, "{summary:#}");
    assert_eq!(n("duplicates_answered_new"), 0, "{summary:#}");
    assert_eq!(n("first_deliveries_answered_duplicate"), 0, "{summary:#}");
    assert!(n("late_redeliveries") > 0, "{summary:#}");
    assert_eq!(
        n("late_answered_duplicate"),
        n("late_redeliveries"),
        "{summary:#}"
    );
    assert_eq!(n("lost"), 0, "{summary:#}");
    // Every effect exactly once; every event finished, and done.
    assert_eq!(n("double_effects"), 0, "{summary:#}");
    assert_eq!(n("effect_rows"), n("accepted"), "{summary:#}");
    assert_eq!(n("finished"), n("accepted"), "{summary:#}");
    assert_eq!(n("unfinished"), 0, "{summary:#}");
    assert_eq!(n("not_done"), 0, "{summary:#}");
    // Prune ran on its schedule and deleted events, leaving tombstones.
    assert!(n("prune_runs") >= 5, "{summary:#}");
    assert_eq!(n("prune_failures"), 0, "{summary:#}");
    assert!(n("pruned") > 0, "{summary:#}");
    assert!(c["tombstones_at_end"].is_i64(), "{summary:#}");

    // The time series: a row per sample, and the plot.
    let samples = summary["samples"].as_u64().unwrap();
    assert!(samples >= 10, "{summary:#}");
    let csv = std::fs::read_to_string(out.path().join("soak.csv")).unwrap();
    assert_eq!(csv.lines().count() as u64, samples + 1, "{csv}");
    assert!(csv.starts_with("t_s,phase,"), "{csv}");
    assert!(csv
        .lines()
        .next()
        .unwrap()
        .contains("tickmark_events_bytes"));
    let svg = std::fs::read_to_string(out.path().join("soak.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.contains("tickmark_events") && svg.contains("ack p99"));
}
