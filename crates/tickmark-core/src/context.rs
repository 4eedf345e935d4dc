//! What a running step can see: its event (raw, or decoded into the step's
//! type), its key, earlier outputs (raw, or typed through an [`Output`] key
//! checked when the engine is built), its attempt, a cancellation token, and
//! (for transactional steps) the engine's transaction.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::privacy::{EraseReport, Subject};
use crate::resources::Resources;
use crate::step::StepError;
use tickmark_driver::event::{Accepted, Event, NewEvent};
use tickmark_driver::store::{EventRecord, Lease, StepTransaction, Store, StoreError};

/// Progress reports closer together than this are not written (the latest
/// state of a fast loop is enough for an operator).
pub const PROGRESS_MIN_INTERVAL: Duration = Duration::from_millis(250);

/// Writes a running step's progress to its event row, under its lease.
pub struct ProgressReporter<'a> {
    store: &'a dyn Store,
    lease: Lease,
    last_written: Mutex<Option<Instant>>,
}

impl<'a> ProgressReporter<'a> {
    #[doc(hidden)]
    pub fn new(store: &'a dyn Store, lease: Lease) -> Self {
        Self {
            store,
            lease,
            last_written: Mutex::new(None),
        }
    }
}

/// Where a step's follow-up events go ([`StepContext::enqueue`]): the
/// engine's inbox, which knows the handlers. The runner lends one to each
/// step; the context itself knows nothing of handlers or the inbox.
#[async_trait::async_trait]
pub trait FollowUps: Send + Sync {
    /// Accept `event` as the receiver would, or refuse it (a kind nobody
    /// handles would be recorded as ignored and never run).
    async fn accept(&self, event: &NewEvent) -> Result<Accepted, StepError>;

    /// Erase `subject` as [`Engine::erase_subject`](crate::Engine::erase_subject)
    /// does, leaving out event `except` (the asking step's own), waiting for
    /// no running event: those are in the report, and the step retries.
    async fn erase_subject(
        &self,
        subject: &Subject,
        reason: &str,
        except: i64,
    ) -> Result<EraseReport, StepError>;

    /// The events recorded with `subject`, not erased, payloads opened.
    async fn subject_events(&self, subject: &Subject) -> Result<Vec<EventRecord>, StepError>;
}

/// The outputs of the steps of one event that are already marked done, by step name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutputs(BTreeMap<String, serde_json::Value>);

impl StepOutputs {
    /// The stored output of the earlier step `name`, if it is done.
    pub fn get(&self, name: &str) -> Option<&serde_json::Value> {
        self.0.get(name)
    }

    /// Record a step's output (the engine does this after each mark).
    pub fn insert(&mut self, name: String, output: serde_json::Value) {
        self.0.insert(name, output);
    }

    /// Outputs by step name, for testing a step on its own.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, serde_json::Value)>) -> Self {
        Self(pairs.into_iter().collect())
    }

    /// How many outputs are recorded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no step is done yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A typed reference to the output of an earlier step of the handler: the
/// step's name in the handler and the type its output decodes into, written
/// once and used by every step that reads it.
///
/// A step reads it with [`StepContext::output_of`] and declares it in
/// [`Step::reads`](crate::Step::reads), so that `Engine::new` refuses a
/// handler where no earlier step has that name (a typo, a step moved after
/// its reader). The writing step returns a value of the type, e.g. with
/// [`tickmark::output`](crate::output).
///
/// ```
/// # use serde::{Deserialize, Serialize};
/// use tickmark::Output;
///
/// #[derive(Debug, Serialize, Deserialize)]
/// struct Credit {
///     customer: String,
///     credited: i64,
/// }
///
/// const CREDIT: Output<Credit> = Output::new("credit_account");
/// assert_eq!(CREDIT.step(), "credit_account");
/// ```
pub struct Output<T> {
    step: &'static str,
    decodes_into: PhantomData<fn() -> T>,
}

impl<T> Output<T> {
    /// The output of the handler's step named `step`, decoded into `T`.
    pub const fn new(step: &'static str) -> Self {
        Self {
            step,
            decodes_into: PhantomData,
        }
    }

    /// The name of the step that writes it, as the handler names it.
    pub const fn step(&self) -> &'static str {
        self.step
    }
}

impl<T> Clone for Output<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Output<T> {}

impl<T> fmt::Debug for Output<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Output<{}>({:?})", std::any::type_name::<T>(), self.step)
    }
}

