//! Handlers: the ordered steps registered for a (source, kind), and the
//! registry that finds the handler of an incoming event.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::plan::{Action, Plan, StepOptions, StepToEncode};
use crate::privacy::{Subject, SubjectRule};
use crate::step::Step;
use crate::tenant::{tenant_name, TenantKey};
use tickmark_driver::flow::{Debounce, FlowKey, RateLimit, RateLimitError, RateLimitUse};
use tickmark_driver::ordering::Ordering;
use tickmark_driver::retry::RetryPolicy;
use tickmark_driver::wait::{Branch, EventWait, OnTimeout, Timer, Wait, WaitOutcome};

/// Matches any source or any kind in [`Handlers::on`].
pub const ANY: &str = "*";

/// Longest step name, source or kind accepted at registration.
pub const MAX_NAME_LEN: usize = 128;

/// The longest head start a handler may give its events
/// ([`Handler::head_start`]): a week. It is also the longest an event of no
/// head start can be passed by events that become due after it.
pub const MAX_HEAD_START: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// A handler definition is wrong. Raised when the engine is built, not at run time.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum HandlerConfigError {
    /// Two steps of one handler share a name, so they would share idempotency keys.
    #[error("handler for ({source_name}, {kind}) has two steps named `{step}`; give one of them another name with `Handler::named_step`")]
    DuplicateStepName {
        /// The handler's source.
        source_name: String,
        /// The handler's kind.
        kind: String,
        /// The repeated step name.
        step: String,
    },
    /// A name is empty, too long, or has characters outside `[A-Za-z0-9_.-/]`.
    #[error("{what} `{name}` must be 1 to {MAX_NAME_LEN} characters of letters, digits, `_`, `-`, `.` or `/`")]
    InvalidName {
        /// What was being named ("step", "source", "kind", "rate limit").
        what: &'static str,
        /// The offending name.
        name: String,
    },
    /// A handler has no steps.
    #[error("handler for ({source_name}, {kind}) has no steps")]
    EmptyHandler {
        /// The handler's source.
        source_name: String,
        /// The handler's kind.
        kind: String,
    },
    /// Two handlers were registered for the same (source, kind).
    #[error("two handlers registered for ({source_name}, {kind})")]
    DuplicateHandler {
        /// The source.
        source_name: String,
        /// The kind.
        kind: String,
    },
    /// A rate limit cannot work (zero tokens, a bad name).
    #[error(transparent)]
    RateLimit(#[from] RateLimitError),
    /// Two rate limits share a name.
    #[error("two rate limits are named `{0}`; give each its own name")]
    DuplicateRateLimit(String),
    /// A step uses a rate limit no `Handlers::rate_limit` defines.
    #[error("step `{step}` of ({source_name}, {kind}) uses rate limit `{limit}`, which is not defined; add Handlers::rate_limit(RateLimit::new(\"{limit}\", …))")]
    UnknownRateLimit {
        /// The handler's source.
        source_name: String,
        /// The handler's kind.
        kind: String,
        /// The step.
        step: String,
        /// The missing limit.
        limit: String,
    },
    /// `Handler::rate_limited` or a limit came before any step, a
    /// concurrency limit of zero, a tenant header that is not a header
    /// name, or a head start over [`MAX_HEAD_START`].
    #[error("handler for ({source_name}, {kind}): {problem}")]
    Misplaced {
        /// The handler's source.
        source_name: String,
        /// The handler's kind.
        kind: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A step runs on a branch of a wait that is not an earlier wait for an
    /// event in the same handler.
    #[error("step `{step}` of ({source_name}, {kind}) runs if wait `{wait}` matched or timed out, but no earlier step of the handler is a wait for an event named `{wait}`")]
    UnknownWait {
        /// The handler's source.
        source_name: String,
        /// The handler's kind.
        kind: String,
        /// The step on the branch.
        step: String,
        /// The wait it names.
        wait: String,
    },
    /// A step reads ([`Step::reads`]) the output of a step that is not an
    /// earlier step of its handler: a typo, or a step moved after its reader.
    #[error("step `{step}` of ({source_name}, {kind}) reads the output of step `{output}` (Step::reads), but no step before it is named `{output}`; the steps before it: [{}]", .earlier_steps.join(", "))]
    UnknownOutput {
        /// The handler's source.
        source_name: String,
        /// The handler's kind.
        kind: String,
        /// The step that reads.
        step: String,
        /// The name it reads, which no earlier step has.
        output: String,
        /// The names of the steps before it, in order.
        earlier_steps: Vec<String>,
    },
    /// A step could not be serialised into a plan.
    #[error("step `{step}` cannot be serialised into a plan: {reason}")]
    Unserialisable {
        /// The step's name.
        step: String,
        /// serde's explanation.
        reason: String,
    },
}

/// An ordered list of steps and how to retry them.
///
/// ```
/// # use serde::{Deserialize, Serialize};
/// # use tickmark::{Handler, RetryPolicy, Step, StepContext, StepResult};
/// # #[derive(Debug, Serialize, Deserialize)] struct Notify { channel: String }
/// # #[typetag::serde(name = "handler_doc_notify")]
/// # #[async_trait::async_trait]
/// # impl Step for Notify {
/// #     async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult { Ok(serde_json::Value::Null) }
/// # }
/// let handler = Handler::new()
///     .named_step("notify_sales", Notify { channel: "#sales".into() })
///     .named_step("notify_ops", Notify { channel: "#ops".into() })
///     .retry(RetryPolicy::attempts(5));
/// assert_eq!(handler.step_names(), ["notify_sales", "notify_ops"]);
/// ```
#[derive(Debug, Default)]
pub struct Handler {
    steps: Vec<HandlerStep>,
    retry: RetryPolicy,
    ordering: Option<Ordering>,
    concurrency: Option<(FlowKey, u32)>,
    debounce: Option<Debounce>,
    tenant: Option<TenantKey>,
    head_start: Duration,
    subjects: Vec<SubjectRule>,
    problem: Option<&'static str>,
}

/// One step of a handler, as registered.
#[derive(Debug)]
struct HandlerStep {
    name: String,
    action: Action,
    options: StepOptions,
    rate_limit: Option<RateLimitUse>,
    only_if: Option<Branch>,
}

impl Handler {
    /// A handler with no steps yet and the default retry policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a step named after its type's typetag name.
    pub fn step(self, step: impl Step + 'static) -> Self {
        let name = step.typetag_name().to_owned();
        self.named_step(name, step)
    }

    /// Append a step under an explicit name (needed when a type appears twice).
    pub fn named_step(self, name: impl Into<String>, step: impl Step + 'static) -> Self {
        self.named_step_with(name, step, StepOptions::default())
    }

    /// Append a step with its own timeout or retry policy.
    pub fn step_with(self, step: impl Step + 'static, options: StepOptions) -> Self {
        let name = step.typetag_name().to_owned();
        self.named_step_with(name, step, options)
    }

    /// Append a named step with its own timeout or retry policy.
    pub fn named_step_with(
        self,
        name: impl Into<String>,
        step: impl Step + 'static,
        options: StepOptions,
    ) -> Self {
        self.push(name.into(), Action::Run(Box::new(step)), options)
    }

    fn push(mut self, name: String, action: Action, options: StepOptions) -> Self {
        self.steps.push(HandlerStep {
            name,
            action,
            options,
            rate_limit: None,
            only_if: None,
        });
        self
    }

    /// Append a step that waits, holding no lease and no worker slot, for
    /// another accepted event that matches ([`WaitFor::event`](tickmark_driver::wait::WaitFor::event)),
    /// up to its timeout. The matched event's id becomes the step's output.
    /// Declare what each outcome runs with [`if_matched`](Self::if_matched)
    /// and [`if_timed_out`](Self::if_timed_out); a wait with no
    /// `if_timed_out` step dead-letters the event when it times out.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use serde::{Deserialize, Serialize};
    /// # use tickmark::{wait::WaitFor, Handler, Step, StepContext, StepResult};
    /// # #[derive(Debug, Serialize, Deserialize)] struct Call(String);
    /// # #[typetag::serde(name = "handler_doc_call")]
    /// # #[async_trait::async_trait]
    /// # impl Step for Call {
    /// #     async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult { Ok(serde_json::Value::Null) }
    /// # }
    /// let order = Handler::new()
    ///     .named_step("reserve_stock", Call("reserve".into()))
    ///     .wait(
    ///         "paid",
    ///         WaitFor::event("shopify", "orders/paid")
    ///             .matching(["/shop", "/order/id"])
    ///             .timeout(Duration::from_secs(3 * 24 * 3600)),
    ///     )
    ///     .named_step("fulfill", Call("fulfill".into())).if_matched("paid")
    ///     .named_step("release_stock", Call("release".into())).if_timed_out("paid");
    /// assert_eq!(order.step_names(), ["reserve_stock", "paid", "fulfill", "release_stock"]);
    /// ```
    pub fn wait(self, name: impl Into<String>, wait: EventWait) -> Self {
        self.push(
            name.into(),
            Action::Wait(Wait::Event(wait)),
            StepOptions::default(),
        )
    }

    /// Append a step that waits `delay`, holding nothing, surviving restarts
    /// and deploys (a durable timer).
    pub fn sleep(self, name: impl Into<String>, delay: Duration) -> Self {
        self.push(
            name.into(),
            Action::Wait(Wait::Timer(Timer::After(delay))),
            StepOptions::default(),
        )
    }

    /// Append a step that waits until the time in the payload at `pointer`
    /// (RFC 3339 text, or seconds since the epoch), holding nothing.
    pub fn sleep_until(self, name: impl Into<String>, pointer: impl Into<String>) -> Self {
        self.push(
            name.into(),
            Action::Wait(Wait::Timer(Timer::Until(pointer.into()))),
            StepOptions::default(),
        )
    }

    /// Run the step added last only if the wait named `wait` matched an
    /// event; when it timed out, the step is recorded `skipped`.
    pub fn if_matched(self, wait: impl Into<String>) -> Self {
        self.on_branch(wait.into(), WaitOutcome::Matched)
    }

    /// Run the step added last only if the wait named `wait` timed out (the
    /// wait then goes on instead of dead-lettering the event); when it
    /// matched, the step is recorded `skipped`.
    pub fn if_timed_out(self, wait: impl Into<String>) -> Self {
        self.on_branch(wait.into(), WaitOutcome::TimedOut)
    }

    fn on_branch(mut self, wait: String, on: WaitOutcome) -> Self {
        match self.steps.last_mut() {
            Some(step) => step.only_if = Some(Branch { wait, on }),
            None => self.problem = Some("if_matched()/if_timed_out() come after their step"),
        }
        self
    }

    /// Make the step added last take a token from the fleet-wide rate limit
    /// `limit` (defined with [`Handlers::rate_limit`]) before each run, from
    /// the bucket of this event's `key` (a JSON pointer into the payload, or
    /// several). An empty bucket gives the event back until the next token
    /// is due: no attempt is spent, no worker slot or lease is held, and the
    /// step-status table shows the step as `throttled`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use serde::{Deserialize, Serialize};
    /// # use tickmark::{flow::RateLimit, Handler, Handlers, Step, StepContext, StepResult};
    /// # #[derive(Debug, Serialize, Deserialize)] struct Push;
    /// # #[typetag::serde(name = "handler_doc_push")]
    /// # #[async_trait::async_trait]
    /// # impl Step for Push {
    /// #     async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult { Ok(serde_json::Value::Null) }
    /// # }
    /// let handlers = Handlers::new()
    ///     .rate_limit(RateLimit::new("admin_api", 2, Duration::from_secs(1)).burst(40))
    ///     .on("shopify", "products/update", Handler::new().step(Push).rate_limited("admin_api", "/shop"));
    /// ```
    pub fn rate_limited(mut self, limit: impl Into<String>, key: impl Into<FlowKey>) -> Self {
        match self.steps.last_mut() {
            Some(step) if matches!(step.action, Action::Wait(_)) => {
                self.problem = Some("rate_limited() applies to a step that runs, not to a wait")
            }
            Some(step) => {
                step.rate_limit = Some(RateLimitUse {
                    limit: limit.into(),
                    key: key.into(),
                })
            }
            None => self.problem = Some("rate_limited() comes after the step it limits"),
        }
        self
    }

    /// Coalesce bursts per key: an event of a key (JSON pointers into the
    /// payload, namespaced by source) waits `window` before it runs; a newer
    /// event of the same key arriving meanwhile supersedes it (recorded as
    /// `superseded`, pointing at the newer one) and waits in its place, until
    /// the key has been quiet for `window` — or `max_wait` has passed since
    /// the first event of the burst, so a constant stream still runs. With
    /// [`skip_stale`](Self::skip_stale), the event kept is the one with the
    /// newest sequence, not the last to arrive. A duplicate delivery of a
    /// superseded event is still a duplicate.
    pub fn debounce_per(
        mut self,
        key: impl Into<FlowKey>,
        window: Duration,
        max_wait: Duration,
    ) -> Self {
        if window.is_zero() || max_wait < window {
            self.problem = Some(
                "debounce_per() needs a window above zero and a max_wait of at least the window",
            );
        }
        self.debounce = Some(Debounce {
            key: key.into(),
            window,
            max_wait,
        });
        self
    }

    /// Run at most `limit` events of one key at once, across every worker
    /// process on the database; `key` is a JSON pointer into the payload (or
    /// several), namespaced by the event's source. An event of a full key is
    /// not claimed until one of the key's events finishes, gives up its
    /// lease or loses it. Events without a value at the key are not limited.
    /// (Per-process limits per source or kind are [`WorkerConfig`](crate::WorkerConfig)'s.)
    pub fn concurrency_per(mut self, key: impl Into<FlowKey>, limit: u32) -> Self {
        if limit == 0 {
            self.problem = Some("concurrency_per() needs a limit of at least 1");
        }
        self.concurrency = Some((key.into(), limit));
        self
    }

    /// Claim this handler's events in fair shares per tenant, fleet-wide;
    /// `key` is a JSON pointer into the payload (or several), e.g.
    /// `/account` for a Stripe Connect platform. Among the tenants with
    /// events due, each claim gives every tenant slots in proportion to its
    /// weight (1 unless an operator set another), so one tenant's flood
    /// never queues the others' events behind it; a tenant alone gets every
    /// slot. The value is the tenant's name as it is, not namespaced by the
    /// source: a tenant's events from several sources share one share.
    /// Events without a value at the key are claimed in due order, outside
    /// any share. Both backends (docs/flow_control.md, "Fair share across
    /// tenants").
    /// (Longer than [`MAX_TENANT_BYTES`](crate::tenant::MAX_TENANT_BYTES),
    /// a tenant's name is stored as its SHA-256.)
    pub fn tenant_key(mut self, key: impl Into<FlowKey>) -> Self {
        self.tenant = Some(TenantKey::Payload(key.into()));
        self
    }

    /// As [`tenant_key`](Self::tenant_key), with the tenant named by a
    /// request header of the delivery (e.g. `X-Shopify-Shop-Domain`, which
    /// Shopify sends with every webhook): the receiver reads it, as sent;
    /// a delivery without it, or with it twice or not in visible text, is
    /// claimed outside any share. `Engine::accept` callers pass the tenant
    /// with [`NewEvent::with_tenant`](tickmark_driver::event::NewEvent::with_tenant).
    pub fn tenant_header(mut self, name: &str) -> Self {
        match TenantKey::header(name) {
            Some(key) => self.tenant = Some(key),
            None => {
                self.problem =
                    Some("tenant_header() takes a header name: 1 to 64 letters, digits, `-` or `_`")
            }
        }
        self
    }

    /// Claim this handler's events as if they had become due `head_start`
    /// earlier: a priority that ages. Orders with a head start of ten
    /// minutes are claimed before product syncs that became due up to ten
    /// minutes before them, and a product sync that has been due for ten
    /// minutes is never passed by an order that becomes due after it: no
    /// event starves, and the bound is the difference of head starts.
    /// With a tenant key, a head start orders the tenant's own events
    /// within its share and never takes another tenant's share. At most
    /// [`MAX_HEAD_START`] (docs/flow_control.md, "Priorities: a head
    /// start").
    pub fn head_start(mut self, head_start: Duration) -> Self {
        if head_start > MAX_HEAD_START {
            self.problem = Some("head_start() is at most a week (MAX_HEAD_START)");
        }
        self.head_start = head_start;
        self
    }

    /// Run this handler's events for the same resource one at a time, in
    /// acceptance order; `key` is a JSON pointer into the payload (for
    /// example `/data/object/id`). Different resources run in parallel.
    pub fn one_at_a_time_per(mut self, key: impl Into<String>) -> Self {
        self.ordering = Some(Ordering::serial(key.into()));
        self
    }

    /// Skip stale events: an event whose sequence (JSON pointer `sequence`,
    /// an integer or an RFC 3339 time, e.g. `/data/object/updated`) is not
    /// newer than the last one applied for its resource (JSON pointer `key`)
    /// is recorded as `stale` and never run. Implies one at a time per key,
    /// so the check before the first step is exact.
    pub fn skip_stale(mut self, key: impl Into<String>, sequence: impl Into<String>) -> Self {
        self.ordering = Some(Ordering::with_sequence(key.into(), sequence.into()));
        self
    }

    /// Record the subject of kind `kind` found at JSON pointer `pointer` of
    /// each event's payload (`/customer/id`, `/email`), as a keyed hash,
    /// so that [`Engine::erase_subject`](crate::Engine::erase_subject)
    /// finds the event. Repeat for each subject an event may be about. An
    /// event no handler takes is recorded under the rules of its source's
    /// handlers. Needs a subject key (`TICKMARK_SUBJECT_KEY`;
    /// docs/privacy.md).
    pub fn subject(mut self, kind: impl Into<String>, pointer: impl Into<String>) -> Self {
        self.subjects.push(SubjectRule::Pointer {
            kind: kind.into(),
            pointer: pointer.into(),
        });
        self
    }

    /// As [`subject`](Self::subject), with the subjects found by `find`
    /// (normalise an email's case there, say).
    pub fn subjects_by(mut self, find: fn(&serde_json::Value) -> Vec<Subject>) -> Self {
        self.subjects.push(SubjectRule::Function(find));
        self
    }

    /// Set the retry policy of every step of this handler.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The step names, in order.
    pub fn step_names(&self) -> Vec<&str> {
        self.steps.iter().map(|step| step.name.as_str()).collect()
    }
}

/// A handler checked and encoded once, at start-up, so accepting an event is
/// only an insert.
#[derive(Debug, Clone)]
pub struct CompiledHandler {
    #[doc(hidden)]
    pub plan_json: String,
    #[doc(hidden)]
    pub step_count: i32,
    #[doc(hidden)]
    pub ordering: Option<Ordering>,
    /// At most this many events of a key running at once, fleet-wide.
    pub concurrency: Option<(FlowKey, i32)>,
    /// How bursts of one key are coalesced.
    pub debounce: Option<Debounce>,
    /// Where an event's tenant is found, for fair claiming.
    pub tenant: Option<TenantKey>,
    /// How much earlier than its due time an event is ranked in the claim
    /// order, in milliseconds ([`Handler::head_start`]).
    pub head_start_ms: i32,
    /// How an event's subjects are found ([`Handler::subject`]).
    pub subjects: Vec<SubjectRule>,
}

impl CompiledHandler {
    /// The concurrency key and limit of an event from `source` with this
    /// payload, when the handler has one and the payload has the key.
    pub fn concurrency_of(
        &self,
        source: &str,
        payload: &serde_json::Value,
    ) -> Option<(String, i32)> {
        let (key, limit) = self.concurrency.as_ref()?;
        Some((key.scoped_value(source, payload)?, *limit))
    }

    /// The debounce key of an event from `source` with this payload, when
    /// the handler debounces and the payload has the key (an event without
    /// it is not debounced).
    pub fn debounce_key_of(&self, source: &str, payload: &serde_json::Value) -> Option<String> {
        self.debounce.as_ref()?.key.scoped_value(source, payload)
    }

    /// The tenant of an event with this payload, when the handler claims
    /// in fair shares and the payload names one.
    pub fn tenant_of(&self, payload: &serde_json::Value) -> Option<String> {
        match self.tenant.as_ref()? {
            TenantKey::Payload(key) => key.value_of(payload).map(tenant_name),
            TenantKey::Header(_) => None,
        }
    }

    /// The header naming an event's tenant, when the handler reads it from
    /// one ([`Handler::tenant_header`]), lower-case.
    pub fn tenant_header(&self) -> Option<&str> {
        match self.tenant.as_ref()? {
            TenantKey::Header(name) => Some(name),
            TenantKey::Payload(_) => None,
        }
    }
}

/// The handlers of an engine, by (source, kind), with [`ANY`] (`*`) wildcards.
///
/// An event gets the most specific handler that matches it, in this order:
/// 1. its exact (source, kind);
/// 2. (source, `*`): every kind of that source;
/// 3. (`*`, kind): that kind from any source;
/// 4. (`*`, `*`): everything.
///
/// An event no handler matches is recorded as ignored.
#[derive(Debug, Default)]
pub struct Handlers {
    entries: Vec<(String, String, Handler)>,
    rate_limits: Vec<RateLimit>,
}

impl Handlers {
    /// No handlers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register `handler` for events of `kind` from `source` (either may be [`ANY`]).
    pub fn on(
        mut self,
        source: impl Into<String>,
        kind: impl Into<String>,
        handler: Handler,
    ) -> Self {
        self.entries.push((source.into(), kind.into(), handler));
        self
    }

    /// Define a fleet-wide rate limit that steps take tokens from
    /// ([`Handler::rate_limited`]). Its rate and burst are read when a step
    /// runs, so a change applies to events already queued.
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limits.push(limit);
        self
    }

    #[doc(hidden)]
    pub fn compile(self) -> Result<Registry, HandlerConfigError> {
        let mut rate_limits = HashMap::new();
        for limit in self.rate_limits {
            check_name("rate limit", limit.name())?;
            limit.check()?;
            let name = limit.name().to_owned();
            if rate_limits.insert(name.clone(), limit).is_some() {
                return Err(HandlerConfigError::DuplicateRateLimit(name));
            }
        }
        let mut by_source: HashMap<String, HashMap<String, CompiledHandler>> = HashMap::new();
        let mut waited_on: HashMap<(String, String), Vec<FlowKey>> = HashMap::new();
        for (source, kind, mut handler) in self.entries {
            check_name("source", &source)?;
            check_name("kind", &kind)?;
            if handler.steps.is_empty() {
                return Err(HandlerConfigError::EmptyHandler {
                    source_name: source,
                    kind,
                });
            }
            if let Some(problem) = handler.problem {
                return Err(HandlerConfigError::Misplaced {
                    source_name: source,
                    kind,
                    problem,
                });
            }
            let mut seen = HashSet::new();
            for (position, step) in handler.steps.iter().enumerate() {
                check_name("step", &step.name)?;
                check_reads(&source, &kind, &handler.steps[..position], step)?;
                if !seen.insert(step.name.as_str()) {
                    return Err(HandlerConfigError::DuplicateStepName {
                        source_name: source,
                        kind,
                        step: step.name.clone(),
                    });
                }
                if let Some(used) = &step.rate_limit {
                    if !rate_limits.contains_key(&used.limit) {
                        return Err(HandlerConfigError::UnknownRateLimit {
                            source_name: source,
                            kind,
                            step: step.name.clone(),
                            limit: used.limit.clone(),
                        });
                    }
                }
            }
            check_waits(&source, &kind, &mut handler.steps)?;
            for step in &handler.steps {
                if let Action::Wait(Wait::Event(wait)) = &step.action {
                    let keys = waited_on
                        .entry((wait.source.clone(), wait.kind.clone()))
                        .or_default();
                    if !keys.contains(&wait.theirs) {
                        keys.push(wait.theirs.clone());
                    }
                }
            }
            let plan_json = Plan::encode_steps(
                &handler.retry,
                handler.steps.iter().map(|step| StepToEncode {
                    name: &step.name,
                    action: step.action.to_encode(),
                    options: step.options,
                    rate_limit: step.rate_limit.as_ref(),
                    only_if: step.only_if.as_ref(),
                }),
            )
            .map_err(|error| HandlerConfigError::Unserialisable {
                step: handler.step_names().join(", "),
                reason: error.to_string(),
            })?;
            let compiled = CompiledHandler {
                plan_json,
                step_count: i32::try_from(handler.steps.len()).unwrap_or(i32::MAX),
                ordering: handler.ordering.clone(),
                concurrency: handler
                    .concurrency
                    .clone()
                    .map(|(key, limit)| (key, i32::try_from(limit).unwrap_or(i32::MAX))),
                debounce: handler.debounce.clone(),
                tenant: handler.tenant.clone(),
                // At most a week (checked above): fits with room to spare.
                head_start_ms: i32::try_from(handler.head_start.as_millis()).unwrap_or(i32::MAX),
                subjects: handler.subjects.clone(),
            };
            if by_source
                .entry(source.clone())
                .or_default()
                .insert(kind.clone(), compiled)
                .is_some()
            {
                return Err(HandlerConfigError::DuplicateHandler {
                    source_name: source,
                    kind,
                });
            }
        }
        let has_tenants = by_source
            .values()
            .flat_map(HashMap::values)
            .any(|handler| handler.tenant.is_some());
        let has_tenant_headers = by_source
            .values()
            .flat_map(HashMap::values)
            .any(|handler| handler.tenant_header().is_some());
        let declares_subjects = by_source
            .values()
            .flat_map(HashMap::values)
            .any(|handler| !handler.subjects.is_empty());
        Ok(Registry {
            declares_subjects,
            by_source,
            rate_limits,
            waited_on,
            has_tenants,
            has_tenant_headers,
        })
    }
}

