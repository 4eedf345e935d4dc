//! `tickmark steps`: settle an event's current step by hand — skip it, or
//! record it as done — and let the event go on.

use clap::{Args, Subcommand};

use super::events::{report_action, Target};
use super::lookup::resolve;
use super::{default_actor, Failure, Output};
use crate::operator::{Actor, Operations};
use crate::store::Store;

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
    let (args, done) = match command {
        StepsCommand::Skip(args) => (args, false),
        StepsCommand::MarkDone(args) => (args, true),
    };
    let record = resolve(store, &args.target.id, args.target.source.as_deref()).await?;
    let who = args.actor.clone().unwrap_or_else(default_actor);
    let actor = Actor {
        who: &who,
        reason: Some(&args.reason),
    };
    let seq = record.event.seq;
    let (record, action) = if done {
        (
            store.step_mark_done_by_hand(seq, &args.step, actor).await?,
            "mark-done",
        )
    } else {
        (store.step_skip(seq, &args.step, actor).await?, "skip")
    };
    report_action(store, out, action, &record).await
}
