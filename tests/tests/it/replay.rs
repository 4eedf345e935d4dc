//! Replays of captured deliveries, for the sources whose signature does not
//! cover the event id (GitHub, Shopify, Twilio, a generic source with the id
//! in a header), on SQLite and PostgreSQL, in-process and over a socket.
//!
//! A captured delivery sent again with a fresh id header (for GitHub, with
//! another event name too) is answered `duplicate` (`"matched":"replay_key"`)
//! and runs nothing; a true redelivery is still a plain duplicate
//! (`"matched":"event_id"`); a different event of the same source is new;
//! concurrent replays under many ids record one event; a captured body
//! re-sent under other kinds (Shopify's topic, a generic kind header: not
//! signed) is one event too, here where only a `*` handler takes them
//! (Shopify's topics that a handler names are one event each:
//! `shopify_topics.rs`). The replay key is stored on the event row, so
//! it lives exactly as long as the dedup key.
//! Stripe, Standard Webhooks and Slack keep no replay key: their id is signed
//! and their signed timestamp bounds replays.

use crate::receiver_support::{
    all_sources, assert_answer, hmac256, now, record_everything, Harness, Kind, Transport,
};
use tickmark::receiver::providers::{
    Algorithm, Encoding, FieldSource, GenericHmac, GenericHmacConfig,
};
use tickmark::{Backend, Receiver};
use tickmark_tests::http_client::Outgoing;

/// A generic source whose id (and kind) come from headers the signature
/// does not cover.
const GENERIC_HEADER_ID: &str = "generic-header-id";

fn with_generic_header_id(receiver: Receiver) -> Receiver {
    let mut config = GenericHmacConfig::new(
        "X-Signature",
        Algorithm::Sha256,
        Encoding::Hex,
        ["generic-header-secret-0123456789"],
    );
    config.prefix = Some("sha256=".into());
    config.id = Some(FieldSource::Header("X-Event-Id".into()));
    config.kind = Some(FieldSource::Header("X-Event-Type".into()));
    all_sources(receiver)
        .source(GENERIC_HEADER_ID, GenericHmac::new(config).unwrap())
        .expect("a valid source")
}

/// Every source, the generic one with its id in a header among them, on a
/// fresh database: `None` when PostgreSQL tests are skipped.
async fn harness(backend: Backend, transport: Transport) -> Option<Harness> {
    Harness::new(
        backend,
        transport,
        record_everything(),
        with_generic_header_id,
    )
    .await
}

/// The sources under test, and how each puts its id in a header.
#[derive(Debug, Clone, Copy)]
enum Source {
    GitHub,
    Shopify,
    Twilio,
    GenericHeaderId,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::GitHub => "github",
            Source::Shopify => "shopify",
            Source::Twilio => "twilio",
            Source::GenericHeaderId => GENERIC_HEADER_ID,
        }
    }

    /// The header carrying the (unsigned) event id.
    fn id_header(self) -> &'static str {
        match self {
            Source::GitHub => "x-github-delivery",
            Source::Shopify => "x-shopify-webhook-id",
            Source::Twilio => "i-twilio-idempotency-token",
            Source::GenericHeaderId => "x-event-id",
        }
    }

    /// A signed delivery of event `id`, its content told apart by `note`.
    fn delivery(self, id: &str, note: &str) -> Outgoing {
        let kind = match self {
            Source::GitHub => Kind::GitHub,
            Source::Shopify => Kind::Shopify,
            Source::Twilio => Kind::Twilio,
            Source::GenericHeaderId => {
                let body = serde_json::json!({"order": note, "total": 5}).to_string();
                let signature = hex::encode(hmac256(
                    b"generic-header-secret-0123456789",
                    body.as_bytes(),
                ));
                return Outgoing::post(format!("/hooks/{GENERIC_HEADER_ID}"), body)
                    .header("content-type", "application/json")
                    .header("x-signature", format!("sha256={signature}"))
                    .header("x-event-id", id)
                    .header("x-event-type", "order.created");
            }
        };
        // The support's deliveries carry a fixed body: vary it (and sign it
        // again) so that different notes are different events.
        let request = kind.delivery(kind.secret(), id, now());
        match self {
            Source::Twilio => {
                let params = [
                    ("MessageSid", "SM0123456789abcdef"),
                    ("From", "+15550001111"),
                    ("Body", note),
                ];
                let path = format!("/hooks/{}", kind.source());
                let url = format!("{}{path}", crate::receiver_support::PUBLIC_BASE);
                crate::receiver_support::twilio_form(kind.secret(), &url, &path, &params)
                    .header("i-twilio-idempotency-token", id)
            }
            _ => {
                let body = serde_json::json!({"ref": "refs/heads/main", "note": note}).to_string();
                let digest = hmac256(kind.secret().as_bytes(), body.as_bytes());
                let signature = match self {
                    Source::GitHub => format!("sha256={}", hex::encode(digest)),
                    _ => crate::receiver_support::b64(&digest),
                };
                let mut request = request;
                request.body = body.into_bytes();
                set_header(request, kind.signature_header(), &signature)
            }
        }
    }
}