/// Check a handler's waits and branches, and decide what each wait does on
/// timeout: go on when a step runs on its timeout branch, else dead-letter.
fn check_waits(
    source: &str,
    kind: &str,
    steps: &mut [HandlerStep],
) -> Result<(), HandlerConfigError> {
    let misplaced = |problem| HandlerConfigError::Misplaced {
        source_name: source.to_owned(),
        kind: kind.to_owned(),
        problem,
    };
    for position in 0..steps.len() {
        if let Action::Wait(Wait::Event(wait)) = &steps[position].action {
            if let Some(problem) = wait.problem() {
                return Err(misplaced(problem));
            }
        }
        let Some(branch) = steps[position].only_if.clone() else {
            continue;
        };
        let wait_at = steps[..position].iter().position(|earlier| {
            earlier.name == branch.wait && matches!(earlier.action, Action::Wait(Wait::Event(_)))
        });
        let Some(wait_at) = wait_at else {
            return Err(HandlerConfigError::UnknownWait {
                source_name: source.to_owned(),
                kind: kind.to_owned(),
                step: steps[position].name.clone(),
                wait: branch.wait,
            });
        };
        if branch.on == WaitOutcome::TimedOut {
            if let Action::Wait(Wait::Event(wait)) = &mut steps[wait_at].action {
                wait.on_timeout = OnTimeout::Continue;
            }
        }
    }
    Ok(())
}

