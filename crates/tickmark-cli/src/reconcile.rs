//! `tickmark reconcile`: recover, from the provider's own API, the events
//! the receiver missed (docs/reconcile.md), or show each source's cursor and
//! last run (`--status`).
//!
//! Recording an event stores its handler's plan, so a run that records
//! needs the handlers: it works in an operator binary that links them and
//! calls [`main_with`](super::main_with). The generic `tickmark` binary
//! does `--dry-run` and `--status`.

use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::duration;
use super::format::time_opt;
use super::progress_line::ProgressLine;
use super::table::{truncate, Table};
use super::{Failure, Output};
use tickmark_core::handler::Handlers;
use tickmark_core::privacy::Privacy;
use tickmark_core::Engine;
use tickmark_core::SecretString;
use tickmark_driver::store::Store;
use tickmark_reconcile::{
    GitHubApi, GitHubHook, GitHubRecovery, Progress, ReconcileError, ReconcileSummary, Reconciler,
    RunLimits, RunRequest, ShopifyApi, StripeApi,
};

pub(crate) const LONG_ABOUT: &str = "\
Read the provider's own API for the events of one source and bring into the inbox what it
lacks: a receiver that was down, or answered 503 while its database failed over, lost them
otherwise (GitHub never retries a failed delivery; Stripe stops after 3 days).

  stripe   GET /v1/events (30 days kept): each missing event is recorded, its id the dedup key
  github   the hook's delivery log (3 days kept): GitHub is asked to redeliver each event no
           delivery brought in, through the receiver (--github-fetch-payload: record it here)
  shopify  the shop's webhook subscriptions: the handled topics Shopify removed are reported

A pulled copy and a pushed copy of one event are one event: nothing runs twice. Each source
keeps a cursor; without --since a run reads from it (a first run: the last 3 days), and events
are recorded oldest first. A run filtered with --type leaves the cursor where it is. Only one
process reconciles a source at a time (a fenced lease): a second is refused (exit 4).

A run reads at most 500 pages and lasts at most 10 minutes (--max-pages, --max-time): at a cap
it ends with the cursor at what was fully read, and the next run continues. A provider answer that makes no progress
(a page that repeats, an empty page that claims more) ends the run with an error. A pulled
event the receiver would refuse (over 1 MiB, an unusable id) is counted and not recorded.

Recording needs the handlers (the plan is stored with the event): run it from an operator
binary that calls tickmark::cli::main_with(handlers). The generic binary does --dry-run and
--status. Credentials come from the environment: STRIPE_API_KEY, GITHUB_TOKEN,
SHOPIFY_ACCESS_TOKEN.";

pub(crate) const AFTER_HELP: &str = "\
Examples:
  tickmark reconcile --source stripe --since 3d --dry-run      # what would be recorded
  tickmark reconcile --source stripe                           # from the cursor
  tickmark reconcile --source github --github-hook repos/acme/shop/hooks/12
  tickmark reconcile --source shopify --shop-url https://acme.myshopify.com \\
      --callback-url https://hooks.acme.com/webhooks/shopify
  tickmark reconcile --status                                  # cursors and last runs

Progress (pages, counts) goes to stderr when it is a terminal, or with --progress; the
summary (seen, already had, recorded, failed) to stdout. Exits 4 when another process holds
the source's lease, or when the key is of another account or mode than the source's events
(nothing of it is recorded), 1 when the provider's API fails (the cursor keeps what was done).";

/// Which provider's API a source is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProviderName {
    /// Stripe's events
    Stripe,
    /// A GitHub hook's deliveries
    Github,
    /// A Shopify shop's webhook subscriptions
    Shopify,
}

/// A Stripe mode, as `--stripe-mode` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StripeMode {
    /// Live mode (`livemode: true`; keys sk_live_..., rk_live_...)
    Live,
    /// Test mode, a sandbox (`livemode: false`; keys sk_test_..., rk_test_...)
    Test,
}

#[derive(Debug, Args)]
pub(crate) struct ReconcileArgs {
    /// The receiver's source name to reconcile (its events' `source`)
    #[arg(long, value_name = "NAME", required_unless_present = "status")]
    source: Option<String>,
    /// The provider's API (default: the source's name, when it is one of them)
    #[arg(long, value_enum)]
    provider: Option<ProviderName>,
    /// Read this far back whatever the cursor says: 90m, 3d (Stripe keeps 30d, GitHub 3d)
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    since: Option<Duration>,
    /// Count what would be recorded or redelivered; change nothing
    #[arg(long)]
    dry_run: bool,
    /// Take only these kinds (repeatable; default: the kinds the handlers take). A filtered run
    /// leaves the cursor where it is: it did not read the other kinds

