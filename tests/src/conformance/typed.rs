//! Typed payloads and outputs: a payload that does not decode into a step's
//! type parks the event with serde's message (after one attempt, never ten),
//! and an operator's retry runs it once a fixed build is deployed; typed
//! outputs read only what a step declared, and `Engine::new` refuses a
//! declared read of a step that is not an earlier one.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::operator::{Operations, RetryRequest};
use tickmark::{
    Engine, EventState, Handler, Handlers, NewEvent, Output, RetryPolicy, Step, StepContext,
    StepResult, StepState,
};
use tickmark_core::handler::HandlerConfigError;

use super::admin::ops;
use super::{engine, quick_worker};
use crate::probe::Probe;
use crate::test_steps::Record;
use crate::TestDb;

/// Which build of [`CreditInvoice`] runs: the one first deployed, whose type
/// wants `amount_paid` as a number, or the fix, which also takes the text
/// some senders write. (A test cannot redeploy its binary; a resource the
/// step reads stands for the new code behind the same step type.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// `amount_paid` is an `i64`.
    First,
    /// `amount_paid` is an `i64` or a text of digits.
    Fixed,
}

/// The invoice as the first build reads it.
#[derive(Debug, Deserialize)]
pub struct StrictInvoice {
    /// Stripe's layout: `data.object`.
    pub data: StrictData,
}

/// `data` of a [`StrictInvoice`].
#[derive(Debug, Deserialize)]
pub struct StrictData {
    /// The invoice.
    pub object: StrictObject,
}

/// `data.object` of a [`StrictInvoice`].
#[derive(Debug, Deserialize)]
pub struct StrictObject {
    /// Who pays.
    pub customer: String,
    /// Cents, as a number.
    pub amount_paid: i64,
}

/// A number, or a text of digits (the fixed build's leniency).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Cents {
    /// `1200`.
    Number(i64),
    /// `"1200"`.
    Text(String),
}

/// The invoice as the fixed build reads it.
#[derive(Debug, Deserialize)]
pub struct LenientInvoice {
    /// Stripe's layout: `data.object`.
    pub data: LenientData,
}

/// `data` of a [`LenientInvoice`].
#[derive(Debug, Deserialize)]
pub struct LenientData {
    /// The invoice.
    pub object: LenientObject,
}

/// `data.object` of a [`LenientInvoice`].
#[derive(Debug, Deserialize)]
pub struct LenientObject {
    /// Who pays.
    pub customer: String,
    /// Cents, as a number or a text.
    pub amount_paid: Cents,
}

/// What [`CreditInvoice`] hands on.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Credit {
    /// Who was credited.
    pub customer: String,
    /// How much.
    pub credited: i64,
}

/// The output of the step named `credit`, typed.
pub const CREDIT: Output<Credit> = Output::new("credit");

/// Records its run, decodes the payload with the type of the [`Build`]
/// resource, and outputs the [`Credit`].
#[derive(Debug, Serialize, Deserialize)]
pub struct CreditInvoice;

#[typetag::serde(name = "test_credit_invoice")]
#[async_trait::async_trait]
impl Step for CreditInvoice {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let probe = ctx.resource::<Probe>()?;
        probe
            .record_run(&ctx.event().id, ctx.step_name(), ctx.attempt())
            .await?;
        let credit = match ctx.resource::<Build>()? {
            Build::First => {
                let invoice = ctx.payload::<StrictInvoice>()?.data.object;
                Credit {
                    customer: invoice.customer,
                    credited: invoice.amount_paid,
                }
            }
            Build::Fixed => {
                let invoice = ctx.payload::<LenientInvoice>()?.data.object;
                let credited = match invoice.amount_paid {
                    Cents::Number(cents) => cents,
                    Cents::Text(text) => text
                        .parse()
                        .map_err(|_| tickmark::StepError::terminal("amount_paid is no number"))?,
                };
                Credit {
                    customer: invoice.customer,
                    credited,
                }
            }
        };
        tickmark::output(&credit)
    }
}

/// Records its run, reads the [`CREDIT`] output it declares, and outputs it back.
#[derive(Debug, Serialize, Deserialize)]
pub struct Receipt {
    /// Declare the read of [`CREDIT`] (a step that forgets it parks).
    pub declares: bool,
}