/// Check that every output `step` reads ([`Step::reads`]) is the output of
/// one of the steps `before` it.
fn check_reads(
    source: &str,
    kind: &str,
    before: &[HandlerStep],
    step: &HandlerStep,
) -> Result<(), HandlerConfigError> {
    let Action::Run(code) = &step.action else {
        return Ok(());
    };
    for output in code.reads() {
        if !before.iter().any(|earlier| earlier.name == output) {
            return Err(HandlerConfigError::UnknownOutput {
                source_name: source.to_owned(),
                kind: kind.to_owned(),
                step: step.name.clone(),
                output: output.to_owned(),
                earlier_steps: before.iter().map(|earlier| earlier.name.clone()).collect(),
            });
        }
    }
    Ok(())
}

fn check_name(what: &'static str, name: &str) -> Result<(), HandlerConfigError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && ((name == ANY && matches!(what, "source" | "kind"))
            || name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')));
    if valid {
        Ok(())
    } else {
        Err(HandlerConfigError::InvalidName {
            what,
            name: name.to_owned(),
        })
    }
}

/// Compiled handlers, looked up on every accept.
#[derive(Debug, Default)]
pub struct Registry {
    /// By source, then kind: looked up with borrowed names, no allocation.
    by_source: HashMap<String, HashMap<String, CompiledHandler>>,
    /// The fleet-wide rate limits, by name.
    rate_limits: HashMap<String, RateLimit>,
    /// The keys some handler's wait reads from events of a (source, kind).
    waited_on: HashMap<(String, String), Vec<FlowKey>>,
    /// Some handler names a tenant key (`Handler::tenant_key`).
    has_tenants: bool,
    /// Some handler names its tenant by a header (`Handler::tenant_header`).
    has_tenant_headers: bool,
    /// Some handler declares subjects (`Handler::subject`).
    declares_subjects: bool,
}

