//! `tickmark plans check`: before a deploy, list the unfinished events whose
//! stored plans name step types this build does not know.

use serde::Serialize;

use super::printable;
use super::{Failure, Output};
use tickmark_core::plan::{check_stored_plans, StrandedPlan};
use tickmark_driver::store::Store;

pub(crate) const LONG_ABOUT: &str = "\
Check, before a deploy, that this build can run every plan still in the database.

Every accepted event stores its plan: the step names, each step's typetag type name and
configuration. This decodes each distinct plan of events that may still run (pending,
running, dead, parked) with the step types linked into THIS binary, and lists the plans
it cannot run, with how many events carry each.

Run it from the build you are about to deploy, in a binary of your own crate that links
your steps and calls `tickmark::cli::main()` — the generic `tickmark` binary knows only
tickmark's own step types, so it reports every plan of yours as stranded. An empty list
means no accepted event will be stranded (parked) by the deploy. docs/deploying.md says
how to rename or remove a step safely.";

pub(crate) const AFTER_HELP: &str = "\
Examples:
  cargo run --bin my-app-tickmark -- plans check          # from the new build
  my-app-tickmark plans check --json | jq '.stranded'

Exit code 5 when some plans cannot be run by this build (see `tickmark --help`).";

#[derive(Serialize)]
struct Checked {
    stranded: Vec<StrandedPlan>,
}

pub(crate) async fn check(store: &dyn Store, out: Output) -> Result<(), Failure> {
    let stranded = check_stored_plans(store).await?;
    let events: i64 = stranded.iter().map(|s| s.events).sum();
    let checked = Checked { stranded };
    out.emit(&checked, || {
        if checked.stranded.is_empty() {
            return "every unfinished event's plan can be run by this build\n".to_owned();
        }
        let mut text = format!(
            "{events} unfinished event(s) carry plans this build cannot run; deploying it would park them:\n"
        );
        for plan in &checked.stranded {
            text.push_str(&format!(
                "  {} event(s), e.g. #{}: steps [{}]\n    {}\n",
                plan.events,
                plan.example_seq,
                printable::line(&plan.steps.join(", ")),
                printable::line(&plan.problem)
            ));
        }
        text
    })?;
    if checked.stranded.is_empty() {
        Ok(())
    } else {
        Err(Failure::Stranded(format!(
            "{events} unfinished event(s) would be stranded; keep their step types registered (docs/deploying.md)"
        )))
    }
}
