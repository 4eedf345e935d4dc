//! Re-planning ignored events (`Engine::replan_ignored`): events accepted
//! while no handler took their kind are recorded `ignored`; once a deploy
//! adds the handler, an operator gives them its plan and they run once, as
//! if the handler had been there. Only `ignored` events are touched.

use serde_json::json;
use tickmark::operator::{AdminError, ReplanIgnored};
use tickmark::{Accepted, EventState, Handler, Handlers, NewEvent, StepState};

use super::admin::{ops, three_steps};
use super::{engine, quick_worker};
use crate::test_steps::Record;
use crate::TestDb;

/// The build before the deploy: a handler for refunds only.
fn before_the_deploy() -> Handlers {
    Handlers::new().on(
        "shop",
        "order.refunded",
        Handler::new().named_step("refund", Record::default()),
    )
}

/// Events of a kind no handler took are re-planned once the handler is
/// deployed, run each step once, and leave an audit row; a second re-plan
/// finds nothing; kinds still without a handler stay ignored.
pub async fn ignored_events_run_once_after_a_deploy_adds_their_handler(db: TestDb) {
    let old = engine(&db, before_the_deploy());
    let mut ignored = Vec::new();
    for n in 0..3 {
        let event = NewEvent::with_id("shop", format!("evt_paid_{n}"), "order.paid", json!({}));
        let Accepted::Ignored { seq } = old.accept(event).await.unwrap() else {
            panic!("no handler takes order.paid yet: the event is ignored");
        };
        ignored.push(seq);
    }
    let Accepted::Ignored { seq: unhandled } = old
        .accept(NewEvent::with_id(
            "shop",
            "evt_shipped",
            "order.shipped",
            json!({}),
        ))
        .await
        .unwrap()
    else {
        panic!("order.shipped has no handler in either build");
    };

    // The deploy: order.paid has a handler now.
    let new = engine(&db, three_steps());
    let request = ReplanIgnored {
        source: "shop",
        kind: None,
        since: None,
        actor: ops("handler for order.paid deployed"),
    };
    let report = new.replan_ignored(&request).await.unwrap();
    assert_eq!(report.replanned, 3, "{report:?}");
    assert_eq!(report.kinds, ["order.paid"]);

    new.worker(quick_worker("w"))
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
    for n in 0..3 {
        let id = format!("evt_paid_{n}");
        let status = new.event_status("shop", &id).await.unwrap().unwrap();
        assert_eq!(status.state(), EventState::Done, "{id}");
        assert_eq!(status.steps.len(), 3);
        for step in &status.steps {
            assert_eq!(step.state, StepState::Done, "{id} {}", step.step);
            assert_eq!(
                db.probe.runs(&id, &step.step).await,
                1,
                "{id} {}",
                step.step
            );
        }
    }
    let audit = db.store.audit_list(ignored[0]).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].action, "replan");
    assert_eq!(
        db.store.event_get(unhandled).await.unwrap().unwrap().state,
        EventState::Ignored
    );

    // Nothing is left to re-plan, and nothing runs again.
    let again = new.replan_ignored(&request).await.unwrap();
    assert_eq!(again.replanned, 0, "{again:?}");
    assert_eq!(db.probe.runs("evt_paid_0", "first").await, 1);
}

/// Naming a kind no handler takes is refused with what to do, and changes
/// nothing.
pub async fn a_replan_of_a_kind_without_a_handler_is_refused(db: TestDb) {
    let engine = engine(&db, before_the_deploy());
    let Accepted::Ignored { seq } = engine
        .accept(NewEvent::with_id(
            "shop",
            "evt_paid",
            "order.paid",
            json!({}),
        ))
        .await
        .unwrap()
    else {
        panic!("no handler takes order.paid: the event is ignored");
    };
    let error = engine
        .replan_ignored(&ReplanIgnored {
            source: "shop",
            kind: Some("order.paid"),
            since: None,
            actor: ops("too early"),
        })
        .await
        .unwrap_err();
    assert!(matches!(error, AdminError::Refused(_)), "{error:?}");
    assert!(error.to_string().contains("Handlers::on"), "{error}");
    assert_eq!(
        db.store.event_get(seq).await.unwrap().unwrap().state,
        EventState::Ignored
    );
}
