//! `tickmark steps`: settle an event's current step by hand — skip it,
//! record it as done, feed a waiting step an event or time it out — and let
//! the event go on.

use clap::{Args, Subcommand};

use super::events::{report_action, Target};
use super::lookup::resolve;
use super::{default_actor, Failure, Output};
use tickmark_core::operator::{Actor, Operations};
use tickmark_driver::store::Store;

#[derive(Debug, Subcommand)]
pub(crate) enum StepsCommand {
    /// Skip the event's current step; the event goes on with the next one
    #[command(after_help = "\
Only the event's current step (the first unfinished one) can be skipped, and only while
the event is pending, dead, parked, or running with an expired lease (never while a
worker holds a live lease on it). The step is recorded as `skipped` (later steps see it
as settled); the event is re-queued at the next step, or done if it was the last.
A reason is required; the action is audited.

Example:
  tickmark steps skip 42 send_receipt --reason \"customer asked for no e-mail\"

Exits 3 when the event (or the step) does not exist, 4 when the step is not current or
the event's state does not allow it.")]
    Skip(SettleArgs),
    /// Record the event's current step as done by hand (fixed outside the system)
    #[command(after_help = "\
For a step whose effect an operator made by other means (a refund issued in the
provider's dashboard, a row fixed in SQL). Same rules as `skip`; the step is recorded as
`done` with output {\"marked_done_by\": WHO, \"reason\": …}, and the event goes on with
the next step, or is done if it was the last. A reason is required; the action is audited.

Example:
  tickmark steps mark-done 42 charge_card --reason \"charged by hand, ticket OPS-1234\"

Exits 3 when the event (or the step) does not exist, 4 when the step is not current or
the event's state does not allow it.")]
    MarkDone(SettleArgs),
    /// Settle a waiting step by hand with an event, as if it had matched
    #[command(after_help = "\
For a wait whose event will never match by itself (the provider sent it with another
id, or it came by another channel). The step must be waiting; it is recorded as `done`
with output {\"matched\": {\"event_seq\": N, \"event_id\": …}, \"fed_by\": WHO, \"reason\": …},
and the event goes on with the steps that run if the wait matched. A reason is required;
the action is audited.

Example:
  tickmark steps feed 42 paid --event 97 --reason \"paid by bank transfer, ticket OPS-7\"

Exits 3 when an event (or the step) does not exist, 4 when the step is not waiting.")]
    Feed(FeedArgs),
    /// End a waiting step's wait now: it settles as a timeout
    #[command(after_help = "\
The wait's deadline becomes now and a worker settles it as the plan says for a timeout:
the steps that run if it timed out, or, when the handler declares none, a dead letter
that names what it waited for. (A matching event already in the inbox still wins.)
A reason is required; the action is audited.

Example:
  tickmark steps time-out 42 paid --reason \"order cancelled by phone\"

Exits 3 when the event (or the step) does not exist, 4 when the step is not waiting.")]
    TimeOut(SettleArgs),
}

#[derive(Debug, Args)]
pub(crate) struct FeedArgs {
    #[command(flatten)]
    settle: SettleArgs,
    /// The event to feed the wait: a row number, or a provider event id
    /// (with --event-source when ids repeat across sources)
    #[arg(long = "event", value_name = "EVENT")]
    fed: String,
    /// The source of --event, when it is a provider event id
    #[arg(long, value_name = "SOURCE")]
    event_source: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SettleArgs {
    #[command(flatten)]
    target: Target,
    /// The step, by name: it must be the event's current step
    #[arg(value_name = "STEP")]
    step: String,
    /// Why, in your words (required; kept in the audit trail)
    #[arg(long)]
    reason: String,
    /// Who acts, for the audit trail [default: $USER@hostname]
    #[arg(long, value_name = "WHO")]
    actor: Option<String>,
}

pub(crate) async fn run(
    store: &dyn Store,
    out: Output,
    command: StepsCommand,
) -> Result<(), Failure> {
    let (args, action) = match &command {
        StepsCommand::Skip(args) => (args, "skip"),
        StepsCommand::MarkDone(args) => (args, "mark-done"),
        StepsCommand::Feed(feed) => (&feed.settle, "feed"),
        StepsCommand::TimeOut(args) => (args, "time-out"),
    };
    let record = resolve(store, &args.target.id, args.target.source.as_deref()).await?;
    let who = args.actor.clone().unwrap_or_else(default_actor);
    let actor = Actor {
        who: &who,
        reason: Some(&args.reason),
    };
    let seq = record.event.seq;
    let step = args.step.as_str();
    let record = match &command {
        StepsCommand::Skip(_) => store.step_skip(seq, step, actor).await?,
        StepsCommand::MarkDone(_) => store.step_mark_done_by_hand(seq, step, actor).await?,
        StepsCommand::Feed(feed) => {
            let fed = resolve(store, &feed.fed, feed.event_source.as_deref()).await?;
            store.wait_feed(seq, step, fed.event.seq, actor).await?
        }
        StepsCommand::TimeOut(_) => store.wait_time_out(seq, step, actor).await?,
    };
    report_action(store, out, action, &record).await
}
