//! The receiver over HTTP: concurrency, body limits, routes, handshakes,
//! ignored kinds, signed garbage, body-hash keys, the public URL, and
//! arbitrary input. In-process and over a real socket, on both backends.

use std::time::Duration;

use crate::receiver_support::{
    all_sources, assert_answer, now, record_everything, twilio_form, Harness, Kind, Transport,
    PUBLIC_BASE,
};
use rand::{Rng, SeedableRng};
use tickmark::receiver::PublicBaseUrl;
use tickmark::{Backend, Handler, Handlers, Receiver};
use tickmark_tests::http_client::{HttpClient, LoopbackServer, Outgoing};
use tickmark_tests::test_steps::Record;

/// Guarantee 2 through HTTP: 50 concurrent deliveries of one event get one
/// `new` and 49 `duplicate`, and the step runs once.
async fn fifty_concurrent_deliveries_are_one_new_and_one_run(
    backend: Backend,
    transport: Transport,
) {
    let Some(h) = Harness::new(backend, transport, record_everything(), all_sources).await else {
        return;
    };
    let h = std::sync::Arc::new(h);
    let delivery = Kind::Stripe.delivery(Kind::Stripe.secret(), "evt_race", now());
    let sends = (0..50).map(|_| {
        let (h, delivery) = (h.clone(), delivery.clone());
        tokio::spawn(async move { h.send(&delivery).await })
    });
    let mut words = Vec::new();
    for send in sends.collect::<Vec<_>>() {
        let reply = send.await.expect("task");
        assert_eq!(reply.status, 200, "{}", reply.json());
        words.push(
            reply.json()["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    let new = words.iter().filter(|w| *w == "new").count();
    let duplicate = words.iter().filter(|w| *w == "duplicate").count();
    assert_eq!((new, duplicate), (1, 49));
    assert_eq!(h.event_rows().await, 1);
    h.run_worker().await;
    assert_eq!(h.db.probe.runs("evt_race", "first").await, 1);
}

/// Guarantee 8: a body over the limit is 413 whether it declares its length
/// or is chunked, and nothing is written; a body at the limit is accepted.
async fn an_oversized_body_is_413_with_or_without_content_length(
    backend: Backend,
    transport: Transport,
) {
    const LIMIT: usize = 16 * 1024;
    let Some(h) = Harness::new(backend, transport, record_everything(), |receiver| {
        all_sources(receiver).body_limit(LIMIT)
    })
    .await
    else {
        return;
    };
    let signed = |id: &str, padding: usize| {
        // A valid Stripe delivery padded with JSON whitespace to a size.
        let mut request = Kind::Stripe.delivery(Kind::Stripe.secret(), id, now());
        let body = String::from_utf8(request.body.clone()).unwrap();
        let padded = format!("{body}{}", " ".repeat(padding));
        let t = now();
        let signature = hex::encode(crate::receiver_support::hmac256(
            Kind::Stripe.secret().as_bytes(),
            format!("{t}.{padded}").as_bytes(),
        ));
        request
            .headers
            .retain(|(name, _)| name != "stripe-signature");
        request.body = padded.into_bytes();
        request.header("stripe-signature", format!("t={t},v1={signature}"))
    };
    let base_len = signed("evt_at_limit", 0).body.len();

    let at_limit = signed("evt_at_limit", LIMIT - base_len);
    assert_eq!(at_limit.body.len(), LIMIT);
    assert_answer(&h.send(&at_limit).await, 200, "new", None);

    let over = signed("evt_over_limit", LIMIT - base_len + 1);
    assert_answer(
        &h.send(&over).await,
        413,
        "rejected",
        Some("payload_too_large"),
    );
    let chunks: Vec<Vec<u8>> = over.body.chunks(1000).map(<[u8]>::to_vec).collect();
    let chunked = over.clone().chunked(chunks);
    assert_answer(
        &h.send(&chunked).await,
        413,
        "rejected",
        Some("payload_too_large"),
    );
    // Far over the limit, chunked, with a signature header of the right
    // shape: refused as soon as the limit is passed.
    let well_formed = format!("t=1,v1={}", "0".repeat(64));
    let huge = Outgoing::post("/hooks/stripe", Vec::new())
        .header("stripe-signature", well_formed)
        .chunked(vec![vec![b' '; 64 * 1024]; 8]);
    assert_answer(
        &h.send(&huge).await,
        413,
        "rejected",
        Some("payload_too_large"),
    );
    // The same with a malformed signature header: refused before the body
    // is read (the header is checked first).
    let unsigned_huge = Outgoing::post("/hooks/stripe", Vec::new())
        .header("stripe-signature", "t=1,v1=00")
        .chunked(vec![vec![b' '; 64 * 1024]; 8]);
    assert_answer(
        &h.send(&unsigned_huge).await,
        401,
        "rejected",
        Some("malformed_signature"),
    );
    // A Content-Length over the limit is refused before the body is read.
    let declared = Outgoing::post("/hooks/stripe", vec![b' '; 10])
        .header("content-length", (LIMIT + 1).to_string())
        .chunked(vec![vec![b' '; 10]]);
    if transport == Transport::InProcess {
        // (A real client would not send a false Content-Length.)
        assert_answer(
            &h.send(&declared).await,
            413,
            "rejected",
            Some("payload_too_large"),
        );
    }
    assert_eq!(h.event_rows().await, 1, "only the delivery at the limit");
}

/// The default limit is 1 MiB.
async fn the_default_limit_is_one_mebibyte(backend: Backend, transport: Transport) {
    let Some(h) = Harness::new(backend, transport, record_everything(), |receiver| {
        receiver
            .source("stripe", Kind::Stripe.provider())
            .expect("a valid source")
    })
    .await
    else {
        return;
    };
    let over = Outgoing::post("/hooks/stripe", vec![b' '; 1024 * 1024 + 1])
        .header("stripe-signature", "t=1,v1=00");
    assert_answer(
        &h.send(&over).await,
        413,
        "rejected",
        Some("payload_too_large"),
    );
    let at = Outgoing::post("/hooks/stripe", vec![b' '; 1024 * 1024])
        .header("stripe-signature", "t=1,v1=00");
    // Within the limit, so it reaches verification (and fails there).
    assert_answer(
        &h.send(&at).await,
        401,
        "rejected",
        Some("malformed_signature"),
    );
    assert_eq!(h.event_rows().await, 0);
}

/// Unknown sources, paths and methods get JSON answers; health is up.
async fn unknown_sources_paths_and_methods_are_answered_in_json(
    backend: Backend,
    transport: Transport,
) {
    let Some(h) = Harness::new(backend, transport, record_everything(), all_sources).await else {
        return;
    };
    let signed = Kind::Stripe.delivery(Kind::Stripe.secret(), "evt_1", now());
    let mut elsewhere = signed.clone();
    elsewhere.path = "/hooks/paypal".into();
    assert_answer(
        &h.send(&elsewhere).await,
        404,
        "rejected",
        Some("unknown_source"),
    );
    elsewhere.path = "/hooks/%FF%FE".into();
    assert_answer(
        &h.send(&elsewhere).await,
        404,
        "rejected",
        Some("unknown_source"),
    );
    for path in ["/hooks", "/hooks/", "/hooks/stripe/extra", "/", "/admin"] {
        elsewhere.path = path.into();
        assert_answer(
            &h.send(&elsewhere).await,
            404,
            "rejected",
            Some("not_found"),
        );
    }
    let get = Outgoing::get("/hooks/stripe");
    assert_answer(
        &h.send(&get).await,
        405,
        "rejected",
        Some("method_not_allowed"),
    );
    // Another method on an unknown source is the unknown source's 404, as
    // its POST is: a GET must not tell mounted sources from others.
    for method_probe in [
        Outgoing::get("/hooks/paypal"),
        Outgoing::get("/hooks/%FF%FE"),
    ] {
        assert_answer(
            &h.send(&method_probe).await,
            404,
            "rejected",
            Some("unknown_source"),
        );
    }
    let health = h.send(&Outgoing::get("/healthz")).await;
    assert_answer(&health, 200, "ok", None);
    assert_eq!(h.event_rows().await, 0);
}

/// Slack's `url_verification` is answered with the challenge; nothing is recorded.
async fn a_slack_handshake_is_answered_and_records_nothing(backend: Backend, transport: Transport) {
    let Some(h) = Harness::new(backend, transport, record_everything(), all_sources).await else {
        return;
    };
    let body = r#"{"token":"x","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let t = now();
    let signature = hex::encode(crate::receiver_support::hmac256(
        Kind::Slack.secret().as_bytes(),
        format!("v0:{t}:{body}").as_bytes(),
    ));
    let request = Outgoing::post("/hooks/slack", body)
        .header("content-type", "application/json")
        .header("x-slack-request-timestamp", t.to_string())
        .header("x-slack-signature", format!("v0={signature}"));
    let reply = h.send(&request).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json(),
        serde_json::json!({"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"})
    );
    // Unsigned, the handshake is refused like anything else.
    let unsigned = crate::receiver_support::unsigned(request, Kind::Slack);
    assert_answer(
        &h.send(&unsigned).await,
        401,
        "rejected",
        Some("missing_signature"),
    );
    assert_eq!(h.event_rows().await, 0);
}

/// A kind without handler is recorded as ignored, so the provider stops
/// retrying; its redelivery is a duplicate.
async fn a_kind_without_handler_is_recorded_as_ignored(backend: Backend, transport: Transport) {
    let handlers = Handlers::new().on(
        "stripe",
        "invoice.payment_succeeded",
        Handler::new().named_step("first", Record::default()),
    );
    let Some(h) = Harness::new(backend, transport, handlers, all_sources).await else {
        return;
    };
    let push = Kind::GitHub.delivery(Kind::GitHub.secret(), "gh-delivery-1", now());
    let reply = h.send(&push).await;
    assert_answer(&reply, 200, "ignored", None);
    assert_eq!(reply.json()["event_id"], "gh-delivery-1");
    assert_answer(&h.send(&push).await, 200, "duplicate", None);
    assert_eq!(
        h.db.probe
            .text("SELECT state FROM tickmark_events WHERE dedup_key = 'gh-delivery-1'")
            .await
            .as_deref(),
        Some("ignored")
    );
    let stats = h.run_worker().await;
    assert_eq!(stats.claimed, 0);
}

/// A correctly signed but unusable body is 400 and writes nothing.
async fn signed_garbage_is_400_and_writes_nothing(backend: Backend, transport: Transport) {
    let Some(h) = Harness::new(backend, transport, record_everything(), all_sources).await else {
        return;
    };
    let stripe_signed = |body: &str| {
        let t = now();
        let signature = hex::encode(crate::receiver_support::hmac256(
            Kind::Stripe.secret().as_bytes(),
            format!("{t}.{body}").as_bytes(),
        ));
        Outgoing::post("/hooks/stripe", body.to_owned())
            .header("stripe-signature", format!("t={t},v1={signature}"))
    };
    for (body, code) in [
        ("not json", "malformed_body"),
        ("[1,2,3]", "malformed_body"),
        (r#"{"type":"invoice.paid"}"#, "missing_id"),
        (r#"{"id":"evt_1"}"#, "missing_kind"),
        (r#"{"id":"evt\u0000","type":"x"}"#, "invalid_id"),
    ] {
        assert_answer(
            &h.send(&stripe_signed(body)).await,
            400,
            "rejected",
            Some(code),
        );
    }
    // GitHub without its delivery id header.
    let mut push = Kind::GitHub.delivery(Kind::GitHub.secret(), "gh-1", now());
    push.headers.retain(|(name, _)| name != "x-github-delivery");
    assert_answer(&h.send(&push).await, 400, "rejected", Some("missing_id"));
    assert_eq!(h.event_rows().await, 0);
}

/// With no provider id, the dedup key is `sha256:` of the raw body.
async fn without_a_provider_id_the_body_hash_is_the_key(backend: Backend, transport: Transport) {
    let Some(h) = Harness::new(backend, transport, record_everything(), all_sources).await else {
        return;
    };
    let params = [
        ("MessageSid", "SM1"),
        ("Body", "no token"),
        ("From", "+1555"),
    ];
    let url = format!("{PUBLIC_BASE}/hooks/twilio");
    let request = twilio_form(Kind::Twilio.secret(), &url, "/hooks/twilio", &params);
    let reply = h.send(&request).await;
    assert_answer(&reply, 200, "new", None);
    let key = reply.json()["event_id"].as_str().unwrap().to_owned();
    assert_eq!(key, tickmark::inbox::body_hash(&request.body));
    assert_answer(&h.send(&request).await, 200, "duplicate", None);
    h.run_worker().await;
    assert_eq!(h.db.probe.runs(&key, "first").await, 1);
}

/// Twilio signs the URL it posted to. Without a configured public base the
/// receiver assumes `http://` + Host; behind a proxy the base must be set.
async fn twilio_needs_the_public_url_behind_a_proxy(backend: Backend, transport: Transport) {
    let params = [("MessageSid", "SM2"), ("Body", "hi"), ("From", "+1555")];
    let mount = |receiver: Receiver| {
        receiver
            .source("twilio", Kind::Twilio.provider())
            .expect("a valid source")
    };
    let Some(h) = Harness::new(backend, transport, record_everything(), mount).await else {
        return;
    };
    // Twilio posted to the public URL (through a proxy): not what this
    // process sees, so refused without a configured base.
    let path = "/hooks/twilio?tenant=acme";
    let public = format!("{PUBLIC_BASE}{path}");
    let behind_proxy = twilio_form(Kind::Twilio.secret(), &public, path, &params);
    assert_answer(
        &h.send(&behind_proxy).await,
        401,
        "rejected",
        Some("bad_signature"),
    );
    // Signed over the URL as this process sees it: accepted.
    let seen = match h.addr() {
        Some(addr) => format!("http://{addr}{path}"),
        None => format!("http://localhost{path}"),
    };
    let direct = twilio_form(Kind::Twilio.secret(), &seen, path, &params);
    assert_answer(&h.send(&direct).await, 200, "new", None);

    // With the base configured, the proxied delivery verifies.
    let configured = |receiver: Receiver| {
        mount(receiver).public_base_url(PublicBaseUrl::parse(PUBLIC_BASE).unwrap())
    };
    let Some(h) = Harness::new(backend, transport, record_everything(), configured).await else {
        return;
    };
    assert_answer(&h.send(&behind_proxy).await, 200, "new", None);
}

/// Nested under a prefix, the receiver still sees the full path Twilio signed.
async fn a_nested_receiver_verifies_the_full_url(backend: Backend, transport: Transport) {
    let Some(h) = Harness::new(
        backend,
        Transport::InProcess,
        record_everything(),
        all_sources,
    )
    .await
    else {
        return;
    };
    let app = axum::Router::new().nest("/webhooks", h.router.clone());
    let send = |request: Outgoing| {
        let app = app.clone();
        async move {
            match transport {
                Transport::InProcess => tickmark_tests::http_client::oneshot(&app, &request).await,
                Transport::Socket => {
                    let server = LoopbackServer::start(app).await;
                    let reply = HttpClient::new().send(server.addr, &request).await.unwrap();
                    server.shutdown().await;
                    reply
                }
            }
        }
    };
    let path = "/webhooks/hooks/twilio";
    let params = [("MessageSid", "SM3"), ("Body", "nested"), ("From", "+1555")];
    let request = twilio_form(
        Kind::Twilio.secret(),
        &format!("{PUBLIC_BASE}{path}"),
        path,
        &params,
    );
    assert_answer(&send(request).await, 200, "new", None);
}

/// Never a panic, never a write: arbitrary headers and bodies to every source.
async fn arbitrary_requests_are_refused_without_writing(backend: Backend, transport: Transport) {
    let Some(h) = Harness::new(backend, transport, record_everything(), |receiver| {
        all_sources(receiver).body_limit(4096)
    })
    .await
    else {
        return;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7ac4);
    let names = [
        "stripe-signature",
        "x-hub-signature-256",
        "x-github-delivery",
        "x-github-event",
        "x-shopify-hmac-sha256",
        "x-shopify-webhook-id",
        "x-shopify-topic",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "svix-id",
        "x-slack-signature",
        "x-slack-request-timestamp",
        "x-twilio-signature",
        "i-twilio-idempotency-token",
        "x-signature",
        "x-event-type",
        "content-type",
    ];
    let alphabet = b"tv01=,;:. -_abcdefABCDEF0123456789+/sha256v0{}\"[]%&";
    let requests = if transport == Transport::Socket {
        70
    } else {
        350
    };
    let mut accepted = 0_i64;
    for i in 0..requests {
        let kind = Kind::ALL[i % Kind::ALL.len()];
        let body_len = rng.gen_range(0..6000);
        let body: Vec<u8> = (0..body_len).map(|_| rng.gen()).collect();
        let mut request = if rng.gen_bool(0.5) {
            // A real delivery with a random part replaced.
            let mut request = kind.delivery(kind.secret(), &format!("evt_fuzz_{i}"), now());
            if rng.gen_bool(0.5) {
                request.body = body;
            } else if !request.headers.is_empty() {
                let which = rng.gen_range(0..request.headers.len());
                let value: String = (0..rng.gen_range(0..80))
                    .map(|_| alphabet[rng.gen_range(0..alphabet.len())] as char)
                    .collect();
                request.headers[which].1 = value;
            }
            request
        } else {
            Outgoing::post(format!("/hooks/{}", kind.source()), body)
        };
        for _ in 0..rng.gen_range(0..4) {
            let name = names[rng.gen_range(0..names.len())];
            let value: String = (0..rng.gen_range(0..100))
                .map(|_| alphabet[rng.gen_range(0..alphabet.len())] as char)
                .collect();
            request = request.header(name, value);
        }
        let reply = h.send(&request).await;
        let json = reply.json();
        // A mutated header can leave a delivery intact (one the provider
        // does not read): such a delivery is accepted, anything else refused.
        assert!(
            matches!(reply.status, 200 | 400 | 401 | 413),
            "request {i}: {} {json}",
            reply.status
        );
        assert!(json["status"].is_string(), "request {i}: JSON body: {json}");
        if json["status"] == "new" {
            accepted += 1;
        }
    }
    assert_eq!(
        h.event_rows().await,
        accepted,
        "rows are written for accepted deliveries only"
    );
    tokio::time::timeout(Duration::from_secs(60), h.run_worker())
        .await
        .expect("worker finishes");
}

// Every case, once per backend and transport: the modules `sqlite::in_process`,
// `sqlite::socket`, `postgres::in_process` and `postgres::socket`.
tickmark_tests::per_backend!(backend, in_process: Transport::InProcess, socket: Transport::Socket => [
    fifty_concurrent_deliveries_are_one_new_and_one_run,
    an_oversized_body_is_413_with_or_without_content_length,
    the_default_limit_is_one_mebibyte,
    unknown_sources_paths_and_methods_are_answered_in_json,
    a_slack_handshake_is_answered_and_records_nothing,
    a_kind_without_handler_is_recorded_as_ignored,
    signed_garbage_is_400_and_writes_nothing,
    without_a_provider_id_the_body_hash_is_the_key,
    twilio_needs_the_public_url_behind_a_proxy,
    a_nested_receiver_verifies_the_full_url,
    arbitrary_requests_are_refused_without_writing,
]);
