//! Logs never carry secrets, and never carry payloads.
//!
//! The payments app (as `tickmark-chaos-node`, the same receiver, steps and
//! worker) runs with `RUST_LOG=trace` on SQLite and with `RUST_LOG=debug` on
//! PostgreSQL. It is sent signed deliveries for every provider, and unsigned,
//! tampered, malformed and oversized ones; every body carries a unique
//! payload marker and a secret-looking value. Once the steps have run and the
//! app has stopped, every line it wrote (stdout and stderr) is scanned:
//!
//! * no signing secret of any provider appears, nor any signature sent;
//! * the payload marker and the secret-looking value never appear — not even
//!   truncated: payloads are not logged at all, at any level (the policy in
//!   `docs/receiver.md`).
//!
//! On SQLite the app seals payloads and outputs with `TICKMARK_KEYS`
//! (docs/privacy.md): what the worker opens reaches no log either, nor does
//! the key.
//!
//! A failure names the offending line. The same lines are also checked for
//! spans of two tasks on one line (a span guard held across an await leaks
//! the span into whatever else the thread polls).

use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use tickmark_tests::chaos::receipts::ReceiptService;
use tickmark_tests::http_client::{HttpClient, Outgoing};
use tickmark_tests::{Probe, TestDb};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

const NODE: &str = env!("CARGO_BIN_EXE_tickmark-chaos-node");

/// One secret per provider, each unmistakable in a log.
const SECRETS: [(&str, &str); 6] = [
    ("STRIPE_WEBHOOK_SECRET", "whsec_LOGSCAN_stripe_secret_9f2c"),
    ("GITHUB_WEBHOOK_SECRET", "LOGSCAN_github_secret_71ab"),
    ("SHOPIFY_WEBHOOK_SECRET", "LOGSCAN_shopify_secret_33de"),
    // whsec_ + base64("LOGSCAN-standard-webhooks-key-32")
    (
        "STANDARD_WEBHOOK_SECRET",
        "whsec_TE9HU0NBTi1zdGFuZGFyZC13ZWJob29rcy1rZXktMzI=",
    ),
    ("SLACK_SIGNING_SECRET", "LOGSCAN_slack_secret_05fe"),
    ("TWILIO_AUTH_TOKEN", "LOGSCAN_twilio_token_c4a1"),
];

fn secret(variable: &str) -> &'static str {
    SECRETS
        .iter()
        .find(|(v, _)| *v == variable)
        .map(|(_, s)| *s)
        .expect("a secret")
}

fn hmac256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