#[typetag::serde(name = "test_receipt")]
#[async_trait::async_trait]
impl Step for Receipt {
    fn reads(&self) -> Vec<&str> {
        if self.declares {
            vec![CREDIT.step()]
        } else {
            Vec::new()
        }
    }

    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let probe = ctx.resource::<Probe>()?;
        probe
            .record_run(&ctx.event().id, ctx.step_name(), ctx.attempt())
            .await?;
        let credit = ctx.output_of(CREDIT)?;
        tickmark::output(&json!({ "receipt_for": credit.credited, "to": credit.customer }))
    }
}

/// Records its run, then `?` on `serde_json::from_value` into
/// [`StrictInvoice`]: no `ctx.payload`, a plain decode as steps write it.
#[derive(Debug, Serialize, Deserialize)]
pub struct DecodeWithQuestionMark;

#[typetag::serde(name = "test_decode_with_question_mark")]
#[async_trait::async_trait]
impl Step for DecodeWithQuestionMark {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let probe = ctx.resource::<Probe>()?;
        probe
            .record_run(&ctx.event().id, ctx.step_name(), ctx.attempt())
            .await?;
        let invoice: StrictInvoice = serde_json::from_value(ctx.event().payload.clone())?;
        Ok(json!({ "credited": invoice.data.object.amount_paid }))
    }
}

fn invoice_handlers() -> Handlers {
    Handlers::new().on(
        "stripe",
        "invoice.paid",
        Handler::new()
            .named_step("first", Record::default())
            .named_step("credit", CreditInvoice)
            .named_step("receipt", Receipt { declares: true })
            // Were a decode failure retried, the first build would spend
            // all ten attempts (quickly) and dead-letter the event.
            .retry(
                RetryPolicy::attempts(10)
                    .delays(Duration::from_millis(5), Duration::from_millis(5)),
            ),
    )
}

fn built(db: &TestDb, handlers: Handlers, build: Build) -> Engine {
    engine(db, handlers).with_resource(build)
}

async fn accept_invoice(engine: &Engine, id: &str, amount_paid: serde_json::Value) {
    let payload =
        json!({ "data": { "object": { "customer": "cus_1", "amount_paid": amount_paid } } });
    engine
        .accept(NewEvent::with_id("stripe", id, "invoice.paid", payload))
        .await
        .expect("accept");
}

