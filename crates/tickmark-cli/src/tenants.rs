//! `tickmark tenants`: the tenants of fair claiming (`Handler::tenant_key`),
//! their weights and backlogs, and setting a tenant's weight at run time.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Serialize;

use super::format;
use super::table::Table;
use super::{Failure, Output};
use tickmark_driver::flow::TenantWeight;
use tickmark_driver::store::admin::TenantRow;
use tickmark_driver::store::Store;

#[derive(Debug, Subcommand)]
pub(crate) enum TenantsCommand {
    /// The tenants with unfinished events (most first) and those given a weight
    #[command(after_help = "\
A tenant is what a handler's `tenant_key` finds in an event (a shop, a connected
account). Each claim gives every tenant with events due a share of the batch in
proportion to its weight, fleet-wide (docs/flow_control.md, \"Fair share across tenants\").

Columns: the tenant, its weight (1 unless set), its events pending and running, and how
long its oldest event due now has waited for a worker.

Examples:
  tickmark tenants list
  tickmark tenants list --limit 100 --json | jq '.tenants[] | select(.pending > 1000)'")]
    List(ListArgs),
    /// Give a tenant a weight: its share of every claim, fleet-wide, from the next claim on
    #[command(after_help = "\
A tenant of weight 2 gets twice the slots of a tenant of weight 1 while both have events
due; a tenant alone gets every slot whatever its weight. The weight is a number above 0
and at most 1000000 (0.1: a tenth of the default share); 0, a negative number or a word
is refused and nothing is written, so no tenant can be stalled by a typo. Every worker
process reads it at its next claim: no restart.

Examples:
  tickmark tenants weight big-shop.myshopify.com 4
  tickmark tenants weight acct_1NG8Du2eZvKYlo2C 0.5
  tickmark tenants weight acct_1NG8Du2eZvKYlo2C 1      # back to the default share

Exits 2 when the weight is refused.")]
    Weight(WeightArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Show at most this many tenants
    #[arg(long, default_value_t = 20)]
    limit: u32,
}

#[derive(Debug, Args)]
pub(crate) struct WeightArgs {
    /// The tenant, as the handler's tenant key reads it from events
    tenant: String,
    /// Its weight: a number above 0, at most 1000000 (the default is 1)
    #[arg(allow_hyphen_values = true)]
    weight: String,
}

#[derive(Serialize)]
struct Listed {
    tenants: Vec<TenantRow>,
}

#[derive(Serialize)]
struct WeightSet<'a> {
    tenant: &'a str,
    weight: TenantWeight,
}

pub(crate) async fn run(
    store: &dyn Store,
    out: Output,
    command: TenantsCommand,
) -> Result<(), Failure> {
    match command {
        TenantsCommand::List(args) => list(store, out, args).await,
        TenantsCommand::Weight(args) => set_weight(store, out, args).await,
    }
}

async fn list(store: &dyn Store, out: Output, args: ListArgs) -> Result<(), Failure> {
    let listed = Listed {
        tenants: store.tenants(args.limit).await?,
    };
    let now = Utc::now();
    out.emit(&listed, || {
        if listed.tenants.is_empty() {
            return "no tenants: no unfinished event has one, and no weight was set \
                    (a handler names its tenant with `Handler::tenant_key`)\n"
                .to_owned();
        }
        table(&listed.tenants, now)
    })
}

/// The tenants as a table: weight, pending, running, oldest due (`tickmark
/// tenants list`, `tickmark status`).
pub(crate) fn table(tenants: &[TenantRow], now: DateTime<Utc>) -> String {
    let mut table = Table::new(["TENANT", "WEIGHT", "PENDING", "RUNNING", "OLDEST DUE"])
        .right_aligned(&[1, 2, 3]);
    for tenant in tenants {
        table.row(vec![
            tenant.tenant.clone(),
            tenant.weight.to_string(),
            tenant.pending.to_string(),
            tenant.running.to_string(),
            tenant
                .oldest_due_at
                .map_or_else(|| "-".to_owned(), |at| format::relative(at, now)),
        ]);
    }
    table.render()
}

async fn set_weight(store: &dyn Store, out: Output, args: WeightArgs) -> Result<(), Failure> {
    let weight: TenantWeight = args
        .weight
        .parse()
        .map_err(|error| Failure::Usage(format!("{error}; nothing was changed")))?;
    store.tenant_weight_set(&args.tenant, weight).await?;
    let set = WeightSet {
        tenant: &args.tenant,
        weight,
    };
    out.emit(&set, || {
        format!(
            "tenant `{}` now has weight {weight}: its share of every claim, fleet-wide, from the next claim on\n",
            super::printable::line(&args.tenant)
        )
    })
}