impl Registry {
    /// The match keys an accepted event of (`source`, `kind`) is recorded
    /// under, one per key a wait for that kind reads, so that a waiting
    /// event finds it (empty when no handler waits for such events).
    pub fn match_keys_of(
        &self,
        source: &str,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Vec<String> {
        if self.waited_on.is_empty() {
            return Vec::new();
        }
        let Some(keys) = self.waited_on.get(&(source.to_owned(), kind.to_owned())) else {
            return Vec::new();
        };
        keys.iter()
            .filter_map(|key| {
                let value = key.value_of(payload)?;
                Some(tickmark_driver::wait::match_key(
                    source,
                    kind,
                    key.pointers(),
                    &value,
                ))
            })
            .collect()
    }

    /// The rate limit named `name`, as this build defines it.
    pub fn rate_limit(&self, name: &str) -> Option<&RateLimit> {
        self.rate_limits.get(name)
    }

    /// Whether a handler takes every kind of `source` (its kind is [`ANY`]).
    pub fn takes_every_kind(&self, source: &str) -> bool {
        [source, ANY].iter().any(|s| {
            self.by_source
                .get(*s)
                .is_some_and(|kinds| kinds.contains_key(ANY))
        })
    }

    /// Whether a handler or a wait names `kind` of `source` exactly: a
    /// handler on (`source`, `kind`) or (`*`, `kind`), or a wait for
    /// (`source`, `kind`). A kind reached only through a `*` kind is not
    /// named: there are as many such kinds as anyone can write.
    pub fn names_kind(&self, source: &str, kind: &str) -> bool {
        let on = |s: &str| {
            self.by_source
                .get(s)
                .is_some_and(|kinds| kinds.contains_key(kind))
        };
        kind != ANY
            && (on(source)
                || on(ANY)
                || self
                    .waited_on
                    .contains_key(&(source.to_owned(), kind.to_owned())))
    }

    /// Every kind of `source` that [`Registry::names_kind`] names, sorted.
    pub fn named_kinds(&self, source: &str) -> Vec<&str> {
        let mut kinds: Vec<&str> = [source, ANY]
            .iter()
            .filter_map(|s| self.by_source.get(*s))
            .flat_map(|kinds| kinds.keys().map(String::as_str))
            .chain(
                self.waited_on
                    .keys()
                    .filter(|(s, _)| s == source)
                    .map(|(_, kind)| kind.as_str()),
            )
            .filter(|kind| *kind != ANY)
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        kinds
    }

    /// The kinds of `source` a handler takes: every kind, when a handler on
    /// (`source`, `*`) or (`*`, `*`) reaches it; otherwise the kinds of the
    /// handlers on (`source`, kind) and (`*`, kind), sorted (none: every
    /// event of the source is recorded as ignored).
    pub fn kinds_handled(&self, source: &str) -> KindsHandled<'_> {
        let on = |s: &str| self.by_source.get(s);
        if [source, ANY]
            .iter()
            .any(|s| on(s).is_some_and(|kinds| kinds.contains_key(ANY)))
        {
            return KindsHandled::Every;
        }
        let mut kinds: Vec<&str> = [source, ANY]
            .iter()
            .filter_map(|s| on(s))
            .flat_map(|kinds| kinds.keys().map(String::as_str))
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        KindsHandled::Only(kinds)
    }

