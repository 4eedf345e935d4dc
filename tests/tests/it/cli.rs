//! The `tickmark` command line, run as a real process against a real
//! database of each backend: tables for people, `--json` parsed back, the
//! audit trail, prune's safety check, and the exit codes.
//!
//! The binary is found through Cargo ([`tickmark_tests::cargo_bin`]), which
//! builds it first when it is missing.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tickmark::{EventState, Handler, Handlers, NewEvent, Step, StepContext, StepError, StepResult};
use tickmark_driver::store::ClaimParams;
use tickmark_tests::conformance::admin::{age, broken_second, three_steps};
use tickmark_tests::conformance::{engine, fair_share, order_paid, quick_worker};
use tickmark_tests::test_steps::{Record, WaitForCancel};
use tickmark_tests::{wait, TestDb};
use tokio_util::sync::CancellationToken;

/// The `tickmark` binary, built by Cargo if needed (it belongs to another
/// package, so Cargo does not build it for this test on its own).
fn binary() -> PathBuf {
    tickmark_tests::cargo_bin("tickmark", "tickmark")
}

/// What one run of `tickmark` did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:?}"))
    }

    #[track_caller]
    fn ok(self) -> Self {
        assert_eq!(self.code, 0, "expected success: {self:?}");
        self
    }
}

/// Run `tickmark --database-url <db> ARGS…` as `tester@testhost`.
async fn tickmark(db: &TestDb, args: &[&str]) -> Run {
    let mut all = vec!["--database-url", db.url.as_str()];
    all.extend_from_slice(args);
    run(&all).await
}