async fn run_until_idle(engine: &Engine) -> tickmark::WorkerStats {
    engine
        .worker(quick_worker("w"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .unwrap()
}

/// A payload the step's type does not fit parks the event after one run of
/// the step, with serde's message (the path, the reason, the type); the
/// steps before it stay done. The fixed build, after an operator's retry,
/// resumes at that step and finishes the event.
pub async fn a_payload_that_does_not_decode_parks_until_a_fixed_build_is_retried(db: TestDb) {
    let first_build = built(&db, invoice_handlers(), Build::First);
    accept_invoice(&first_build, "in_text", json!("1200")).await;
    let stats = run_until_idle(&first_build).await;
    assert_eq!((stats.events_parked, stats.events_dead), (1, 0));
    assert_eq!(
        db.probe.runs("in_text", "credit").await,
        1,
        "one attempt, not ten"
    );

    let parked = db.record_of("stripe", "in_text").await;
    assert_eq!((parked.state, parked.next_step), (EventState::Parked, 1));
    let error = parked.last_error.clone().unwrap();
    for says in [
        "step `credit` cannot handle this event in this build",
        "does not decode into `",
        "StrictInvoice`",
        "at `data.object.amount_paid`",
        "invalid type: string \"1200\", expected i64",
        "deploy a fix, then retry the event",
    ] {
        assert!(error.contains(says), "`{says}` in: {error}");
    }
    let steps = db.store.step_status(parked.event.seq).await.unwrap();
    assert_eq!(steps[0].state, StepState::Done);
    assert_eq!(steps[1].state, StepState::Parked);
    assert_eq!(steps[1].last_error.as_deref(), Some(error.as_str()));
    assert_eq!(steps[2].state, StepState::NotRun);

    let fixed_build = built(&db, invoice_handlers(), Build::Fixed);
    let retried = db
        .store
        .event_retry(&RetryRequest {
            event_seq: parked.event.seq,
            from_step: None,
            force: false,
            actor: ops("deployed the lenient invoice type"),
        })
        .await
        .unwrap();
    assert_eq!((retried.state, retried.next_step), (EventState::Pending, 1));
    let stats = run_until_idle(&fixed_build).await;
    assert_eq!(stats.events_done, 1);

    let done = db.record_of("stripe", "in_text").await;
    assert_eq!(done.state, EventState::Done);
    let steps = db.store.step_status(done.event.seq).await.unwrap();
    assert_eq!(
        steps[1].output,
        Some(json!({ "customer": "cus_1", "credited": 1200 }))
    );
    assert_eq!(
        steps[2].output,
        Some(json!({ "receipt_for": 1200, "to": "cus_1" }))
    );
    assert_eq!(
        db.probe.runs("in_text", "first").await,
        1,
        "done stays done"
    );
    assert_eq!(db.probe.runs("in_text", "credit").await, 2);
    assert_eq!(db.probe.runs("in_text", "receipt").await, 1);
}

/// `?` on a `serde_json` decode error (no `ctx.payload`) parks too: one run,
/// not the ten the retry policy allows.
pub async fn a_question_mark_on_a_serde_error_parks_after_one_attempt(db: TestDb) {
    let handlers = || {
        Handlers::new().on(
            "stripe",
            "invoice.paid",
            Handler::new()
                .named_step("decode", DecodeWithQuestionMark)
                .retry(
                    RetryPolicy::attempts(10)
                        .delays(Duration::from_millis(5), Duration::from_millis(5)),
                ),
        )
    };
    let engine = engine(&db, handlers());
    accept_invoice(&engine, "in_missing", json!(null)).await;
    let stats = run_until_idle(&engine).await;
    assert_eq!((stats.events_parked, stats.events_dead), (1, 0));
    assert_eq!(
        db.probe.runs("in_missing", "decode").await,
        1,
        "one attempt, not ten"
    );
    let parked = db.record_of("stripe", "in_missing").await;
    assert_eq!(parked.state, EventState::Parked);
    let error = parked.last_error.unwrap();
    assert!(
        error.contains("the data does not decode")
            && error.contains("invalid type: null, expected i64"),
        "{error}"
    );
}

/// A step that reads a typed output it did not declare in `reads()` parks
/// the event (so `Engine::new` checks every typed read); declared, it reads
/// the earlier step's output.
pub async fn a_typed_output_is_read_only_when_declared(db: TestDb) {
    let handlers = |declares| {
        Handlers::new().on(
            "stripe",
            "invoice.paid",
            Handler::new()
                .named_step("credit", CreditInvoice)
                .named_step("receipt", Receipt { declares }),
        )
    };
    let undeclared = built(&db, handlers(false), Build::First);
    accept_invoice(&undeclared, "in_undeclared", json!(700)).await;
    let stats = run_until_idle(&undeclared).await;
    assert_eq!(stats.events_parked, 1);
    let parked = db.record_of("stripe", "in_undeclared").await;
    assert_eq!((parked.state, parked.next_step), (EventState::Parked, 1));
    let error = parked.last_error.unwrap();
    assert!(
        error.contains("reads the output of `credit` without declaring it")
            && error.contains("fn reads(&self)"),
        "{error}"
    );

    let declared = built(&db, handlers(true), Build::First);
    accept_invoice(&declared, "in_declared", json!(700)).await;
    assert_eq!(run_until_idle(&declared).await.events_done, 1);
    let done = db.record_of("stripe", "in_declared").await;
    let steps = db.store.step_status(done.event.seq).await.unwrap();
    assert_eq!(
        steps[1].output,
        Some(json!({ "receipt_for": 700, "to": "cus_1" }))
    );
}

/// `Engine::new` refuses a handler whose step reads the output of a step
/// that is missing, or comes after it, naming the handler, the step, the
/// name read and the steps before it.
pub async fn a_read_of_a_missing_or_later_step_is_refused_by_engine_new(db: TestDb) {
    let refusal = |handler: Handler| {
        Engine::new(
            db.store.clone(),
            Handlers::new().on("stripe", "invoice.paid", handler),
        )
        .map(|_| ())
        .unwrap_err()
    };
    let missing = refusal(
        Handler::new()
            .named_step("credit_account", CreditInvoice)
            .named_step("receipt", Receipt { declares: true }),
    );
    assert!(
        matches!(&missing, HandlerConfigError::UnknownOutput { step, output, .. }
            if step == "receipt" && output == "credit"),
        "{missing:?}"
    );
    assert!(
        missing.to_string().contains(
            "step `receipt` of (stripe, invoice.paid) reads the output of step `credit` \
             (Step::reads), but no step before it is named `credit`; the steps before it: [credit_account]"
        ),
        "{missing}"
    );
    let later = refusal(
        Handler::new()
            .named_step("receipt", Receipt { declares: true })
            .named_step("credit", CreditInvoice),
    );
    assert!(
        later
            .to_string()
            .contains("no step before it is named `credit`; the steps before it: []"),
        "{later}"
    );
}