    /// Whether some handler's wait reads events of `source` (an event no
    /// handler takes is still recorded, and can end such a wait).
    pub fn is_waited_on(&self, source: &str) -> bool {
        self.waited_on.keys().any(|(s, _)| s == source)
    }

    /// The sources handlers and waits name (never `*`), sorted.
    pub fn named_sources(&self) -> Vec<&str> {
        let mut sources: Vec<&str> = self
            .by_source
            .keys()
            .map(String::as_str)
            .chain(self.waited_on.keys().map(|(source, _)| source.as_str()))
            .filter(|source| *source != ANY)
            .collect();
        sources.sort_unstable();
        sources.dedup();
        sources
    }

    /// Whether some handler claims its events in fair shares per tenant
    /// (read by every turn of a worker's claim loop: decided once, here).
    pub fn has_tenants(&self) -> bool {
        self.has_tenants
    }

    /// Whether some handler names its tenant by a request header (the
    /// receiver then keeps a delivery's headers until it knows the kind).
    pub fn has_tenant_headers(&self) -> bool {
        self.has_tenant_headers
    }

    /// Whether some handler declares subjects ([`Handler::subject`]).
    pub fn declares_subjects(&self) -> bool {
        self.declares_subjects
    }

    /// The subjects of an event: by its handler's rules, or, when no
    /// handler takes it, by the rules of every handler of its source.
    pub fn subjects_of(
        &self,
        source: &str,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Vec<Subject> {
        if !self.declares_subjects {
            return Vec::new();
        }
        let rules: Vec<&SubjectRule> = match self.find(source, kind) {
            Some(handler) => handler.subjects.iter().collect(),
            None => self
                .by_source
                .get(source)
                .into_iter()
                .flat_map(HashMap::values)
                .flat_map(|handler| &handler.subjects)
                .collect(),
        };
        rules
            .into_iter()
            .flat_map(|rule| rule.subjects_of(payload))
            .collect()
    }

    #[doc(hidden)]
    pub fn find(&self, source: &str, kind: &str) -> Option<&CompiledHandler> {
        let get = |s: &str, k: &str| self.by_source.get(s).and_then(|kinds| kinds.get(k));
        get(source, kind)
            .or_else(|| get(source, ANY))
            .or_else(|| get(ANY, kind))
            .or_else(|| get(ANY, ANY))
    }
}

/// Which kinds of a source the handlers take ([`Registry::kinds_handled`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KindsHandled<'a> {
    /// A `*` handler takes every kind of the source.
    Every,
    /// Only these kinds (sorted; empty when no handler takes the source).
    Only(Vec<&'a str>),
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::context::StepContext;
    use crate::step::StepResult;

    #[derive(Debug, Serialize, Deserialize)]
    struct Tick;

    #[typetag::serde(name = "handler_test_tick")]
    #[async_trait::async_trait]
    impl Step for Tick {
        async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
            Ok(serde_json::Value::Null)
        }
    }