    #[arg(long = "type", value_name = "KIND")]
    kinds: Vec<String>,
    /// Forget the source's cursor first (then --since, or the first run's 3 days); not with --dry-run
    #[arg(long, conflicts_with = "dry_run")]
    from_scratch: bool,
    /// Another address for Stripe's or GitHub's API (a proxy, GitHub Enterprise's https://HOST/api/v3)
    #[arg(long, value_name = "URL")]
    api_base: Option<String>,
    /// Stripe: list only events not delivered to every endpoint (delivery_success=false)
    #[arg(long)]
    only_failed: bool,
    /// Stripe's secret or restricted key (read access to events)
    #[arg(
        long,
        env = "STRIPE_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    stripe_api_key: Option<SecretString>,
    /// Stripe: the source's events are in this mode; an event of the other is refused (default: the mode of the source's newest events in the inbox)
    #[arg(long, value_enum, value_name = "MODE")]
    stripe_mode: Option<StripeMode>,
    /// Stripe: the key must be this account's (acct_...), asked of GET /v1/account before each run
    #[arg(long, value_name = "ACCOUNT")]
    stripe_account: Option<String>,
    /// GitHub: the hook, as repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app
    #[arg(long, value_name = "HOOK")]
    github_hook: Option<String>,
    /// GitHub: a token with the hook's read and write permission (the App's hook: its JWT)
    #[arg(
        long,
        env = "GITHUB_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    github_token: Option<SecretString>,
    /// GitHub: fetch each missed payload and record it here, instead of asking GitHub to redeliver
    #[arg(long)]
    github_fetch_payload: bool,
    /// Shopify: the shop's address, https://SHOP.myshopify.com
    #[arg(long, value_name = "URL")]
    shop_url: Option<String>,
    /// Shopify: where the subscriptions should deliver (the receiver's URL for this source)
    #[arg(long, value_name = "URL")]
    callback_url: Option<String>,
    /// Shopify: an Admin API access token with read access to webhooks
    #[arg(
        long,
        env = "SHOPIFY_ACCESS_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    shopify_access_token: Option<SecretString>,
    /// The most pages one run records from (default 500); at the cap it ends, the next continues
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_pages: Option<u64>,
    /// The longest one run lasts (default 10m); at the cap it ends, the next continues
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    max_time: Option<Duration>,
    /// Show progress on stderr even when it is not a terminal
    #[arg(long)]
    progress: bool,
    /// List every source's cursor, lease and last run instead of running
    #[arg(long, conflicts_with_all = ["dry_run", "since", "from_scratch"])]
    status: bool,
}

impl ReconcileArgs {
    /// Whether this run only reads (`--status`, `--dry-run`): it then opens
    /// the database without migrating it.
    pub(crate) fn reads_only(&self) -> bool {
        self.status || self.dry_run
    }
}