/// `request` with every header `name` replaced by one of `value`.
fn set_header(mut request: Outgoing, name: &str, value: &str) -> Outgoing {
    request
        .headers
        .retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    request.header(name, value)
}

/// A captured delivery sent again with a fresh id is a duplicate and runs
/// nothing; a redelivery is a duplicate; another event is new.
async fn a_replay_with_a_fresh_id_is_a_duplicate(
    source: Source,
    backend: Backend,
    transport: Transport,
) {
    let Some(h) = harness(backend, transport).await else {
        return;
    };
    let captured = source.delivery("evt_original", "first order");
    let first = h.send(&captured).await;
    assert_answer(&first, 200, "new", None);

    // The attacker's copy: a fresh id in the unsigned header.
    let replayed = set_header(captured.clone(), source.id_header(), "evt_forged_1");
    let reply = h.send(&replayed).await;
    assert_answer(&reply, 200, "duplicate", None);
    assert_eq!(reply.json()["matched"], "replay_key", "{}", reply.json());
    if let Source::GitHub = source {
        // GitHub's event name is not signed either.
        let renamed = set_header(replayed.clone(), "x-github-delivery", "evt_forged_2");
        let renamed = set_header(renamed, "x-github-event", "release");
        let reply = h.send(&renamed).await;
        assert_answer(&reply, 200, "duplicate", None);
        assert_eq!(reply.json()["matched"], "replay_key");
    }

    // The provider's own redelivery: still a plain duplicate.
    let again = h.send(&captured).await;
    assert_answer(&again, 200, "duplicate", None);
    assert_eq!(again.json()["matched"], "event_id");

    assert_eq!(
        h.event_rows().await,
        1,
        "one event for the captured delivery"
    );
    let stats = h.run_worker().await;
    assert_eq!(stats.events_done, 1);
    assert_eq!(h.db.probe.runs("evt_original", "first").await, 1);
    assert_eq!(h.db.probe.runs("evt_forged_1", "first").await, 0);
    assert_eq!(h.db.probe.runs("evt_forged_2", "first").await, 0);

    // After the run: the replay is still a duplicate, nothing runs again.
    let reply = h
        .send(&set_header(
            captured.clone(),
            source.id_header(),
            "evt_forged_3",
        ))
        .await;
    assert_answer(&reply, 200, "duplicate", None);
    let stats = h.run_worker().await;
    assert_eq!(stats.claimed, 0);

    // A different event of the same source is new.
    let other = source.delivery("evt_other", "second order");
    assert_answer(&h.send(&other).await, 200, "new", None);
    assert_eq!(h.event_rows().await, 2);

    // The replay key is stored with the event (so pruning removes both at once).
    let stored =
        h.db.probe
            .scalar(&format!(
            "SELECT count(*) FROM tickmark_events WHERE source = '{}' AND replay_key LIKE 'sig:%'",
            source.name()
        ))
            .await;
    assert_eq!(stored, 2);
}