    #[test]
    fn lookup_prefers_exact_then_source_wide_then_kind_wide_then_any() {
        let registry = Handlers::new()
            .on(
                "stripe",
                "invoice.paid",
                Handler::new().named_step("exact", Tick),
            )
            .on(
                "stripe",
                ANY,
                Handler::new().named_step("source_wide", Tick),
            )
            .on(
                ANY,
                "invoice.paid",
                Handler::new().named_step("kind_wide", Tick),
            )
            .on(ANY, ANY, Handler::new().named_step("fallback", Tick))
            .compile()
            .unwrap();
        let plan_of = |s: &str, k: &str| registry.find(s, k).unwrap().plan_json.clone();
        assert!(plan_of("stripe", "invoice.paid").contains("\"exact\""));
        assert!(plan_of("stripe", "charge.failed").contains("\"source_wide\""));
        assert!(plan_of("paddle", "invoice.paid").contains("\"kind_wide\""));
        assert!(plan_of("github", "push").contains("\"fallback\""));
    }

    #[test]
    fn a_bad_tenant_header_or_too_long_a_head_start_is_refused_at_start() {
        let compile = |handler: Handler| Handlers::new().on("shop", "k", handler).compile();
        let header = compile(
            Handler::new()
                .named_step("a", Tick)
                .tenant_header("bad header"),
        );
        assert!(
            matches!(&header, Err(HandlerConfigError::Misplaced { problem, .. }) if problem.contains("tenant_header")),
            "{header:?}"
        );
        let week = compile(
            Handler::new()
                .named_step("a", Tick)
                .head_start(MAX_HEAD_START * 2),
        );
        assert!(
            matches!(&week, Err(HandlerConfigError::Misplaced { problem, .. }) if problem.contains("head_start")),
            "{week:?}"
        );
        let fine = compile(
            Handler::new()
                .named_step("a", Tick)
                .tenant_header("X-Shopify-Shop-Domain")
                .head_start(MAX_HEAD_START),
        )
        .unwrap();
        let handler = fine.find("shop", "k").unwrap();
        assert_eq!(handler.tenant_header(), Some("x-shopify-shop-domain"));
        assert_eq!(handler.head_start_ms, 7 * 24 * 3600 * 1000);
        assert!(fine.has_tenants() && fine.has_tenant_headers());
    }