/// Run `tickmark reconcile`; `handlers` are the operator binary's, if any.
pub(crate) async fn run(
    store: std::sync::Arc<dyn Store>,
    out: Output,
    args: ReconcileArgs,
    handlers: Option<Handlers>,
) -> Result<(), Failure> {
    if args.status {
        return status(store.as_ref(), out).await;
    }
    let Some(source) = args.source.clone() else {
        return Err(Failure::Usage("--source NAME is required".to_owned()));
    };
    if !args.dry_run && handlers.is_none() {
        return Err(Failure::Usage(
            "recording pulled events stores their handlers' plans, and this binary has no \
             handlers: run it from an operator binary that calls \
             tickmark::cli::main_with(handlers) (docs/reconcile.md), or add --dry-run to see \
             what it would record"
                .to_owned(),
        ));
    }
    let has_handlers = handlers.is_some();
    // The pulled events are sealed and their subjects recorded as the
    // workers' are (TICKMARK_KEYS, TICKMARK_SUBJECT_KEY: docs/privacy.md).
    let privacy = Privacy::from_env().map_err(|error| Failure::Usage(error.to_string()))?;
    let engine = Engine::new(store.clone(), handlers.unwrap_or_default())
        .map_err(|error| Failure::Other(format!("the handlers do not compile: {error}")))?
        .with_privacy(privacy);
    let limits = RunLimits::default();
    let limits = RunLimits {
        max_pages: args.max_pages.unwrap_or(limits.max_pages),
        max_duration: args.max_time.unwrap_or(limits.max_duration),
        ..limits
    };
    let reconciler = configure(
        Reconciler::new(engine)
            .map_err(failure)?
            .with_run_limits(limits),
        &source,
        &args,
    )?;
    if args.from_scratch && !store.reconcile_cursor_reset(&source).await? {
        return Err(Failure::Refused(format!(
            "another process is reconciling `{source}` right now: its cursor is not reset"
        )));
    }
    // With no handlers (a dry run of the generic binary) and no --type: every kind.
    let kinds = (!args.kinds.is_empty() || !has_handlers).then(|| args.kinds.clone());
    let request = RunRequest {
        since: args.since,
        dry_run: args.dry_run,
        kinds,
    };
    let progress = LineProgress(ProgressLine::new(args.progress));
    let cancel = CancellationToken::new();
    let outcome = reconciler.run(&source, &request, &progress, &cancel).await;
    progress.0.finish();
    let summary = outcome.map_err(failure)?;
    out.emit(&summary, || human(&summary))
}

/// A reconciler with the one source the arguments describe.
fn configure(
    reconciler: Reconciler,
    source: &str,
    args: &ReconcileArgs,
) -> Result<Reconciler, Failure> {
    let provider = args
        .provider
        .or_else(|| ProviderName::from_str(source, true).ok());
    let Some(provider) = provider else {
        return Err(Failure::Usage(format!(
            "which provider's API is `{source}` read from? add --provider stripe, github or shopify"
        )));
    };
    let missing = |what: &str| Failure::Usage(format!("reconciling `{source}` needs {what}"));
    let reconciler = match provider {
        ProviderName::Stripe => {
            let key = args
                .stripe_api_key
                .as_ref()
                .ok_or_else(|| missing("STRIPE_API_KEY (or --stripe-api-key)"))?;
            let mut api = StripeApi::new(key.expose()).only_failed(args.only_failed);
            if let Some(mode) = args.stripe_mode {
                api = api.livemode(mode == StripeMode::Live);
            }
            if let Some(account) = &args.stripe_account {
                api = api.for_account(account);
            }
            if let Some(base) = &args.api_base {
                api = api.with_base_url(base).map_err(failure)?;
            }
            reconciler.stripe(source, api)
        }
        ProviderName::Github => {
            let token = args
                .github_token
                .as_ref()
                .map(|token| token.expose().to_owned())
                .ok_or_else(|| missing("GITHUB_TOKEN (or --github-token)"))?;
            let hook = args.github_hook.as_deref().ok_or_else(|| {
                missing("--github-hook repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app")
            })?;
            let recovery = if args.github_fetch_payload {
                GitHubRecovery::FetchPayload
            } else {
                GitHubRecovery::Redeliver
            };
            let mut api = GitHubApi::new(token, GitHubHook::parse(hook).map_err(failure)?)
                .with_recovery(recovery);
            if let Some(base) = &args.api_base {
                api = api.with_base_url(base).map_err(failure)?;
            }
            reconciler.github(source, api)
        }
        ProviderName::Shopify => {
            let token = args
                .shopify_access_token
                .as_ref()
                .map(|token| token.expose().to_owned())
                .ok_or_else(|| missing("SHOPIFY_ACCESS_TOKEN (or --shopify-access-token)"))?;
            let shop = args
                .shop_url
                .as_deref()
                .ok_or_else(|| missing("--shop-url https://SHOP.myshopify.com"))?;
            let callback = args
                .callback_url
                .clone()
                .ok_or_else(|| missing("--callback-url (the receiver's URL for this source)"))?;
            let api = ShopifyApi::new(shop, token, callback).map_err(failure)?;
            reconciler.shopify(source, api)
        }
    };
    Ok(reconciler)
}

/// Each page's counts on the progress line.
struct LineProgress(ProgressLine);

impl Progress for LineProgress {
    fn page(&self, pages: u64, summary: &ReconcileSummary) {
        self.0.show(&format!(
            "{}: page {pages}: {}",
            summary.source,
            summary.line()
        ));
    }
}

