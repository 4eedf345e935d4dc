//! [`CrashTest`]: run one event through your handler once cleanly, then
//! again with a crash at every step boundary (after each step's effect and
//! before its mark; after each mark), each time on a fresh database, and
//! compare your end state with the clean run's.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tickmark_driver::event::{EventState, NewEvent};
use tickmark_driver::store::Backend;

use super::boundaries::Crash;
use super::error::{BoxError, TestError};
use super::extra_calls::{self, AppliedCall, RunRecord};
use super::findings::{Finding, Findings};
use super::lock_wait;
use super::per_run::PerRun;
use super::test_engine::describe_steps;

/// One event, crashed at every step boundary of its handler.
///
/// `setup` builds a fresh [`TestEngine`](super::TestEngine) (your tables,
/// your resources, a fresh [`EffectLedger`](super::EffectLedger) attached)
/// for every run; `end_state` reads what your application ended with (rows,
/// a ledger's effects), to compare with the clean run's.
///
/// `setup` returns the run's engine, or the engine and a context of yours,
/// `(TestEngine, C)` ([`PerRun`]); `end_state` gets back what `setup`
/// returned for its own run, so it can read what that run's `setup` made
/// (its ledger, a temp dir) without a shared slot between the two closures.
pub struct CrashTest<S, E> {
    event: NewEvent,
    setup: S,
    end_state: E,
    within: Duration,
    advance: Duration,
}

/// What a [`CrashTest`] ran.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CrashReport {
    /// The event's steps, in the order they ran cleanly, and whether each is transactional.
    pub steps: Vec<(String, bool)>,
    /// Each crash run: the step, where it crashed, and whether the crash
    /// happened (a step on a branch not taken never reaches its boundary).
    pub runs: Vec<(String, Crash, bool)>,
    /// The clean run's end state, as `{:?}` shows it.
    pub end_state: String,
}