    #[test]
    fn a_handler_for_any_source_alone_is_found() {
        let registry = Handlers::new()
            .on(ANY, "order.paid", Handler::new().named_step("any", Tick))
            .compile()
            .unwrap();
        assert!(registry.find("shop", "order.paid").is_some());
        assert!(registry.find("shop", "order.created").is_none());
    }

    /// The kinds a source's handlers name: exact handlers of the source,
    /// handlers of the kind for any source, waits for the source's kind;
    /// never a kind reached through `*` alone.
    #[test]
    fn named_kinds_are_the_exact_kinds_of_handlers_and_waits() {
        let registry = Handlers::new()
            .on(
                "shop",
                "order.created",
                Handler::new()
                    .wait(
                        "paid",
                        tickmark_driver::wait::WaitFor::event("shop", "order.paid")
                            .matching("/id")
                            .timeout(std::time::Duration::from_secs(60)),
                    )
                    .named_step("fulfill", Tick)
                    .if_matched("paid"),
            )
            .on(ANY, "refund.created", Handler::new().named_step("r", Tick))
            .on("shop", ANY, Handler::new().named_step("record", Tick))
            .on(
                "other",
                "order.created",
                Handler::new().named_step("o", Tick),
            )
            .compile()
            .unwrap();
        assert_eq!(
            registry.named_kinds("shop"),
            ["order.created", "order.paid", "refund.created"]
        );
        for kind in ["order.created", "order.paid", "refund.created"] {
            assert!(registry.names_kind("shop", kind), "{kind}");
        }
        for kind in ["customer.created", ANY] {
            assert!(!registry.names_kind("shop", kind), "{kind}");
        }
        assert!(!registry.names_kind("other", "order.paid"));
        assert_eq!(
            registry.named_kinds("other"),
            ["order.created", "refund.created"]
        );
    }

    /// What the receiver says at start-up about each source: the kinds a
    /// handler takes (every kind through `*`), whether a wait reads it, and
    /// which sources the handlers name.
    #[test]
    fn kinds_handled_and_named_sources_follow_the_handlers_and_waits() {
        let registry = Handlers::new()
            .on(
                "shop",
                "order.created",
                Handler::new()
                    .wait("paid", paid_within(std::time::Duration::from_secs(60)))
                    .named_step("fulfill", Tick)
                    .if_matched("paid"),
            )
            .on(ANY, "refund.created", Handler::new().named_step("r", Tick))
            .on("github", ANY, Handler::new().named_step("g", Tick))
            .compile()
            .unwrap();
        assert_eq!(
            registry.kinds_handled("shop"),
            KindsHandled::Only(vec!["order.created", "refund.created"])
        );
        assert_eq!(registry.kinds_handled("github"), KindsHandled::Every);
        assert_eq!(
            registry.kinds_handled("stripe"),
            KindsHandled::Only(vec!["refund.created"])
        );
        assert!(registry.is_waited_on("shop"));
        assert!(!registry.is_waited_on("github"));
        assert_eq!(registry.named_sources(), ["github", "shop"]);

        let everything = Handlers::new()
            .on(ANY, ANY, Handler::new().named_step("all", Tick))
            .compile()
            .unwrap();
        assert_eq!(everything.kinds_handled("stripe"), KindsHandled::Every);
        assert!(everything.named_sources().is_empty());
        let nothing = Registry::default();
        assert_eq!(nothing.kinds_handled("stripe"), KindsHandled::Only(vec![]));
    }

    #[test]
    fn no_handler_means_none() {
        let registry = Handlers::new()
            .on("stripe", "invoice.paid", Handler::new().step(Tick))
            .compile()
            .unwrap();
        assert!(registry.find("github", "push").is_none());
    }

    fn paid_within(timeout: std::time::Duration) -> tickmark_driver::wait::EventWait {
        tickmark_driver::wait::WaitFor::event("shop", "order.paid")
            .matching("/id")
            .timeout(timeout)
    }