/// Run `tickmark ARGS…` with no `DATABASE_URL` in its environment.
async fn run(args: &[&str]) -> Run {
    let output = tokio::process::Command::new(binary())
        .args(args)
        .env_remove("DATABASE_URL")
        .env("USER", "tester")
        .env("HOSTNAME", "testhost")
        .output()
        .await
        .expect("run tickmark");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn seq(db: &TestDb, id: &str) -> String {
    db.store
        .event_find("shop", id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("event {id}"))
        .event
        .seq
        .to_string()
}

async fn run_until_idle(db: &TestDb, handlers: Handlers) {
    engine(db, handlers)
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap();
}

/// An event claimed by `worker`, its lease expired: what a dead worker leaves.
async fn interrupted(db: &TestDb, id: &str, worker: &str) {
    order_paid(&engine(db, three_steps()), id).await;
    let claimed = db
        .store
        .event_claim_many(&ClaimParams::new(worker, 1, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    db.probe.expire_lease(claimed[0].lease.event_seq).await;
}

/// `migrate` is idempotent; `status` counts states and sources, dead letters,
/// stuck leases and throughput, as a table and as JSON.
async fn migrate_and_status(db: TestDb) {
    let migrated = tickmark(&db, &["migrate"]).await.ok();
    assert!(
        migrated.stdout.contains("schema is current"),
        "{migrated:?}"
    );
    let json = tickmark(&db, &["--json", "migrate"]).await.ok().json();
    assert_eq!(json["backend"], db.backend().to_string());

    let engine = engine(&db, broken_second());
    order_paid(&self::engine(&db, three_steps()), "evt_1").await;
    run_until_idle(&db, three_steps()).await;
    order_paid(&engine, "evt_dead").await;
    run_until_idle(&db, broken_second()).await;
    interrupted(&db, "evt_stuck", "vanished").await;
    order_paid(&engine, "evt_waiting").await;

    let status = tickmark(&db, &["status"]).await.ok();
    for needle in [
        "STATE",
        "pending",
        "done",
        "dead letters",
        "stuck",
        "done per minute",
    ] {
        assert!(
            status.stdout.contains(needle),
            "{needle}: {}",
            status.stdout
        );
    }
    let json = tickmark(&db, &["status", "--minutes", "5", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(json["totals"]["done"], 1);
    assert_eq!(json["totals"]["pending"], 1);
    assert_eq!(
        (json["dead"].clone(), json["stuck"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(json["minutes"], 5);
    assert_eq!(json["done_per_minute"].as_array().unwrap().len(), 5);
    assert_eq!(json["done_per_minute"][0], 1);
    assert!(json["oldest_pending_age_seconds"].as_f64().unwrap() < 60.0);
    assert!(json["counts"]
        .as_array()
        .unwrap()
        .contains(&json!({"state": "dead", "source": "shop", "count": 1})));
}

/// `events list`, `show` and `explain`: tables, JSON, and a paragraph per state.
async fn events_list_show_and_explain(db: TestDb) {
    order_paid(&engine(&db, three_steps()), "evt_done").await;
    run_until_idle(&db, three_steps()).await;
    order_paid(&engine(&db, broken_second()), "evt_dead").await;
    run_until_idle(&db, broken_second()).await;
    interrupted(&db, "evt_lost", "vanished").await;

    let list = tickmark(&db, &["events", "list"]).await.ok();
    for needle in ["SOURCE", "evt_done", "evt_dead", "evt_lost"] {
        assert!(list.stdout.contains(needle), "{needle}: {}", list.stdout);
    }
    let json = tickmark(&db, &["events", "list", "--state", "dead", "--json"])
        .await
        .ok()
        .json();
    let events = json["events"].as_array().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["event"]["id"], "evt_dead");
    assert_eq!(events[0]["state"], "dead");
    let limited = tickmark(
        &db,
        &["events", "list", "--limit", "2", "--since", "1h", "--json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(limited["events"].as_array().unwrap().len(), 2);
    let bad = tickmark(&db, &["events", "list", "--since", "90"]).await;
    assert_eq!(bad.code, 2, "a duration without a unit is a usage error");
    assert!(bad.stderr.contains("no unit"), "{bad:?}");

    let done = seq(&db, "evt_done").await;
    let show = tickmark(&db, &["events", "show", &done]).await.ok();
    for needle in [
        "IDEMPOTENCY KEY",
        "shop:evt_done:first",
        "shop:evt_done:third",
        "why: Done at",
        "audit trail",
        "(none)",
    ] {
        assert!(show.stdout.contains(needle), "{needle}: {}", show.stdout);
    }
    let json = tickmark(&db, &["events", "show", "evt_dead", "--json", "--full"])
        .await
        .ok()
        .json();
    assert_eq!(json["event"]["state"], "dead");
    assert_eq!(json["steps"][0]["state"], "done");
    assert_eq!(json["steps"][1]["state"], "dead");
    assert_eq!(json["steps"][1]["idempotency_key"], "shop:evt_dead:second");
    assert!(json["explanation"]
        .as_str()
        .unwrap()
        .starts_with("Dead since"));

    let dead = tickmark(&db, &["events", "explain", "evt_dead"]).await.ok();
    assert!(
        dead.stdout.contains("Dead since") && dead.stdout.contains("tickmark events retry"),
        "{dead:?}"
    );
    let lost = tickmark(&db, &["events", "explain", "evt_lost", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(lost["state"], "running");
    let text = lost["explanation"].as_str().unwrap();
    assert!(
        text.starts_with("Interrupted: the lease of vanished expired"),
        "{text}"
    );
    assert!(text.contains("shop:evt_lost:first"), "{text}");
}

/// `events retry --from-step` keeps the earlier steps (rows, outputs, keys)
/// and re-runs the later ones with the same keys.
async fn retry_from_a_step_keeps_earlier_steps_and_keys(db: TestDb) {
    order_paid(&engine(&db, three_steps()), "evt_rerun").await;
    run_until_idle(&db, three_steps()).await;
    let before = tickmark(&db, &["events", "show", "evt_rerun", "--json"])
        .await
        .ok()
        .json();

    let retried = tickmark(
        &db,
        &[
            "events",
            "retry",
            "evt_rerun",
            "--from-step",
            "second",
            "--reason",
            "receipt template fixed",
            "--json",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(retried["action"], "retry");
    assert_eq!(retried["event"]["state"], "pending");
    assert_eq!(retried["event"]["next_step"], 1);
    assert_eq!(retried["audit"]["actor"], "tester@testhost");
    assert_eq!(retried["audit"]["step"], "second");
    assert_eq!(retried["audit"]["reason"], "receipt template fixed");

    run_until_idle(&db, three_steps()).await;
    let after = tickmark(&db, &["events", "show", "evt_rerun", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(after["event"]["state"], "done");
    assert_eq!(
        after["steps"][0], before["steps"][0],
        "step one kept as it was"
    );
    for position in [1, 2] {
        let (old, new) = (&before["steps"][position], &after["steps"][position]);
        assert_eq!(new["idempotency_key"], old["idempotency_key"]);
        assert_eq!(new["output"]["key"], old["output"]["key"], "same key seen");
        assert_ne!(new["finished_at"], old["finished_at"], "ran again");
    }
    assert_eq!(db.probe.runs("evt_rerun", "first").await, 1);
    assert_eq!(db.probe.runs("evt_rerun", "second").await, 2);
    assert_eq!(db.probe.runs("evt_rerun", "third").await, 2);
}

/// Manual actions are audited and `events show` prints the trail.
async fn the_audit_trail_records_manual_actions(db: TestDb) {
    let engine = engine(&db, broken_second());
    order_paid(&engine, "evt_fix").await;
    run_until_idle(&db, broken_second()).await;
    let fix = seq(&db, "evt_fix").await;

    let done = tickmark(
        &db,
        &[
            "steps",
            "mark-done",
            &fix,
            "second",
            "--reason",
            "refunded by hand, OPS-7",
            "--actor",
            "ana@ops",
        ],
    )
    .await
    .ok();
    assert!(done.stdout.contains("is now done"), "{done:?}");

    order_paid(&engine, "evt_drop").await;
    let drop = seq(&db, "evt_drop").await;
    tickmark(
        &db,
        &["steps", "skip", &drop, "first", "--reason", "not needed"],
    )
    .await
    .ok();
    tickmark(
        &db,
        &["events", "cancel", &drop, "--reason", "duplicate order"],
    )
    .await
    .ok();

    let show = tickmark(&db, &["events", "show", &fix]).await.ok();
    for needle in [
        "mark_done",
        "ana@ops",
        "refunded by hand, OPS-7",
        "dead → done",
    ] {
        assert!(show.stdout.contains(needle), "{needle}: {}", show.stdout);
    }
    let json = tickmark(&db, &["events", "show", &drop, "--json"])
        .await
        .ok()
        .json();
    let audit = json["audit"].as_array().unwrap();
    let actions: Vec<_> = audit
        .iter()
        .map(|a| (a["action"].as_str().unwrap(), a["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(
        actions,
        [("skip", "tester@testhost"), ("cancel", "tester@testhost")]
    );
    assert_eq!(audit[1]["reason"], "duplicate order");
    let why = tickmark(&db, &["events", "explain", &drop]).await.ok();
    assert!(
        why.stdout.contains("Cancelled by tester@testhost at")
            && why.stdout.contains("duplicate order"),
        "{why:?}"
    );
}

/// `events cancel` on a running event stops its worker: it marks nothing.
async fn cancel_stops_a_running_worker(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.paid",
        Handler::new().named_step("first", WaitForCancel),
    );
    let engine = engine(&db, handlers);
    order_paid(&engine, "evt_stop").await;
    let worker = engine
        .worker(quick_worker("busy"))
        .expect("valid worker settings");
    let mut stats = worker.stats();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait::until("the step starts", Duration::from_secs(20), || async {
        db.probe.runs("evt_stop", "first").await == 1
    })
    .await;

    let cancel = tickmark(&db, &["events", "cancel", "evt_stop", "--reason", "stop"])
        .await
        .ok();
    assert!(cancel.stdout.contains("is now cancelled"), "{cancel:?}");
    tokio::time::timeout(
        Duration::from_secs(20),
        stats.wait_for(|s| s.leases_lost >= 1 && s.in_flight == 0),
    )
    .await
    .expect("the worker stops the cancelled event")
    .unwrap();
    shutdown.cancel();
    running.await.unwrap().unwrap();
    let record = db
        .store
        .event_find("shop", "evt_stop")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, EventState::Cancelled);
    assert!(db
        .store
        .step_outputs(record.event.seq)
        .await
        .unwrap()
        .is_empty());
}

/// `prune` refuses a dedup window shorter than the sources' retry windows
/// (unless `--i-know`), deletes old events however short `--older-than` is
/// while their tombstones keep the default 30-day dedup window, and reports
/// what it deleted.
async fn prune_refuses_an_unsafe_window(db: TestDb) {
    let engine = engine(&db, three_steps());
    for id in ["evt_old_1", "evt_old_2", "evt_old_3", "evt_new"] {
        order_paid(&engine, id).await;
    }
    engine
        .accept(NewEvent::with_id(
            "stripe",
            "evt_st",
            "invoice.paid",
            json!({}),
        ))
        .await
        .unwrap();
    run_until_idle(&db, three_steps()).await;
    age(&db, &["evt_old_1", "evt_old_2", "evt_old_3", "evt_st"], 2).await;

    let refused = tickmark(
        &db,
        &["prune", "--older-than", "1h", "--dedup-window", "1h"],
    )
    .await;
    assert_eq!(refused.code, 4, "{refused:?}");
    assert!(
        refused.stderr.contains("`stripe` (4w 2d)") && refused.stderr.contains("--i-know"),
        "{refused:?}"
    );
    let safe = tickmark(&db, &["prune", "--older-than", "3d", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(safe["deleted"], 0, "nothing is older than 3 days");

    let pruned = tickmark(
        &db,
        &[
            "prune",
            "--older-than",
            "1h",
            "--batch",
            "2",
            "--progress",
            "--json",
        ],
    )
    .await
    .ok();
    assert!(
        pruned.stderr.contains("pruned 2 batch(es), 4 event(s)"),
        "progress on stderr: {pruned:?}"
    );
    let json = pruned.json();
    assert_eq!(
        (json["deleted"].clone(), json["batches"].clone()),
        (json!(4), json!(2))
    );
    assert_eq!(json["dedup_window_seconds"], 30 * 86_400);
    assert_eq!(json["tombstones_expired"], 0);
    let redelivered = engine
        .accept(NewEvent::with_id(
            "stripe",
            "evt_st",
            "invoice.paid",
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(
        redelivered,
        tickmark::Accepted::Duplicate,
        "a pruned event's tombstone answers its redelivery"
    );
    let left = tickmark(&db, &["events", "list", "--json"])
        .await
        .ok()
        .json();
    let ids: Vec<_> = left["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["evt_new"]);
    let human = tickmark(&db, &["prune", "--older-than", "1w"]).await.ok();
    assert!(human.stdout.starts_with("deleted 0 event(s)"), "{human:?}");
}

/// Exit codes: 3 not found, 4 refused, 2 usage, 1 database; errors on stderr
/// (as JSON with --json), saying what to do next.
async fn exit_codes(db: TestDb) {
    let engine = engine(&db, three_steps());
    order_paid(&engine, "evt_done").await;
    run_until_idle(&db, three_steps()).await;
    order_paid(&engine, "evt_pending").await;
    engine
        .accept(NewEvent::with_id("stripe", "evt_pending", "x", json!({})))
        .await
        .unwrap();

    let missing = tickmark(&db, &["events", "show", "999999"]).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(
        missing.stderr.contains("tickmark events list"),
        "{missing:?}"
    );
    assert_eq!(
        tickmark(&db, &["events", "retry", "evt_nope"]).await.code,
        3
    );
    let unknown_step = tickmark(
        &db,
        &["events", "retry", "evt_done", "--from-step", "fourth"],
    )
    .await;
    assert_eq!(unknown_step.code, 3, "{unknown_step:?}");
    assert!(
        unknown_step.stderr.contains("first, second, third"),
        "{unknown_step:?}"
    );

    let queued = tickmark(&db, &["events", "retry", "evt_pending", "--source", "shop"]).await;
    assert_eq!(queued.code, 4, "{queued:?}");
    assert!(queued.stderr.contains("already queued"), "{queued:?}");
    let done = tickmark(&db, &["--json", "events", "retry", "evt_done"]).await;
    assert_eq!(done.code, 4, "{done:?}");
    let error: Value = serde_json::from_str(done.stderr.trim()).expect("a JSON error");
    assert_eq!(error["error"]["kind"], "refused");
    assert_eq!(error["error"]["exit_code"], 4);
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--from-step NAME"));

    let ambiguous = tickmark(&db, &["events", "show", "evt_pending"]).await;
    assert_eq!(ambiguous.code, 2, "{ambiguous:?}");
    assert!(ambiguous.stderr.contains("--source"), "{ambiguous:?}");
    tickmark(
        &db,
        &["events", "show", "evt_pending", "--source", "stripe"],
    )
    .await
    .ok();
    let no_reason = tickmark(&db, &["steps", "skip", "evt_done", "first"]).await;
    assert_eq!(no_reason.code, 2, "--reason is required: {no_reason:?}");

    let no_url = run(&["status"]).await;
    assert_eq!(no_url.code, 2, "{no_url:?}");
    assert!(
        no_url.stderr.contains("--database-url") && no_url.stderr.contains("DATABASE_URL"),
        "{no_url:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let nowhere = format!("sqlite://{}", dir.path().join("typo.db").display());
    let typo = run(&["--database-url", &nowhere, "status"]).await;
    assert_eq!(typo.code, 1, "{typo:?}");
    assert!(typo.stderr.contains("tickmark migrate"), "{typo:?}");
    assert!(
        !dir.path().join("typo.db").exists(),
        "no empty database made"
    );
    run(&["--database-url", &nowhere, "migrate"]).await.ok();
    let empty = run(&["--database-url", &nowhere, "--json", "status"])
        .await
        .ok()
        .json();
    assert_eq!(
        empty["counts"],
        json!([]),
        "`migrate` made an empty database"
    );
}

/// `plans check` lists unfinished events whose plans this binary cannot run:
/// the generic `tickmark` binary does not link the tests' step types, so an
/// unfinished event of theirs is reported (exit 5); a finished one is not.
async fn plans_check_lists_plans_this_build_cannot_run(db: TestDb) {
    let clean = tickmark(&db, &["plans", "check", "--json"]).await.ok();
    assert_eq!(clean.json()["stranded"], json!([]));

    order_paid(&engine(&db, three_steps()), "evt_waiting").await;
    let stranded = tickmark(&db, &["plans", "check", "--json"]).await;
    assert_eq!(stranded.code, 5, "{stranded:?}");
    let report = stranded.json();
    let plans = report["stranded"].as_array().expect("a list");
    assert_eq!(plans.len(), 1, "{report}");
    assert_eq!(plans[0]["events"], 1);
    assert_eq!(plans[0]["steps"], json!(["first", "second", "third"]));
    assert!(
        plans[0]["problem"]
            .as_str()
            .unwrap()
            .contains("test_record"),
        "{report}"
    );

    let human = tickmark(&db, &["plans", "check"]).await;
    assert_eq!(human.code, 5);
    assert!(human.stdout.contains("1 unfinished event(s)"), "{human:?}");
}

/// `tickmark tenants`: a weight set at run time is listed and used by the
/// next claim; a weight that is not a positive number is refused with exit
/// 2 and writes nothing; the list shows each tenant's backlog.
async fn tenants_weight_is_set_listed_and_refused_when_not_positive(db: TestDb) {
    let empty = tickmark(&db, &["tenants", "list"]).await.ok();
    assert!(empty.stdout.contains("no tenants"), "{empty:?}");

    let set = tickmark(&db, &["tenants", "weight", "acct_big", "3"])
        .await
        .ok();
    assert!(set.stdout.contains("weight 3"), "{set:?}");
    for refused in ["0", "-2", "NaN", "heavy", "inf"] {
        let run = tickmark(&db, &["tenants", "weight", "acct_big", refused]).await;
        assert_eq!(run.code, 2, "{refused}: {run:?}");
        assert!(
            run.stderr.contains("nothing was changed"),
            "{refused}: {run:?}"
        );
    }

    let engine = engine(&db, fair_share::fair_handlers());
    fair_share::accept(&engine, "acct_big", 40).await;
    fair_share::accept(&engine, "acct_small", 40).await;
    let listed = tickmark(&db, &["tenants", "list", "--json"])
        .await
        .ok()
        .json();
    let tenants = listed["tenants"].as_array().expect("a list");
    assert_eq!(tenants.len(), 2, "{listed}");
    let big = tenants.iter().find(|t| t["tenant"] == "acct_big").unwrap();
    assert_eq!(
        (big["weight"].as_f64(), big["pending"].as_i64()),
        (Some(3.0), Some(40))
    );

    let claimed = db
        .store
        .event_claim_many(&ClaimParams::new("w", 20, Duration::from_secs(30)))
        .await
        .unwrap();
    let big_share = claimed
        .iter()
        .filter(|c| c.event.payload["account"] == "acct_big")
        .count();
    assert_eq!(big_share, 15, "weight 3 against 1: three quarters of 20");
    let human = tickmark(&db, &["tenants", "list"]).await.ok();
    assert!(human.stdout.contains("acct_small"), "{human:?}");
    let status = tickmark(&db, &["status", "--json"]).await.ok().json();
    assert_eq!(
        status["tenants"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
}

/// What a hostile sender or a careless step puts in remote text: colour, a
/// window-title change ended by BEL, a C1 control sequence introducer, a
/// right-to-left override, a line break and a tab.
const HOSTILE: &str = "\u{1b}[31m\u{1b}]0;pwned\u{7}\u{9b}2J\u{202e}\nforged line\t!";

/// Whether `c` may never reach a terminal raw: a control character other
/// than the line break, or a bidirectional override.
fn dangerous(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A step that fails terminally with [`HOSTILE`] in its error.
#[derive(Debug, Serialize, Deserialize)]
struct HostileError;

#[typetag::serde(name = "cli_test_hostile_error")]
#[async_trait::async_trait]
impl Step for HostileError {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Err(StepError::terminal(format!("card declined{HOSTILE}")))
    }
}

/// Errors, progress messages, payload-derived ids and kinds and audit notes
/// came from elsewhere: no human output of the CLI carries their control
/// characters to the terminal (they show as visible stand-ins), and
/// `--json` keeps them exact, escaped by JSON.
async fn remote_text_reaches_the_terminal_inert(db: TestDb) {
    let handlers = || {
        Handlers::new().on(
            "shop",
            "order.hostile",
            Handler::new().named_step("explode", HostileError),
        )
    };
    let hostile_id = format!("evt_{HOSTILE}");
    engine(&db, handlers())
        .accept(NewEvent::with_id(
            "shop",
            &hostile_id,
            "order.hostile",
            json!({ "note": HOSTILE }),
        ))
        .await
        .unwrap();
    engine(&db, handlers())
        .accept(NewEvent::with_id(
            "shop",
            "evt_kind",
            format!("kind{HOSTILE}"),
            json!({}),
        ))
        .await
        .unwrap();
    run_until_idle(&db, handlers()).await;
    // A running step that reported progress with the same text.
    order_paid(&engine(&db, three_steps()), "evt_progress").await;
    let claimed = db
        .store
        .event_claim_many(&ClaimParams::new("w-1", 1, Duration::from_secs(300)))
        .await
        .unwrap();
    db.store
        .event_progress(&claimed[0].lease, 0.5, &format!("half{HOSTILE}"))
        .await
        .unwrap();

    let dead = db
        .store
        .event_find("shop", &hostile_id)
        .await
        .unwrap()
        .unwrap()
        .event
        .seq
        .to_string();
    let ignored = seq(&db, "evt_kind").await;
    let running = seq(&db, "evt_progress").await;
    let reason = format!("note{HOSTILE}");
    let runs = [
        tickmark(&db, &["status"]).await,
        tickmark(&db, &["events", "list"]).await,
        tickmark(&db, &["events", "show", &dead]).await,
        tickmark(&db, &["events", "show", &dead, "--full"]).await,
        tickmark(&db, &["events", "explain", &dead]).await,
        tickmark(&db, &["events", "show", &ignored]).await,
        tickmark(&db, &["events", "explain", &ignored]).await,
        tickmark(&db, &["events", "show", &running]).await,
        tickmark(&db, &["events", "explain", &running]).await,
        tickmark(&db, &["events", "retry", &dead, "--reason", &reason]).await,
        tickmark(&db, &["events", "show", &dead]).await,
        tickmark(&db, &["events", "show", &hostile_id]).await,
        tickmark(&db, &["events", "show", "no\u{1b}[2Jsuch"]).await,
    ];
    for run in &runs {
        for (stream, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
            assert!(
                !text.chars().any(dangerous),
                "{stream} carries a control character: {run:?}"
            );
        }
    }
    let shown = |i: usize| &runs[i].stdout;
    assert!(
        shown(2).contains("card declined␛[31m␛]0;pwned␇"),
        "{}",
        shown(2)
    );
    assert!(shown(4).contains("card declined␛[31m"), "{}", shown(4));
    assert!(shown(5).contains("kind␛[31m"), "{}", shown(5));
    assert!(shown(7).contains("half␛[31m"), "{}", shown(7));
    assert!(
        shown(10).contains("note␛[31m"),
        "the audit note: {}",
        shown(10)
    );
    assert!(!shown(2).contains("\nforged line"), "no forged output line");
    assert_eq!(runs[12].code, 3, "{:?}", runs[12]);
    assert!(runs[12].stderr.contains("no␛[2Jsuch"), "{:?}", runs[12]);

    // `--json` keeps the exact text: JSON escapes the C0 controls (ESC,
    // BEL, line breaks); a JSON reader gets the original back.
    let json = tickmark(&db, &["events", "show", &dead, "--json"])
        .await
        .ok();
    assert!(
        !json
            .stdout
            .chars()
            .any(|c| c.is_ascii_control() && c != '\n'),
        "{}",
        json.stdout
    );
    assert_eq!(json.json()["event"]["event"]["id"], hostile_id.as_str());
}

/// `events explain` says what a waiting step waits for and how to settle
/// it; `steps feed` and `steps time-out` settle it (refused, exit 4, for a
/// step that is not waiting), and the right branch runs.
async fn a_wait_is_explained_then_fed_or_timed_out_by_hand(db: TestDb) {
    let handlers = || {
        Handlers::new()
            .on(
                "shop",
                "order.created",
                Handler::new()
                    .wait(
                        "paid",
                        tickmark::wait::WaitFor::event("shop", "order.paid")
                            .matching("/id")
                            .timeout(Duration::from_secs(3 * 24 * 3600)),
                    )
                    .named_step("fulfill", Record::default())
                    .if_matched("paid")
                    .named_step("release", Record::default())
                    .if_timed_out("paid"),
            )
            .on(
                "shop",
                "order.paid",
                Handler::new().named_step("note", Record::default()),
            )
    };
    let engine = engine(&db, handlers());
    for (id, kind, order) in [
        ("evt_fed", "order.created", 1),
        ("evt_late", "order.created", 2),
        ("evt_wire", "order.paid", 99),
    ] {
        engine
            .accept(NewEvent::with_id(
                "shop",
                id,
                kind,
                serde_json::json!({ "id": order }),
            ))
            .await
            .unwrap();
    }
    run_until_idle(&db, handlers()).await;
    let fed = seq(&db, "evt_fed").await;
    let late = seq(&db, "evt_late").await;

    let why = tickmark(&db, &["events", "explain", &fed]).await.ok();
    for needle in [
        "Waiting, holding nothing",
        "order.paid",
        "/id is 1",
        "tickmark steps feed",
    ] {
        assert!(why.stdout.contains(needle), "{needle}: {}", why.stdout);
    }
    let refused = tickmark(
        &db,
        &[
            "steps", "feed", &fed, "fulfill", "--event", "evt_wire", "--reason", "x",
        ],
    )
    .await;
    assert_eq!(refused.code, 4, "{refused:?}");
    assert!(refused.stderr.contains("is not waiting"), "{refused:?}");
    tickmark(
        &db,
        &[
            "steps",
            "feed",
            &fed,
            "paid",
            "--event",
            "evt_wire",
            "--reason",
            "paid by wire, OPS-9",
        ],
    )
    .await
    .ok();
    tickmark(
        &db,
        &[
            "steps",
            "time-out",
            &late,
            "paid",
            "--reason",
            "cancelled by phone",
        ],
    )
    .await
    .ok();
    run_until_idle(&db, handlers()).await;

    assert_eq!(db.probe.runs("evt_fed", "fulfill").await, 1);
    assert_eq!(db.probe.runs("evt_fed", "release").await, 0);
    assert_eq!(db.probe.runs("evt_late", "fulfill").await, 0);
    assert_eq!(db.probe.runs("evt_late", "release").await, 1);
    let show = tickmark(&db, &["events", "show", &fed]).await.ok();
    for needle in ["feed", "paid by wire, OPS-9", "skipped"] {
        assert!(show.stdout.contains(needle), "{needle}: {}", show.stdout);
    }
}

// Every case, once per backend: the modules `sqlite` and `postgres`.
tickmark_tests::per_backend!(fresh_db => [
    migrate_and_status,
    events_list_show_and_explain,
    retry_from_a_step_keeps_earlier_steps_and_keys,
    the_audit_trail_records_manual_actions,
    cancel_stops_a_running_worker,
    prune_refuses_an_unsafe_window,
    exit_codes,
    plans_check_lists_plans_this_build_cannot_run,
    remote_text_reaches_the_terminal_inert,
    a_wait_is_explained_then_fed_or_timed_out_by_hand,
    tenants_weight_is_set_listed_and_refused_when_not_positive,
]);

/// `--help` answers: what each command does, examples, and the exit codes.
#[tokio::test]
async fn help_lists_commands_examples_and_exit_codes() {
    let top = run(&["--help"]).await.ok();
    for needle in [
        "migrate",
        "status",
        "events",
        "steps",
        "prune",
        "Exit codes",
        "4  refused",
        "3  not found",
    ] {
        assert!(top.stdout.contains(needle), "{needle}: {}", top.stdout);
    }
    for command in [
        &["events", "retry", "--help"][..],
        &["events", "show", "--help"],
        &["steps", "mark-done", "--help"],
        &["prune", "--help"],
        &["status", "--help"],
        &["migrate", "--help"],
        &["tenants", "weight", "--help"],
        &["tenants", "list", "--help"],
    ] {
        let help = run(command).await.ok();
        assert!(
            help.stdout.contains("Example"),
            "{command:?}: {}",
            help.stdout
        );
    }
}

/// A database URL's password never reaches the terminal, whatever fails.
#[tokio::test]
async fn errors_name_the_database_url_without_its_password() {
    for url in [
        "mysql://ops:s3cret-pw@db.internal/prod",
        "postgres://ops:s3cret-pw@127.0.0.1:1/prod",
    ] {
        let run = run(&["--database-url", url, "status"]).await;
        assert_ne!(run.code, 0, "{run:?}");
        let said = format!("{}{}", run.stdout, run.stderr);
        assert!(
            !said.contains("s3cret-pw"),
            "{url} leaked its password: {run:?}"
        );
    }
}