/// Concurrent copies of one captured delivery, each with its own fresh id:
/// one is new, the others duplicates, one event runs. Both keys are decided
/// by the one insert, atomically.
async fn concurrent_replays_record_one_event(backend: Backend, transport: Transport) {
    let Some(h) = harness(backend, transport).await else {
        return;
    };
    let h = std::sync::Arc::new(h);
    let captured = Source::GitHub.delivery("evt_race_0", "raced");
    let sends = (0..20).map(|i| {
        let h = h.clone();
        let copy = set_header(
            captured.clone(),
            "x-github-delivery",
            &format!("evt_race_{i}"),
        );
        tokio::spawn(async move { h.send(&copy).await })
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
    assert_eq!((new, words.len() - new), (1, 19), "{words:?}");
    assert_eq!(h.event_rows().await, 1);
    let stats = h.run_worker().await;
    assert_eq!(stats.events_done, 1);
}

/// Sources whose id is signed keep no replay key: a redelivery of theirs
/// needs none, and their signed timestamp bounds replays.
async fn signed_id_sources_keep_no_replay_key(backend: Backend, transport: Transport) {
    let Some(h) = Harness::new(backend, transport, record_everything(), all_sources).await else {
        return;
    };
    for kind in [Kind::Stripe, Kind::StandardWebhooks, Kind::Slack] {
        let delivery = kind.delivery(kind.secret(), &format!("{}_evt", kind.source()), now());
        assert_answer(&h.send(&delivery).await, 200, "new", None);
        let again = h.send(&delivery).await;
        assert_answer(&again, 200, "duplicate", None);
        assert_eq!(again.json()["matched"], "event_id");
    }
    let with_key =
        h.db.probe
            .scalar("SELECT count(*) FROM tickmark_events WHERE replay_key IS NOT NULL")
            .await;
    assert_eq!(with_key, 0);
}

/// The kind header of Shopify (`X-Shopify-Topic`) and of a generic source
/// with its kind in a header is not signed either: a captured body re-sent
/// under other kinds (`Orders/create`, `x1`, `x2`, …), each with a fresh id,
/// is one event, answered `duplicate` (`"matched":"replay_key"`), and runs
/// once, under the kind it first came with. A redelivery of the same id
/// under another kind is a plain duplicate.
async fn a_captured_body_under_other_kinds_is_one_event(
    source: Source,
    backend: Backend,
    transport: Transport,
) {
    let Some(h) = harness(backend, transport).await else {
        return;
    };
    let kind_header = match source {
        Source::Shopify => "x-shopify-topic",
        Source::GenericHeaderId => "x-event-type",
        other => panic!("{other:?} has no unsigned kind header"),
    };
    let captured = source.delivery("wh_1", "order 1001");
    let first = h.send(&captured).await;
    assert_answer(&first, 200, "new", None);
    let first_kind = first.json()["kind"].as_str().unwrap().to_owned();
    for (n, kind) in ["Orders/create", "x1", "x2", "orders/paid"]
        .iter()
        .enumerate()
    {
        let forged = set_header(
            captured.clone(),
            source.id_header(),
            &format!("wh_forged_{n}"),
        );
        let forged = set_header(forged, kind_header, kind);
        let reply = h.send(&forged).await;
        assert_answer(&reply, 200, "duplicate", None);
        assert_eq!(
            reply.json()["matched"],
            "replay_key",
            "{kind}: {}",
            reply.json()
        );
    }
    // The provider's own redelivery under another kind: a plain duplicate.
    let renamed = set_header(captured.clone(), kind_header, "x3");
    let reply = h.send(&renamed).await;
    assert_answer(&reply, 200, "duplicate", None);
    assert_eq!(reply.json()["matched"], "event_id");

    assert_eq!(h.event_rows().await, 1, "one event for the captured body");
    let stats = h.run_worker().await;
    assert_eq!(stats.events_done, 1);
    assert_eq!(h.db.probe.runs("wh_1", "first").await, 1);
    let kinds =
        h.db.probe
            .scalar(&format!(
                "SELECT count(*) FROM tickmark_events WHERE kind = '{first_kind}'"
            ))
            .await;
    assert_eq!(kinds, 1, "the event keeps the kind it first came with");
}

// Every case, once per backend and transport: the modules `sqlite::in_process`,
// `sqlite::socket`, `postgres::in_process` and `postgres::socket`.
tickmark_tests::per_backend!(backend, in_process: Transport::InProcess, socket: Transport::Socket => [
    github => a_replay_with_a_fresh_id_is_a_duplicate(Source::GitHub),
    shopify => a_replay_with_a_fresh_id_is_a_duplicate(Source::Shopify),
    twilio => a_replay_with_a_fresh_id_is_a_duplicate(Source::Twilio),
    generic_with_header_id => a_replay_with_a_fresh_id_is_a_duplicate(Source::GenericHeaderId),
    concurrent_replays_record_one_event,
    signed_id_sources_keep_no_replay_key,
    shopify_under_other_topics_is_one_event =>
        a_captured_body_under_other_kinds_is_one_event(Source::Shopify),
    generic_under_other_kind_headers_is_one_event =>
        a_captured_body_under_other_kinds_is_one_event(Source::GenericHeaderId),
]);