    #[test]
    fn a_wait_dead_letters_on_timeout_unless_a_step_runs_on_its_timeout() {
        let hour = std::time::Duration::from_secs(3600);
        let registry = Handlers::new()
            .on(
                "shop",
                "order.created",
                Handler::new()
                    .wait("paid", paid_within(hour))
                    .named_step("fulfill", Tick)
                    .if_matched("paid")
                    .named_step("release", Tick)
                    .if_timed_out("paid"),
            )
            .on(
                "shop",
                "order.updated",
                Handler::new()
                    .wait("paid", paid_within(hour))
                    .named_step("fulfill", Tick)
                    .if_matched("paid"),
            )
            .compile()
            .unwrap();
        let plan = |kind: &str| -> serde_json::Value {
            serde_json::from_str(&registry.find("shop", kind).unwrap().plan_json).unwrap()
        };
        let branched = plan("order.created");
        assert_eq!(
            branched["steps"][0]["wait"]["event"]["on_timeout"],
            "continue"
        );
        assert_eq!(
            branched["steps"][2]["only_if"],
            serde_json::json!({"wait": "paid", "on": "timed_out"})
        );
        assert_eq!(
            plan("order.updated")["steps"][0]["wait"]["event"]["on_timeout"],
            "dead_letter"
        );
        let keys = registry.match_keys_of("shop", "order.paid", &serde_json::json!({"id": 7}));
        assert_eq!(
            keys,
            ["shop\u{1f}order.paid\u{1f}/id\u{1f}7"],
            "one key, however many waits read it"
        );
        assert!(registry
            .match_keys_of("shop", "order.created", &serde_json::json!({"id": 7}))
            .is_empty());
    }

    #[test]
    fn waits_and_branches_that_cannot_work_are_refused() {
        let hour = std::time::Duration::from_secs(3600);
        let compile = |handler: Handler| {
            Handlers::new()
                .on("shop", "order.created", handler)
                .compile()
                .map(|_| ())
                .unwrap_err()
        };
        let unknown = compile(
            Handler::new()
                .named_step("fulfill", Tick)
                .if_matched("paid"),
        );
        assert!(
            matches!(unknown, HandlerConfigError::UnknownWait { .. }),
            "{unknown}"
        );
        let later = compile(
            Handler::new()
                .named_step("fulfill", Tick)
                .if_matched("paid")
                .wait("paid", paid_within(hour)),
        );
        assert!(
            matches!(later, HandlerConfigError::UnknownWait { .. }),
            "{later}"
        );
        let timer = compile(
            Handler::new()
                .sleep("paid", hour)
                .named_step("fulfill", Tick)
                .if_matched("paid"),
        );
        assert!(
            matches!(timer, HandlerConfigError::UnknownWait { .. }),
            "{timer}"
        );
        let no_timeout = compile(Handler::new().wait(
            "paid",
            tickmark_driver::wait::WaitFor::event("shop", "order.paid").matching("/id"),
        ));
        assert!(no_timeout.to_string().contains("timeout()"), "{no_timeout}");
        let limited = compile(
            Handler::new()
                .wait("paid", paid_within(hour))
                .rate_limited("api", "/shop"),
        );
        assert!(limited.to_string().contains("not to a wait"), "{limited}");
    }

    /// Reads the output of the steps it is configured with.
    #[derive(Debug, Serialize, Deserialize)]
    struct Reads(Vec<String>);

    #[typetag::serde(name = "handler_test_reads")]
    #[async_trait::async_trait]
    impl Step for Reads {
        fn reads(&self) -> Vec<&str> {
            self.0.iter().map(String::as_str).collect()
        }

        async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
            Ok(serde_json::Value::Null)
        }
    }

    #[test]
    fn a_step_reads_only_outputs_of_earlier_steps() {
        let reads = |names: &[&str]| Reads(names.iter().map(|n| n.to_string()).collect());
        let compile = |handler: Handler| {
            Handlers::new()
                .on("stripe", "invoice.paid", handler)
                .compile()
                .map(|_| ())
        };
        let hour = std::time::Duration::from_secs(3600);
        compile(
            Handler::new()
                .named_step("credit_account", Tick)
                .wait("paid", paid_within(hour))
                .named_step("send_receipt", reads(&["credit_account", "paid"])),
        )
        .expect("earlier steps and waits may be read");

        let typo = compile(
            Handler::new()
                .named_step("credit_account", Tick)
                .named_step("send_receipt", reads(&["credit_acount"])),
        )
        .unwrap_err();
        assert!(
            matches!(&typo, HandlerConfigError::UnknownOutput { step, output, earlier_steps, .. }
                if step == "send_receipt" && output == "credit_acount" && earlier_steps == &["credit_account"]),
            "{typo:?}"
        );
        assert_eq!(
            typo.to_string(),
            "step `send_receipt` of (stripe, invoice.paid) reads the output of step \
             `credit_acount` (Step::reads), but no step before it is named `credit_acount`; \
             the steps before it: [credit_account]"
        );

        let later = compile(
            Handler::new()
                .named_step("send_receipt", reads(&["credit_account"]))
                .named_step("credit_account", Tick),
        )
        .unwrap_err();
        assert!(
            matches!(&later, HandlerConfigError::UnknownOutput { output, earlier_steps, .. }
                if output == "credit_account" && earlier_steps.is_empty()),
            "{later:?}"
        );

        let itself = compile(Handler::new().named_step("loop", reads(&["loop"]))).unwrap_err();
        assert!(
            matches!(itself, HandlerConfigError::UnknownOutput { .. }),
            "{itself}"
        );
    }

    #[test]
    fn duplicate_step_names_are_refused() {
        let error = Handlers::new()
            .on("s", "k", Handler::new().step(Tick).step(Tick))
            .compile()
            .unwrap_err();
        assert!(
            matches!(error, HandlerConfigError::DuplicateStepName { .. }),
            "{error}"
        );
    }

    #[test]
    fn a_rate_limit_with_a_bad_name_is_refused() {
        for name in ["has space", "*", ""] {
            let error = Handlers::new()
                .rate_limit(tickmark_driver::flow::RateLimit::new(
                    name,
                    1,
                    std::time::Duration::from_secs(1),
                ))
                .compile()
                .unwrap_err();
            assert!(
                matches!(
                    error,
                    HandlerConfigError::InvalidName {
                        what: "rate limit",
                        ..
                    }
                ),
                "{name}: {error}"
            );
        }
    }

    #[test]
    fn bad_names_and_empty_handlers_are_refused() {
        assert!(Handlers::new()
            .on("s", "k", Handler::new().named_step("has:colon", Tick))
            .compile()
            .is_err());
        assert!(Handlers::new()
            .on("", "k", Handler::new().step(Tick))
            .compile()
            .is_err());
        assert!(Handlers::new()
            .on("s", "k", Handler::new())
            .compile()
            .is_err());
    }
}