/// The summary, for people.
fn human(summary: &ReconcileSummary) -> String {
    let mut text = format!(
        "{} ({}{}): {}\n",
        summary.source,
        summary.provider,
        if summary.dry_run { ", dry run" } else { "" },
        summary.line()
    );
    for missing in &summary.missing_subscriptions {
        text.push_str(&format!(
            "warning: Shopify has no subscription for {} to {}\n",
            missing.topic, missing.callback_url
        ));
    }
    for note in &summary.notes {
        text.push_str(&format!("note: {note}\n"));
    }
    text
}

#[derive(Serialize)]
struct StatusRow {
    source: String,
    cursor: Option<String>,
    cursor_at: Option<chrono::DateTime<chrono::Utc>>,
    lease_owner: Option<String>,
    lease_until: Option<chrono::DateTime<chrono::Utc>>,
    last_run_finished_at: Option<chrono::DateTime<chrono::Utc>>,
    last_summary: Option<ReconcileSummary>,
}

/// Every source's cursor, lease and last run.
async fn status(store: &dyn Store, out: Output) -> Result<(), Failure> {
    let rows: Vec<StatusRow> = store
        .reconcile_cursors()
        .await?
        .into_iter()
        .map(|row| StatusRow {
            last_summary: ReconcileSummary::from_stored(row.last_summary.as_deref()),
            source: row.source,
            cursor: row.cursor,
            cursor_at: row.cursor_at,
            lease_owner: row.lease_owner,
            lease_until: row.lease_until,
            last_run_finished_at: row.last_run_finished_at,
        })
        .collect();
    out.emit(&rows, || {
        if rows.is_empty() {
            return "no source has been reconciled yet\n".to_owned();
        }
        let mut table = Table::new([
            "SOURCE",
            "CURSOR",
            "CURSOR AT",
            "LEASE",
            "LAST RUN",
            "FOUND",
        ]);
        let mut warnings = String::new();
        for row in &rows {
            let found = row
                .last_summary
                .as_ref()
                .map(|summary| match &summary.error {
                    Some(_) => format!("FAILED; {}", summary.line()),
                    None => summary.line(),
                })
                .unwrap_or_default();
            if let Some(error) = row.last_summary.as_ref().and_then(|s| s.error.as_ref()) {
                warnings.push_str(&format!(
                    "warning: {}: the last run failed at {}: {error}\n",
                    row.source,
                    time_opt(row.last_run_finished_at)
                ));
            }
            table.row(vec![
                row.source.clone(),
                truncate(row.cursor.as_deref().unwrap_or("-"), 32),
                time_opt(row.cursor_at),
                row.lease_owner.clone().unwrap_or_else(|| "-".to_owned()),
                time_opt(row.last_run_finished_at),
                truncate(&found, 80),
            ]);
            for missing in row
                .last_summary
                .iter()
                .flat_map(|summary| &summary.missing_subscriptions)
            {
                warnings.push_str(&format!(
                    "warning: {}: Shopify has no subscription for {} to {}\n",
                    row.source, missing.topic, missing.callback_url
                ));
            }
        }
        format!("{}{warnings}", table.render())
    })
}

/// A reconcile error as the command's failure (its exit code).
fn failure(error: ReconcileError) -> Failure {
    match error {
        ReconcileError::Busy { .. } | ReconcileError::ForeignAccount { .. } => {
            Failure::Refused(error.to_string())
        }
        ReconcileError::UnknownSource { .. } | ReconcileError::Config(_) => {
            Failure::Usage(error.to_string())
        }
        ReconcileError::Store(error) => error.into(),
        error => Failure::Other(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ReconcileArgs,
    }

    #[test]
    fn debug_of_the_arguments_shows_no_credential() {
        let parsed = Wrapper::try_parse_from([
            "tickmark",
            "--source",
            "stripe",
            "--stripe-api-key",
            "sk_live_topsecret",
            "--github-token",
            "ghp_topsecret",
            "--shopify-access-token",
            "shpat_topsecret",
        ])
        .expect("the arguments parse");
        let shown = format!("{parsed:?} {parsed:#?}");
        for secret in ["sk_live_topsecret", "ghp_topsecret", "shpat_topsecret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("stripe_api_key: Some(***)"), "{shown}");
        let key = parsed.args.stripe_api_key.expect("given");
        assert_eq!(key.expose(), "sk_live_topsecret");
    }
}