/// Decode `value` into `T`, or say where and why not: serde's message with
/// the path to the value that did not fit (`data.object.amount_paid`).
fn decode<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if path == "." {
            inner.to_string()
        } else {
            format!("at `{path}`: {inner}")
        }
    })
}

/// Everything a step receives when it runs.
pub struct StepContext<'a> {
    event: &'a Event,
    step_name: &'a str,
    idempotency_key: String,
    outputs: &'a StepOutputs,
    attempt: u32,
    cancellation: CancellationToken,
    transaction: Option<&'a mut StepTransaction>,
    resources: &'a Resources,
    progress: Option<ProgressReporter<'a>>,
    follow_ups: Option<&'a dyn FollowUps>,
    /// The earlier steps the step declared it reads ([`Step::reads`](crate::Step::reads));
    /// `None` in a context built by hand, which lets it read any.
    declared_reads: Option<Vec<&'a str>>,
}

impl<'a> StepContext<'a> {
    /// Assemble a context. The engine does this; tests of a single step can too.
    pub fn new(
        event: &'a Event,
        step_name: &'a str,
        outputs: &'a StepOutputs,
        attempt: u32,
        cancellation: CancellationToken,
        transaction: Option<&'a mut StepTransaction>,
        resources: &'a Resources,
    ) -> Self {
        Self {
            idempotency_key: crate::idempotency_key(&event.source, &event.id, step_name),
            event,
            step_name,
            outputs,
            attempt,
            cancellation,
            transaction,
            resources,
            progress: None,
            follow_ups: None,
            declared_reads: None,
        }
    }

    /// Let [`output_of`](Self::output_of) read only the outputs the step
    /// declared in [`Step::reads`](crate::Step::reads) (the engine does this).
    pub fn with_declared_reads(mut self, reads: Vec<&'a str>) -> Self {
        self.declared_reads = Some(reads);
        self
    }

    #[doc(hidden)]
    pub fn with_follow_ups(mut self, follow_ups: &'a dyn FollowUps) -> Self {
        self.follow_ups = Some(follow_ups);
        self
    }

    /// Accept a follow-up event into the inbox, as the receiver would: it is
    /// recorded once and its own handler's steps run later, in any worker.
    /// Give it a dedup key derived from this step's idempotency key (e.g.
    /// `NewEvent::with_id("outbox", ctx.idempotency_key(), …)`) and a re-run
    /// of this step is a duplicate, not a second event.
    pub async fn enqueue(&self, event: NewEvent) -> Result<Accepted, StepError> {
        let Some(follow_ups) = self.follow_ups else {
            return Err(StepError::retryable(
                "this context has no inbox (built outside a worker)",
            ));
        };
        follow_ups.accept(&event).await
    }

    /// Erase what the engine holds about `subject`, as
    /// [`Engine::erase_subject`](crate::Engine::erase_subject) does, except
    /// this step's own event (a compliance webhook's, which is running).
    /// Events of the subject that are running are left and named in the
    /// report: return a retryable error to erase them on a later attempt.
    pub async fn erase_subject(
        &self,
        subject: &Subject,
        reason: &str,
    ) -> Result<EraseReport, StepError> {
        let Some(follow_ups) = self.follow_ups else {
            return Err(StepError::retryable(
                "this context has no inbox (built outside a worker)",
            ));
        };
        follow_ups
            .erase_subject(subject, reason, self.event.seq)
            .await
    }

    /// The events the engine holds about `subject` (not erased), with
    /// their payloads: what a data request is answered with.
    pub async fn subject_events(&self, subject: &Subject) -> Result<Vec<EventRecord>, StepError> {
        let Some(follow_ups) = self.follow_ups else {
            return Err(StepError::retryable(
                "this context has no inbox (built outside a worker)",
            ));
        };
        follow_ups.subject_events(subject).await
    }

    #[doc(hidden)]
    pub fn with_progress(mut self, reporter: ProgressReporter<'a>) -> Self {
        self.progress = Some(reporter);
        self
    }

