//! The ledger over a real socket: requests written by hand as HTTP/1.1, so
//! what is tested is what any client sends.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::*;

/// What the ledger answered.
struct Answer {
    status: u16,
    head: String,
    body: serde_json::Value,
}

/// Send one request (`Connection: close`) and read the whole answer. The
/// timeout only turns a hang into a failure; nothing waits on it otherwise.
async fn send(
    ledger: &EffectLedger,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> Answer {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        ledger.addr(),
        body.len()
    );
    if let Some(key) = key {
        request.push_str(&format!("idempotency-key: {key}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    exchange(ledger, request.as_bytes()).await
}

async fn exchange(ledger: &EffectLedger, request: &[u8]) -> Answer {
    let talk = async {
        let mut stream = TcpStream::connect(ledger.addr()).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        answer
    };
    let answer = tokio::time::timeout(Duration::from_secs(30), talk)
        .await
        .expect("the ledger answers");
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .expect("a status line");
    let body = serde_json::from_str(body).unwrap_or(serde_json::Value::Null);
    Answer {
        status,
        head: head.to_ascii_lowercase(),
        body,
    }
}

fn one_violation(ledger: &EffectLedger) -> LedgerViolation {
    let mut violations = ledger.check().expect_err("a violation");
    assert_eq!(violations.len(), 1, "{violations:?}");
    violations.remove(0)
}

#[tokio::test]
async fn the_same_key_twice_is_one_effect() {
    let ledger = EffectLedger::start().await.unwrap();
    let key = "stripe:evt_1:send_receipt";
    let first = send(
        &ledger,
        "POST",
        "/v1/receipts",
        Some(key),
        r#"{"amount":1}"#,
    )
    .await;
    let again = send(
        &ledger,
        "POST",
        "/v1/receipts",
        Some(key),
        r#"{"amount":1}"#,
    )
    .await;

    assert_eq!(first.status, 200);
    assert_eq!(first.body["id"], "eff_1");
    assert_eq!(first.body["idempotency_key"], key);
    assert_eq!(first.body["path"], "/v1/receipts");
    assert_eq!(again.status, 200);
    assert_eq!(again.body, first.body, "a replay is the first answer");
    assert!(again.head.contains("idempotent-replayed: true"));
    assert!(!first.head.contains("idempotent-replayed"));

    let calls = ledger.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!((calls[0].replayed, calls[1].replayed), (false, true));
    assert_eq!(calls[0].body.as_ref(), br#"{"amount":1}"#);
    assert_eq!(ledger.effects().len(), 1);
    assert_eq!(ledger.check(), Ok(()));
}

#[tokio::test]
async fn two_calls_without_a_key_are_a_double_effect_of_the_running_step() {
    let ledger = EffectLedger::start().await.unwrap();
    let running = EffectOwner::new("shop", "evt_7", "charge_card");
    let now = running.clone();
    ledger.attribute_with(move || Some(now.clone()));
    for _ in 0..2 {
        assert_eq!(
            send(&ledger, "POST", "/v1/charges", None, "{}")
                .await
                .status,
            200
        );
    }

    assert_eq!(ledger.effects().len(), 2);
    assert!(ledger
        .calls()
        .iter()
        .all(|call| call.owner.as_ref() == Some(&running)));
    let violation = one_violation(&ledger);
    assert_eq!(
        violation,
        LedgerViolation::DoubleEffectWithoutKey {
            step: "charge_card".into(),
            source_name: "shop".into(),
            event_id: "evt_7".into(),
            method: "POST".into(),
            path: "/v1/charges".into(),
            times: 2,
        }
    );
    let message = violation.to_string();
    assert!(message.contains("step `charge_card`"), "{message}");
    assert!(
        message.contains("pass ctx.idempotency_key() as the Idempotency-Key header so the service drops the re-send"),
        "{message}"
    );
}

#[tokio::test]
async fn two_random_keys_from_one_step_disagree() {
    let ledger = EffectLedger::start().await.unwrap();
    ledger.attribute_with(|| Some(EffectOwner::new("shop", "evt_7", "notify")));
    let keys = [
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        "7c9e6679-7425-40de-944b-e07fc1f90ae7",
    ];
    for key in keys {
        send(&ledger, "POST", "/v1/messages", Some(key), "{}").await;
    }

    assert_eq!(ledger.effects().len(), 2);
    let violation = one_violation(&ledger);
    let LedgerViolation::KeysDisagree {
        step, keys: seen, ..
    } = &violation
    else {
        panic!("{violation:?}");
    };
    assert_eq!(step, "notify");
    assert_eq!(seen, &keys.map(String::from).to_vec());
    let message = violation.to_string();
    for needle in [
        "step `notify`",
        keys[0],
        keys[1],
        "use ctx.idempotency_key(), which is the same on every run of the step, not a random or per-attempt key",
    ] {
        assert!(message.contains(needle), "{needle:?} in {message}");
    }
}

#[tokio::test]
async fn a_tickmark_key_names_its_step_without_any_closure() {
    let ledger = EffectLedger::start().await.unwrap();
    send(
        &ledger,
        "PUT",
        "/files/a",
        Some("s3-sync:evt_9:upload"),
        "x",
    )
    .await;
    let calls = ledger.calls();
    assert_eq!(
        calls[0].owner,
        Some(EffectOwner::new("s3-sync", "evt_9", "upload"))
    );
    assert_eq!(calls[0].method, "PUT");
    assert_eq!(
        calls[0].idempotency_key.as_deref(),
        Some("s3-sync:evt_9:upload")
    );

    // The key wins over the closure: it is exact even with steps running at once.
    ledger.attribute_with(|| Some(EffectOwner::new("other", "evt_0", "elsewhere")));
    send(
        &ledger,
        "PUT",
        "/files/b",
        Some("s3-sync:evt_9:upload"),
        "y",
    )
    .await;
    assert_eq!(ledger.calls()[1].owner, calls[0].owner);
}

#[tokio::test]
async fn a_per_attempt_key_made_from_the_step_key_is_the_running_step_s() {
    let ledger = EffectLedger::start().await.unwrap();
    let running = EffectOwner::new("stripe", "evt_1", "send_receipt");
    let now = running.clone();
    ledger.attribute_with(move || Some(now.clone()));
    let key = running.idempotency_key();
    for attempt in [
        format!("{key}-1"),
        format!("{key}:2"),
        format!("retry-{key}"),
    ] {
        send(&ledger, "POST", "/v1/receipts", Some(&attempt), "{}").await;
    }

    assert!(ledger
        .calls()
        .iter()
        .all(|call| call.owner.as_ref() == Some(&running)));
    let violation = one_violation(&ledger);
    assert!(
        matches!(&violation, LedgerViolation::KeysDisagree { step, keys, .. }
            if step == "send_receipt" && keys.len() == 3),
        "{violation:?}"
    );
}

#[tokio::test]
async fn an_event_id_with_colons_is_read_whole() {
    let ledger = EffectLedger::start().await.unwrap();
    let key = "shopify:gid://shopify/Order/42:a:b:fulfil.order";
    send(&ledger, "POST", "/fulfilments", Some(key), "{}").await;
    assert_eq!(
        ledger.calls()[0].owner,
        Some(EffectOwner::new(
            "shopify",
            "gid://shopify/Order/42:a:b",
            "fulfil.order"
        ))
    );
}

#[tokio::test]
async fn a_body_over_the_cap_is_413_and_no_effect() {
    let ledger = EffectLedger::start().await.unwrap();
    // The declared length is refused before any of the body is sent.
    let request = format!(
        "POST /v1/uploads HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        ledger.addr(),
        MAX_BODY_BYTES + 1
    );
    let answer = exchange(&ledger, request.as_bytes()).await;
    assert_eq!(answer.status, 413);
    assert!(ledger.calls().is_empty());
    assert!(ledger.effects().is_empty());

    // At the cap is fine.
    let body = "x".repeat(MAX_BODY_BYTES);
    assert_eq!(
        send(&ledger, "POST", "/v1/uploads", None, &body)
            .await
            .status,
        200
    );
    assert_eq!(ledger.effects().len(), 1);
}

#[tokio::test]
async fn unknown_callers_are_reported_as_an_unknown_step() {
    let ledger = EffectLedger::start().await.unwrap();
    send(&ledger, "DELETE", "/v1/things/1", None, "").await;
    send(&ledger, "DELETE", "/v1/things/1", None, "").await;
    let violation = one_violation(&ledger);
    assert!(matches!(
        &violation,
        LedgerViolation::DoubleEffectWithoutKey { step, times: 2, .. } if step == "(unknown step)"
    ));
    assert!(violation.to_string().contains("step `(unknown step)`"));
}

#[tokio::test]
async fn one_call_per_endpoint_and_step_is_fine_and_clear_forgets() {
    let ledger = EffectLedger::start().await.unwrap();
    let step = EffectOwner::new("shop", "evt_1", "sync");
    let now = step.clone();
    ledger.attribute_with(move || Some(now.clone()));
    send(&ledger, "POST", "/a", None, "").await;
    send(&ledger, "POST", "/b", None, "").await;
    send(&ledger, "GET", "/a", None, "").await;
    assert_eq!(ledger.check(), Ok(()));

    send(&ledger, "POST", "/a", Some(&step.idempotency_key()), "").await;
    assert!(matches!(
        one_violation(&ledger),
        LedgerViolation::DoubleEffectWithoutKey { times: 2, .. }
    ));

    ledger.clear();
    assert!(ledger.calls().is_empty());
    assert_eq!(ledger.check(), Ok(()));
    // Keys are forgotten too: the same key is a new effect.
    let answer = send(&ledger, "POST", "/a", Some(&step.idempotency_key()), "").await;
    assert_eq!(answer.body["id"], "eff_5");
    assert!(!ledger.calls()[0].replayed);
}

#[tokio::test]
async fn injected_failures_are_not_applied_and_the_retry_with_its_key_is() {
    let ledger = EffectLedger::start().await.unwrap();
    let key = "stripe:evt_2:refund";
    ledger.fail_next(2, 503);
    assert_eq!(
        send(&ledger, "POST", "/v1/refunds", Some(key), "")
            .await
            .status,
        503
    );
    assert_eq!(
        send(&ledger, "POST", "/v1/refunds", Some(key), "")
            .await
            .status,
        503
    );
    let applied = send(&ledger, "POST", "/v1/refunds", Some(key), "").await;
    assert_eq!(
        (applied.status, &applied.body["id"]),
        (200, &"eff_1".into())
    );
    let replay = send(&ledger, "POST", "/v1/refunds", Some(key), "").await;
    assert_eq!(replay.body, applied.body);

    let statuses: Vec<_> = ledger.calls().iter().map(|call| call.status).collect();
    assert_eq!(statuses, [503, 503, 200, 200]);
    assert_eq!(ledger.effects().len(), 1);
    assert_eq!(ledger.check(), Ok(()));

    // A retry without a key after a failure is a double-effect risk.
    ledger.clear();
    ledger.fail_next(1, 500);
    send(&ledger, "POST", "/v1/refunds", None, "").await;
    send(&ledger, "POST", "/v1/refunds", None, "").await;
    assert_eq!(ledger.effects().len(), 1);
    assert!(matches!(
        one_violation(&ledger),
        LedgerViolation::DoubleEffectWithoutKey { times: 2, .. }
    ));
}

#[tokio::test]
async fn a_key_reused_on_another_path_is_refused_not_replayed() {
    let ledger = EffectLedger::start().await.unwrap();
    let key = "shop:evt_3:pay";
    send(&ledger, "POST", "/v1/charges", Some(key), "").await;
    let other = send(&ledger, "POST", "/v1/transfers", Some(key), "").await;
    assert_eq!(other.status, 422);
    let calls = ledger.calls();
    assert!(!calls[1].applied && !calls[1].replayed);
    assert_eq!(ledger.effects().len(), 1);
}

/// Wait until nothing listens on `addr` any more (stopping is
/// asynchronous); the timeout only turns a hang into a failure.
async fn until_closed(addr: SocketAddr) {
    let closed = async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), closed)
        .await
        .expect("the listener closes");
}

#[tokio::test]
async fn the_server_stops_with_its_last_handle_or_at_shutdown() {
    let ledger = EffectLedger::start().await.unwrap();
    let addr = ledger.addr();
    let clone = ledger.clone();
    drop(ledger);
    assert_eq!(send(&clone, "GET", "/", None, "").await.status, 200);
    drop(clone);
    until_closed(addr).await;

    let ledger = EffectLedger::start().await.unwrap();
    send(&ledger, "GET", "/", None, "").await;
    ledger.shutdown();
    until_closed(ledger.addr()).await;
    assert_eq!(ledger.calls().len(), 1, "the record outlives the server");
}