fn hmac1(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// What must never be logged, and the requests that carry it.
struct Corpus {
    marker: String,
    secret_looking: String,
    signatures: Vec<String>,
    requests: Vec<(Outgoing, u16)>,
}

fn corpus(base_url: &str) -> Corpus {
    let marker = format!("PAYLOADMARKER{:016x}", rand::random::<u64>());
    let secret_looking = format!("sk_live_{:024x}", rand::random::<u128>());
    let t = chrono::Utc::now().timestamp();
    let mut signatures = Vec::new();
    let mut requests = Vec::new();

    // Stripe: a paid invoice that runs all three steps.
    let stripe_body = serde_json::json!({
        "id": "evt_logscan_1", "object": "event", "type": "invoice.payment_succeeded",
        "data": {"object": {
            "id": "in_logscan", "customer": "cus_logscan", "amount_paid": 4200,
            "currency": "usd", "description": marker, "metadata": {"api_key": secret_looking},
        }},
    })
    .to_string();
    let stripe_secret = secret("STRIPE_WEBHOOK_SECRET");
    let stripe_sig = hex::encode(hmac256(
        stripe_secret.as_bytes(),
        format!("{t}.{stripe_body}").as_bytes(),
    ));
    signatures.push(stripe_sig.clone());
    let stripe = Outgoing::post("/hooks/stripe", stripe_body.clone())
        .header("content-type", "application/json")
        .header("stripe-signature", format!("t={t},v1={stripe_sig}"));
    requests.push((stripe.clone(), 200));
    requests.push((stripe.clone(), 200)); // a duplicate
                                          // Unsigned, tampered, and signed-but-not-JSON.
    let mut unsigned = stripe.clone();
    unsigned.headers.retain(|(n, _)| n != "stripe-signature");
    requests.push((unsigned, 401));
    let mut tampered = stripe.clone();
    tampered.body = stripe_body.replace("4200", "9999").into_bytes();
    requests.push((tampered, 401));
    let garbage = format!("not json {marker} {secret_looking}");
    let garbage_sig = hex::encode(hmac256(
        stripe_secret.as_bytes(),
        format!("{t}.{garbage}").as_bytes(),
    ));
    signatures.push(garbage_sig.clone());
    requests.push((
        Outgoing::post("/hooks/stripe", garbage)
            .header("content-type", "application/json")
            .header("stripe-signature", format!("t={t},v1={garbage_sig}")),
        400,
    ));
    // A stale timestamp, correctly signed.
    let old = t - 3600;
    let stale_sig = hex::encode(hmac256(
        stripe_secret.as_bytes(),
        format!("{old}.{stripe_body}").as_bytes(),
    ));
    signatures.push(stale_sig.clone());
    requests.push((
        Outgoing::post("/hooks/stripe", stripe_body.clone())
            .header("content-type", "application/json")
            .header("stripe-signature", format!("t={old},v1={stale_sig}")),
        401,
    ));
    // Over the body limit.
    requests.push((
        Outgoing::post(
            "/hooks/stripe",
            format!("{marker}{}", " ".repeat(1024 * 1024)),
        ),
        413,
    ));
    // An unknown source whose name is the marker.
    requests.push((Outgoing::post(format!("/hooks/{marker}"), "{}"), 404));

    // GitHub.
    let gh_body =
        serde_json::json!({"ref": "refs/heads/main", "note": marker, "token": secret_looking})
            .to_string();
    let gh_sig = hex::encode(hmac256(
        secret("GITHUB_WEBHOOK_SECRET").as_bytes(),
        gh_body.as_bytes(),
    ));
    signatures.push(gh_sig.clone());
    requests.push((
        Outgoing::post("/hooks/github", gh_body)
            .header("content-type", "application/json")
            .header("x-hub-signature-256", format!("sha256={gh_sig}"))
            .header("x-github-delivery", "logscan-gh-1")
            .header("x-github-event", "push"),
        200,
    ));
    // Shopify.
    let sh_body = serde_json::json!({"id": 1, "note": marker, "token": secret_looking}).to_string();
    let sh_sig = b64(&hmac256(
        secret("SHOPIFY_WEBHOOK_SECRET").as_bytes(),
        sh_body.as_bytes(),
    ));
    signatures.push(sh_sig.clone());
    requests.push((
        Outgoing::post("/hooks/shopify", sh_body)
            .header("content-type", "application/json")
            .header("x-shopify-hmac-sha256", sh_sig)
            .header("x-shopify-webhook-id", "logscan-sh-1")
            .header("x-shopify-topic", "orders/create"),
        200,
    ));
    // Standard Webhooks.
    let sw_body = serde_json::json!({"type": "invoice.paid", "data": {"note": marker, "token": secret_looking}}).to_string();
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret("STANDARD_WEBHOOK_SECRET").trim_start_matches("whsec_"))
        .unwrap();
    let sw_sig = b64(&hmac256(
        &key,
        format!("msg_logscan.{t}.{sw_body}").as_bytes(),
    ));
    signatures.push(sw_sig.clone());
    requests.push((
        Outgoing::post("/hooks/standard", sw_body)
            .header("content-type", "application/json")
            .header("webhook-id", "msg_logscan")
            .header("webhook-timestamp", t.to_string())
            .header("webhook-signature", format!("v1,{sw_sig}")),
        200,
    ));
    // Slack: an event and a handshake whose challenge is the marker.
    for body in [
        serde_json::json!({"type": "event_callback", "event_id": "Ev_logscan",
            "event": {"type": "app_mention", "text": marker, "token": secret_looking}}),
        serde_json::json!({"type": "url_verification", "challenge": marker}),
    ] {
        let body = body.to_string();
        let sig = hex::encode(hmac256(
            secret("SLACK_SIGNING_SECRET").as_bytes(),
            format!("v0:{t}:{body}").as_bytes(),
        ));
        signatures.push(sig.clone());
        requests.push((
            Outgoing::post("/hooks/slack", body)
                .header("content-type", "application/json")
                .header("x-slack-request-timestamp", t.to_string())
                .header("x-slack-signature", format!("v0={sig}")),
            200,
        ));
    }
    // Twilio: a form post, signed over the URL the test posts to.
    let params = [
        ("Body", marker.as_str()),
        ("From", "+15550001111"),
        ("MessageSid", "SMlogscan"),
        ("Token", secret_looking.as_str()),
    ];
    let mut form = form_urlencoded::Serializer::new(String::new());
    let mut data = format!("{base_url}/hooks/twilio");
    for (name, value) in params {
        form.append_pair(name, value);
        data.push_str(name);
        data.push_str(value);
    }
    let tw_sig = b64(&hmac1(
        secret("TWILIO_AUTH_TOKEN").as_bytes(),
        data.as_bytes(),
    ));
    signatures.push(tw_sig.clone());
    requests.push((
        Outgoing::post("/hooks/twilio", form.finish())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-twilio-signature", tw_sig)
            .header("i-twilio-idempotency-token", "logscan-tw-1"),
        200,
    ));
    Corpus {
        marker,
        secret_looking,
        signatures,
        requests,
    }
}

