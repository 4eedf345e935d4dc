//! `payments-admin plans check`: a build that links the payments steps can
//! run every plan the payments app stores; a plan naming a step type it does
//! not know is reported, with exit code 5.

use std::process::Command;

use tickmark::{Engine, EventState, NewEvent};
use tickmark_driver::store::EventInsert;

#[tokio::test]
async fn plans_check_passes_for_known_steps_and_flags_unknown_ones() {
    let dir = std::env::temp_dir().join(format!("tickmark-payments-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("payments.db").display());
    let engine = Engine::new(
        tickmark::connect(&url).await.unwrap(),
        tickmark_examples::payments::handlers(),
    )
    .unwrap();
    let payload = serde_json::json!({"id": "evt_1", "type": "invoice.payment_succeeded"});
    engine
        .accept(NewEvent::with_id(
            "stripe",
            "evt_1",
            "invoice.payment_succeeded",
            payload,
        ))
        .await
        .unwrap();

    let check = || {
        Command::new(env!("CARGO_BIN_EXE_payments-admin"))
            .args(["--database-url", &url, "plans", "check", "--json"])
            .output()
            .expect("run payments-admin")
    };
    let ok = check();
    assert!(ok.status.success(), "{ok:?}");

    let stranded_plan = r#"{"version":1,"retry":{"max_attempts":3,"initial_delay":10,"max_delay":10,"multiplier":2.0,"jitter":0.0},
        "steps":[{"name":"charge","step":{"type":"payments.charge_v0","config":{}}}]}"#;
    engine
        .store()
        .event_insert(&EventInsert {
            source: "stripe",
            dedup_key: "evt_old",
            kind: "invoice.payment_succeeded",
            payload_json: "{}",
            plan_json: stranded_plan,
            step_count: 1,
            state: EventState::Pending,
            not_before: None,
            resource_key: None,
            resource_seq: None,
            replay_key: None,
            limit_key: None,
            limit_n: None,
            tenant_key: None,
            head_start_ms: 0,
            trace: None,
            subjects: None,
            debounce: None,
            match_keys: &[],
        })
        .await
        .unwrap();
    let flagged = check();
    assert_eq!(flagged.status.code(), Some(5), "{flagged:?}");
    assert!(String::from_utf8_lossy(&flagged.stdout).contains("payments.charge_v0"));
    let _ = std::fs::remove_dir_all(&dir);
}
