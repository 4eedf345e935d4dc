//! The receiver's contract, per provider (all seven), per backend, in-process
//! and over a real socket: a valid delivery is new, a redelivery a duplicate
//! that runs nothing again (guarantee 1); a tampered body, a wrong secret, a
//! missing signature and (where signed) a stale timestamp are 401 and write
//! nothing (guarantee 8); a secret being rotated out is still accepted.

use crate::receiver_support::{
    assert_answer, now, record_everything, tampered, unsigned, Harness, Kind, Transport,
};
use tickmark::Backend;

async fn contract(kind: Kind, backend: Backend, transport: Transport) {
    let Some(h) = Harness::new(
        backend,
        transport,
        record_everything(),
        crate::receiver_support::all_sources,
    )
    .await
    else {
        return;
    };
    let id = format!("{}_evt_0001", kind.source());
    let t = now();

    // Refused deliveries write nothing.
    let valid = kind.delivery(kind.secret(), &id, t);
    let refusals = [
        (tampered(valid.clone()), "bad_signature"),
        (kind.delivery(kind.wrong_secret(), &id, t), "bad_signature"),
        (unsigned(valid.clone(), kind), "missing_signature"),
    ];
    for (request, code) in refusals {
        let reply = h.send(&request).await;
        assert_answer(&reply, 401, "rejected", Some(code));
    }
    if kind.has_timestamp() {
        let stale = kind.delivery(kind.secret(), &id, t - 600);
        assert_answer(
            &h.send(&stale).await,
            401,
            "rejected",
            Some("stale_timestamp"),
        );
        let future = kind.delivery(kind.secret(), &id, t + 600);
        assert_answer(
            &h.send(&future).await,
            401,
            "rejected",
            Some("future_timestamp"),
        );
    }
    assert_eq!(h.event_rows().await, 0, "a refused delivery writes nothing");

    // The first valid delivery is new; the same delivery again is a duplicate.
    let reply = h.send(&valid).await;
    assert_answer(&reply, 200, "new", None);
    assert_eq!(reply.json()["event_id"], id.as_str());
    assert_eq!(reply.json()["kind"], kind.event_kind());
    let again = h.send(&valid).await;
    assert_answer(&again, 200, "duplicate", None);
    assert_eq!(h.event_rows().await, 1);

    let stats = h.run_worker().await;
    assert_eq!(stats.events_done, 1);
    assert_eq!(h.db.probe.runs(&id, "first").await, 1);

    // A redelivery after the run: still a duplicate, nothing runs again.
    assert_answer(&h.send(&valid).await, 200, "duplicate", None);
    let stats = h.run_worker().await;
    assert_eq!(stats.claimed, 0);
    assert_eq!(h.db.probe.runs(&id, "first").await, 1);

    // During a rotation, a delivery signed with the previous secret is accepted.
    let rotated_id = format!("{}_evt_0002", kind.source());
    let rotated = kind.delivery(kind.previous_secret(), &rotated_id, now());
    assert_answer(&h.send(&rotated).await, 200, "new", None);
    assert_eq!(h.event_rows().await, 2);
}

// Every provider, once per backend and transport: the modules
// `sqlite::in_process`, `sqlite::socket`, `postgres::in_process` and
// `postgres::socket`.
tickmark_tests::per_backend!(backend, in_process: Transport::InProcess, socket: Transport::Socket => [
    stripe => contract(Kind::Stripe),
    github => contract(Kind::GitHub),
    shopify => contract(Kind::Shopify),
    standard_webhooks => contract(Kind::StandardWebhooks),
    slack => contract(Kind::Slack),
    twilio => contract(Kind::Twilio),
    generic_hmac => contract(Kind::GenericHmac),
]);