impl<S, SF, R, E, EF, T> CrashTest<S, E>
where
    S: Fn() -> SF,
    SF: Future<Output = Result<R, BoxError>>,
    R: PerRun,
    E: Fn(R) -> EF,
    EF: Future<Output = Result<T, BoxError>>,
    T: PartialEq + fmt::Debug,
{
    /// Crash `event`'s handler at every step boundary; `setup` and
    /// `end_state` as above: `setup` returns a `TestEngine` or a
    /// `(TestEngine, C)`, and `end_state` takes the same.
    pub fn new(event: NewEvent, setup: S, end_state: E) -> Self {
        Self {
            event,
            setup,
            end_state,
            within: Duration::from_secs(30),
            advance: Duration::ZERO,
        }
    }

    /// How long each run may take before it fails as not idle (30 s).
    pub fn within(mut self, limit: Duration) -> Self {
        self.within = limit;
        self
    }

    /// Move each run's fake clock on by `by` once the event is delivered
    /// (SQLite only; none by default), so an event its handler holds back
    /// for up to `by` (a debounce window, say) is due when the run starts.
    /// Without it such an event is still pending when the run goes idle,
    /// and the clean run reports it unfinished.
    pub fn advance_after_delivery(mut self, by: Duration) -> Self {
        self.advance = by;
        self
    }

    /// Run it: `Ok` with what ran when every crash left the clean run's end
    /// state and the ledger saw no double effect; otherwise
    /// [`TestError::NotIdempotent`], each finding naming the step and the fix.
    /// A run that does not go idle within [`within`](Self::within) is
    /// [`TestError::NotIdle`], except on SQLite while a transactional step
    /// is running: that is a finding, naming the lock such a step most
    /// likely waits for (its own transaction's, through a second connection).
    pub async fn run(self) -> Result<CrashReport, TestError> {
        let (source, id) = (self.event.source.clone(), self.event.dedup_key.clone());
        let mut findings = Vec::new();

        let clean = self.one_run(None).await?;
        if let Some(not_done) = clean.not_done {
            let fix = if clean.lock_wait.is_some() {
                lock_wait::FIX
            } else if clean.held_back {
                "if the handler holds the event back (a debounce window, a snooze, a \
                 not_before), move each run's clock past it with \
                 CrashTest::advance_after_delivery; otherwise make the handler succeed on one \
                 clean delivery first"
            } else {
                "make the handler succeed on one clean delivery first"
            };
            findings.push(Finding {
                step: clean
                    .lock_wait
                    .or(clean.last_step)
                    .unwrap_or_else(|| "(none)".to_owned()),
                crash: None,
                crashed_step: None,
                problem: format!("the event did not finish without any crash: {not_done}"),
                fix: fix.to_owned(),
            });
            return Err(not_idempotent(&source, &id, findings));
        }
        findings.extend(clean.ledger);
        let steps = clean.steps;
        let mut runs = Vec::new();

        for (position, (step, transactional)) in steps.iter().enumerate() {
            let last = position + 1 == steps.len();
            for crash in [Crash::BeforeMark, Crash::AfterMark] {
                if crash == Crash::AfterMark && last {
                    // After the last mark the event is done: nothing resumes.
                    continue;
                }
                let run = self.one_run(Some((step, crash))).await?;
                runs.push((step.clone(), crash, run.crashed));
                // The ledger's finding on this step names the double effect
                // and its fix (the key); an end state that differs by the
                // same effect is not reported again with the general fix
                // ("make the step transactional"), wrong for a call.
                let ledger_blamed_it = run.ledger.iter().any(|finding| finding.step == *step);
                // A later step that sent a call again after this one's
                // crash is that step's double effect, not this one's (whose
                // key may well be right): blamed on the step that was
                // running when the extra calls arrived.
                let reported: Vec<&str> = run.ledger.iter().map(|f| f.step.as_str()).collect();
                let redone = extra_calls::made_by_other_steps(
                    step,
                    crash,
                    &clean.record,
                    &run.record,
                    &reported,
                );
                let another_step_blamed = !redone.is_empty();
                findings.extend(run.ledger.into_iter().map(|mut finding| {
                    finding.crash = Some(crash);
                    finding.crashed_step = (finding.step != *step).then(|| step.clone());
                    finding
                }));
                findings.extend(redone);
                if let Some(not_done) = run.not_done {
                    let (blamed, fix) = match run.lock_wait {
                        Some(waited) => (waited, lock_wait::FIX),
                        None => (
                            step.clone(),
                            "a re-run must succeed where an earlier run already had its effect \
                             (treat \"already exists\" as done)",
                        ),
                    };
                    findings.push(Finding {
                        crashed_step: (blamed != *step).then(|| step.clone()),
                        step: blamed,
                        crash: Some(crash),
                        problem: format!("the event did not finish after the crash: {not_done}"),
                        fix: fix.to_owned(),
                    });
                } else if run.end_state != clean.end_state
                    && !ledger_blamed_it
                    && !another_step_blamed
                {
                    findings.push(differs(
                        step,
                        *transactional,
                        crash,
                        &run.end_state,
                        &clean.end_state,
                    ));
                }
            }
        }
        if findings.is_empty() {
            Ok(CrashReport {
                steps,
                runs,
                end_state: clean.end_state,
            })
        } else {
            Err(not_idempotent(&source, &id, findings))
        }
    }

    /// One run on a fresh test engine, crashing once at `crash` if given.
    async fn one_run(&self, crash: Option<(&str, Crash)>) -> Result<OneRun, TestError> {
        let per_run = (self.setup)().await.map_err(TestError::Setup)?;
        let kit = per_run.test_engine().clone();
        if let Some((step, at)) = crash {
            kit.crash_once(step, at);
        }
        kit.deliver(self.event.clone()).await?;
        if !self.advance.is_zero() {
            kit.advance(self.advance)?;
        }
        let (source, id) = (&self.event.source, &self.event.dedup_key);
        let ran = match kit.run_until_idle_within(self.within).await {
            Ok(ran) => ran,
            Err(TestError::NotIdle { within, active }) => {
                // The step still running at the deadline: the last of this
                // event's to start.
                let last = kit
                    .log()
                    .started()
                    .into_iter()
                    .rev()
                    .find(|s| &s.owner.source == source && &s.owner.event_id == id);
                return Err(match last {
                    Some(last) if last.transactional && kit.backend() == Backend::Sqlite => {
                        let step = last.owner.step;
                        let crashed_step = crash
                            .map(|(crashed, _)| crashed.to_owned())
                            .filter(|crashed| *crashed != step);
                        let finding =
                            lock_wait::stuck(step, crash.map(|(_, at)| at), crashed_step, within);
                        not_idempotent(source, id, vec![finding])
                    }
                    _ => TestError::NotIdle { within, active },
                });
            }
            Err(other) => return Err(other),
        };
        let status = kit.status(source, id).await?;
        let not_done = (status.state() != EventState::Done)
            .then(|| format!("{}; its steps: {}", status.state(), describe_steps(&status)));
        // Pending: due later (held back by its handler, or a retry's backoff).
        let held_back = status.state() == EventState::Pending;
        let lock_wait = not_done
            .as_ref()
            .and_then(|_| lock_wait::waited_for_the_lock(kit.backend(), &status));
        let started = kit.log().started();
        let mut steps: Vec<(String, bool)> = Vec::new();
        for started in started
            .iter()
            .filter(|s| &s.owner.source == source && &s.owner.event_id == id)
        {
            if !steps.iter().any(|(name, _)| *name == started.owner.step) {
                steps.push((started.owner.step.clone(), started.transactional));
            }
        }
        // Armed there, and a worker was killed (not merely asked to die).
        let crashed = ran.crashes > 0
            && crash.is_some_and(|(step, at)| {
                kit.log()
                    .crashes()
                    .iter()
                    .any(|point| point.step == step && point.at == at)
            });
        let ledger = match kit.check_ledger() {
            Ok(()) => Vec::new(),
            Err(TestError::DoubleEffect(violations)) => violations
                .iter()
                .map(|violation| Finding {
                    step: violation.step().to_owned(),
                    crash: None,
                    crashed_step: None,
                    problem: without_owner(&violation.to_string(), violation.step()),
                    fix: String::new(),
                })
                .collect(),
            Err(other) => return Err(other),
        };
        let record = RunRecord {
            calls: kit
                .ledger()
                .map(|ledger| AppliedCall::of(&ledger.calls()))
                .unwrap_or_default(),
            outputs: status
                .steps
                .iter()
                .filter_map(|step| Some((step.step.clone(), step.output.clone()?)))
                .collect(),
        };
        let end_state = (self.end_state)(per_run)
            .await
            .map_err(TestError::EndState)?;
        // The last step that started; if none did, the first the event has
        // (so a finding always names a step).
        let last_step = steps
            .last()
            .map(|(name, _)| name.clone())
            .or_else(|| status.steps.first().map(|step| step.step.clone()));
        Ok(OneRun {
            last_step,
            held_back,
            lock_wait,
            record,
            steps,
            not_done,
            crashed,
            ledger,
            end_state: format!("{end_state:?}"),
        })
    }
}