    /// Report how far the step is (`fraction` from 0 to 1) and what it is
    /// doing; it shows in the step-status table (`progress`,
    /// `progress_message`) while the step runs. Reports closer together than
    /// [`PROGRESS_MIN_INTERVAL`] are dropped. A lost lease is a retryable
    /// error (the step is being cancelled anyway).
    pub async fn progress(&self, fraction: f32, message: &str) -> Result<(), StepError> {
        let Some(reporter) = &self.progress else {
            return Ok(());
        };
        {
            let mut last = reporter
                .last_written
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < PROGRESS_MIN_INTERVAL) {
                return Ok(());
            }
            *last = Some(Instant::now());
        }
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let message: String = message.chars().take(200).collect();
        match reporter
            .store
            .event_progress(&reporter.lease, fraction, &message)
            .await
        {
            Ok(()) => Ok(()),
            Err(StoreError::LeaseLost { .. }) => Err(StepError::retryable(
                "lease lost while reporting progress; the step is being cancelled",
            )),
            Err(error) => {
                tracing::debug!(%error, "progress not recorded");
                Ok(())
            }
        }
    }

    /// The event being handled.
    pub fn event(&self) -> &Event {
        self.event
    }

    /// The event's payload, decoded into the step's own type:
    /// `let invoice: InvoiceEvent = ctx.payload()?;`.
    ///
    /// A payload that does not decode **parks** the event
    /// ([`StepError::park`]) with serde's message, the path to the value that
    /// did not fit and the type's name: retrying the same payload would fail
    /// the same way. Deploy a build whose type accepts it (an `Option`, a
    /// `#[serde(default)]`), then retry the event (`tickmark events retry`);
    /// it resumes at this step.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T, StepError> {
        decode(&self.event.payload).map_err(|why| {
            StepError::park(format!(
                "the payload of {} event `{}` does not decode into `{}`: {why}",
                self.event.source,
                self.event.id,
                std::any::type_name::<T>()
            ))
        })
    }

    /// This step's name within the handler.
    pub fn step_name(&self) -> &str {
        self.step_name
    }

    /// `{source}:{event id}:{step name}`: identical on every attempt, in every
    /// worker. Pass it to external services (`Idempotency-Key`, file names).
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// The output of the earlier step `name`, if it is done.
    pub fn output(&self, name: &str) -> Option<&serde_json::Value> {
        self.outputs.get(name)
    }

    /// The output of the earlier step `name`, deserialised. A missing output
    /// is a terminal error; one that does not decode into `T` parks the event
    /// (a build whose types fit it will read it). Unchecked when the engine
    /// is built: prefer [`output_of`](Self::output_of).
    pub fn output_as<T: DeserializeOwned>(&self, name: &str) -> Result<T, StepError> {
        let value = self.outputs.get(name).ok_or_else(|| {
            StepError::terminal(format!("step `{name}` has no stored output for this event"))
        })?;
        decode(value).map_err(|why| {
            StepError::park(format!(
                "the output of step `{name}` does not decode into `{}`: {why}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The output of an earlier step, typed by its [`Output`] key. The step
    /// must name it in [`Step::reads`](crate::Step::reads), which
    /// `Engine::new` checks against the handler; one it did not declare parks
    /// the event, with a message that says what to add (in a context the
    /// engine built: one built by hand with [`StepContext::new`], for a
    /// step's own test, reads any). An output that does not decode into `T`
    /// parks the event too; a missing one is a terminal failure.
    pub fn output_of<T: DeserializeOwned>(&self, output: Output<T>) -> Result<T, StepError> {
        let name = output.step();
        if let Some(declared) = &self.declared_reads {
            if !declared.contains(&name) {
                return Err(StepError::park(format!(
                    "step `{}` reads the output of `{name}` without declaring it: add `{name}` \
                     to its `fn reads(&self)`, so that Engine::new checks that an earlier step \
                     of the handler has that name",
                    self.step_name
                )));
            }
        }
        self.output_as(name)
    }

    /// All outputs of the steps marked done so far.
    pub fn outputs(&self) -> &StepOutputs {
        self.outputs
    }

    /// 1 on the first attempt, counted durably: it survives restarts.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Fires when this worker lost the event's lease or the engine is shutting
    /// down past its grace period. Long steps should check it (or `select!` on
    /// `cancelled()`) and return; the engine drops a step that does not.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancellation
    }

    /// Shorthand for `self.cancellation().is_cancelled()`.
    pub fn is_cancelled(&self) -> bool {
        self.cancellation.is_cancelled()
    }

    /// A shared resource registered with
    /// [`Engine::with_resource`](crate::Engine::with_resource). A missing one is
    /// a retryable failure: the process was started without it, and a fixed
    /// deploy will pick the step up again.
    pub fn resource<T: Send + Sync + 'static>(&self) -> Result<&T, StepError> {
        self.resources.get::<T>().ok_or_else(|| {
            StepError::retryable(format!(
                "resource `{}` was not registered with Engine::with_resource in this process",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The engine's database transaction, in which the step's mark will commit.
    /// Only [transactional](crate::Step::transactional) steps have one; asking
    /// from any other step is a terminal error (a bug in the step).
    pub fn transaction(&mut self) -> Result<&mut StepTransaction, StepError> {
        let step = self.step_name;
        self.transaction.as_deref_mut().ok_or_else(|| {
            StepError::terminal(format!(
                "step `{step}` asked for the engine's transaction but does not declare \
                 `fn transactional(&self) -> bool {{ true }}`"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;
    use crate::step::FailureKind;

    #[derive(Debug, Deserialize)]
    struct Invoice {
        data: Data,
    }

    #[derive(Debug, Deserialize)]
    struct Data {
        object: Object,
    }

    #[derive(Debug, Deserialize)]
    struct Object {
        amount_paid: i64,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Credit {
        credited: i64,
    }

    const CREDIT: Output<Credit> = Output::new("credit");

    fn event(payload: serde_json::Value) -> Event {
        Event {
            seq: 1,
            source: "stripe".into(),
            id: "evt_1".into(),
            kind: "invoice.paid".into(),
            payload,
            received_at: chrono::Utc::now(),
        }
    }

    fn with_context<R>(
        payload: serde_json::Value,
        reads: Option<Vec<&str>>,
        check: impl FnOnce(&StepContext<'_>) -> R,
    ) -> R {
        let event = event(payload);
        let outputs = StepOutputs::from_pairs([("credit".to_owned(), json!({"credited": 1200}))]);
        let resources = Resources::default();
        let mut ctx = StepContext::new(
            &event,
            "receipt",
            &outputs,
            1,
            CancellationToken::new(),
            None,
            &resources,
        );
        if let Some(reads) = reads {
            ctx = ctx.with_declared_reads(reads);
        }
        check(&ctx)
    }

    #[test]
    fn a_payload_decodes_into_the_steps_type() {
        let amount = with_context(
            json!({"data": {"object": {"amount_paid": 1200, "currency": "eur"}}}),
            None,
            |ctx| ctx.payload::<Invoice>().map(|i| i.data.object.amount_paid),
        );
        assert_eq!(amount.unwrap(), 1200);
    }

    #[test]
    fn a_payload_that_does_not_decode_parks_with_the_path_reason_and_type() {
        for (payload, says) in [
            (
                json!({"data": {"object": {"amount_paid": "1200"}}}),
                "at `data.object.amount_paid`: invalid type: string \"1200\", expected i64",
            ),
            (
                json!({"data": {"object": {}}}),
                "at `data.object`: missing field `amount_paid`",
            ),
            (json!(null), "invalid type: null, expected struct Invoice"),
        ] {
            let error = with_context(payload.clone(), None, |ctx| {
                ctx.payload::<Invoice>().unwrap_err()
            });
            assert_eq!(error.kind(), FailureKind::Park, "{error}");
            let message = error.message();
            assert!(message.contains(says), "{payload}: {message}");
            assert!(
                message.contains("the payload of stripe event `evt_1` does not decode into `")
                    && message.contains("::Invoice`"),
                "{message}"
            );
        }
    }

    #[test]
    fn a_typed_output_is_read_when_declared_and_parks_when_not() {
        let read = with_context(json!({}), Some(vec!["credit"]), |ctx| ctx.output_of(CREDIT));
        assert_eq!(read.unwrap(), Credit { credited: 1200 });

        let undeclared = with_context(json!({}), Some(vec![]), |ctx| {
            ctx.output_of(CREDIT).unwrap_err()
        });
        assert!(undeclared.parks_event(), "{undeclared}");
        assert!(
            undeclared
                .message()
                .contains("step `receipt` reads the output of `credit` without declaring it"),
            "{undeclared}"
        );

        // A context built by hand (a step's own unit test) reads any output.
        let by_hand = with_context(json!({}), None, |ctx| ctx.output_of(CREDIT));
        assert_eq!(by_hand.unwrap(), Credit { credited: 1200 });
    }

    #[test]
    fn an_output_that_does_not_decode_parks_and_a_missing_one_is_terminal() {
        let mistyped = with_context(json!({}), None, |ctx| {
            ctx.output_as::<Vec<String>>("credit").unwrap_err()
        });
        assert!(mistyped.parks_event(), "{mistyped}");
        assert!(
            mistyped
                .message()
                .contains("the output of step `credit` does not decode into `"),
            "{mistyped}"
        );
        let missing = with_context(json!({}), None, |ctx| {
            ctx.output_as::<Credit>("charge").unwrap_err()
        });
        assert!(missing.is_terminal(), "{missing}");
    }
}