/// Run the app at `level` on `database_url`, send the corpus, let the steps
/// run, stop it, and scan what it wrote.
/// The encryption key of the SQLite run (its base64 must reach no log).
const KEY: &str = "QUxPR1NDQU4tZW5jcnlwdGlvbi1rZXktb2YtMzJieXQ=";

async fn scan(level: &str, database_url: &str, probe: &Probe, sealed: bool) {
    let receipts = ReceiptService::start().await;
    let out_dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(NODE);
    command
        .args(["--database-url", database_url, "--name", "logscan"])
        .args(["--receipt-url", &receipts.url(), "--render-ms", "50"])
        .arg("--out-dir")
        .arg(out_dir.path())
        .env("RUST_LOG", level)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (variable, value) in SECRETS {
        command.env(variable, value);
    }
    if sealed {
        command.env("TICKMARK_KEYS", format!("logscan:{KEY}"));
    }
    let mut child = command.spawn().expect("start the app");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let stderr_text = tokio::spawn(async move {
        let mut text = String::new();
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes).await;
        text.push_str(&String::from_utf8_lossy(&bytes));
        text
    });
    let mut stdout_lines = Vec::new();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            stdout_lines.push(line.clone());
            if let Some(addr) = line.strip_prefix("chaos-node: listening on http://") {
                return addr.parse::<std::net::SocketAddr>().unwrap();
            }
        }
        panic!("the app exited before serving");
    })
    .await
    .expect("the app serves");

    let corpus = corpus(&format!("http://{addr}"));
    let client = HttpClient::new();
    for (request, status) in &corpus.requests {
        let reply = client.send(addr, request).await.expect("an answer");
        assert_eq!(
            reply.status,
            *status,
            "{} {}: {}",
            request.path,
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
    }
    // Every accepted event's steps run (the Stripe one: credit, receipt, render).
    tickmark_tests::wait::until("every step has run", Duration::from_secs(60), || async {
        probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE state NOT IN ('done', 'ignored')")
            .await
            == 0
    })
    .await;
    assert_eq!(receipts.tally().calls, 1, "the receipt was sent");

    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the app stops on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
    while let Ok(Some(line)) = stdout.next_line().await {
        stdout_lines.push(line);
    }
    let stderr = stderr_text.await.unwrap();
    let lines: Vec<&str> = stdout_lines
        .iter()
        .map(String::as_str)
        .chain(stderr.lines())
        .collect();
    assert!(
        lines.len() > 20,
        "{level}: the app logged almost nothing: {lines:?}"
    );

    let mut forbidden: Vec<(&str, String)> = SECRETS
        .iter()
        .map(|(variable, value)| (*variable, value.to_string()))
        .collect();
    // Standard Webhooks' key, as the base64 part alone.
    forbidden.push((
        "the Standard Webhooks key",
        secret("STANDARD_WEBHOOK_SECRET")
            .trim_start_matches("whsec_")
            .to_owned(),
    ));
    forbidden.push(("the encryption key", KEY.to_owned()));
    forbidden.push(("the payload marker", corpus.marker.clone()));
    // Truncations of the marker count too: its first 16 characters.
    forbidden.push(("a truncated payload marker", corpus.marker[..16].to_owned()));
    forbidden.push((
        "a secret-looking payload value",
        corpus.secret_looking.clone(),
    ));
    for signature in &corpus.signatures {
        forbidden.push(("a signature", signature.clone()));
    }
    let mut leaks = Vec::new();
    for line in &lines {
        for (what, text) in &forbidden {
            if line.contains(text.as_str()) {
                leaks.push(format!("{what} in: {line}"));
            }
        }
    }
    // Each line is about one delivery or one event: a span of one task
    // showing up inside another's means a span guard outlived an await.
    for line in &lines {
        let spans = line.matches("webhook{").count() + line.matches("event{").count();
        if spans > 1 {
            leaks.push(format!("spans of two tasks in: {line}"));
        }
    }
    assert!(
        leaks.is_empty(),
        "RUST_LOG={level}: {} leaking lines of {}:\n{}",
        leaks.len(),
        lines.len(),
        leaks.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_trace_on_sqlite_sealed_no_secret_and_no_payload_reaches_the_logs() {
    let db = TestDb::sqlite().await;
    scan("trace", &db.url, &db.probe, true).await;
    // Sealed, and opened by the worker, which ran every step.
    let sealed = db
        .probe
        .scalar("SELECT count(*) FROM tickmark_events WHERE payload LIKE '\"tickmark:sealed:1:logscan:%'")
        .await;
    assert!(sealed > 0, "no payload was sealed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_debug_on_postgres_no_secret_and_no_payload_reaches_the_logs() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    scan("debug", &db.url, &db.probe, false).await;
}