struct OneRun {
    steps: Vec<(String, bool)>,
    last_step: Option<String>,
    /// The event is pending: held back (due later), not failing.
    held_back: bool,
    /// The step that gave up waiting for SQLite's write lock (held by its
    /// own transaction), if one did.
    lock_wait: Option<String>,
    /// The calls the attached ledger applied, by the step that made them,
    /// and the steps' stored outputs.
    record: RunRecord,
    not_done: Option<String>,
    crashed: bool,
    ledger: Vec<Finding>,
    end_state: String,
}

/// A ledger violation's message without its "step `x` of event s/id "
/// opening: the finding names the step, the findings the event.
fn without_owner(message: &str, step: &str) -> String {
    message
        .strip_prefix(&format!("step `{step}` of event "))
        .and_then(|rest| rest.split_once(' '))
        .map_or_else(|| message.to_owned(), |(_event, rest)| rest.to_owned())
}

fn not_idempotent(source: &str, id: &str, findings: Vec<Finding>) -> TestError {
    TestError::NotIdempotent(Findings {
        event: format!("{source}/{id}"),
        findings,
    })
}

/// The end state after a crash differs from the clean run's: say why, by
/// where it crashed and whether the step is transactional.
fn differs(step: &str, transactional: bool, crash: Crash, got: &str, clean: &str) -> Finding {
    let states = format!("the end state is {got}, not {clean} as after one clean run");
    let (problem, fix) = match (crash, transactional) {
        (Crash::BeforeMark, false) => (
            format!(
                "it is not transactional, so it ran again after the crash and its effect happened twice: {states}"
            ),
            "make the step transactional and write through ctx.transaction() (the write then \
             commits with the mark, or not at all), or pass ctx.idempotency_key() to the service \
             it calls so the re-run is dropped there",
        ),
        (Crash::BeforeMark, true) => (
            format!(
                "it is transactional, but its effect survived the rollback of its transaction, \
                 so the re-run did it again: {states}"
            ),
            "write through ctx.transaction(), not through your application's own pool or \
             connection (which commits on its own, outside the step's transaction)",
        ),
        (Crash::AfterMark, _) => (
            format!("resuming at the next step after the crash changed the outcome: {states}"),
            "a later step must read what this one did from its stored output \
             (ctx.output_of), not from anything kept in memory between steps",
        ),
    };
    Finding {
        step: step.to_owned(),
        crash: Some(crash),
        crashed_step: None,
        problem,
        fix: fix.to_owned(),
    }
}
