//! Whose events a Stripe source takes: one account, in one mode, and the
//! check every pulled event passes before it is recorded.
//!
//! A key lists its own account's events in its own mode. Given the key of
//! the other mode (`sk_test_…` where the source's webhook endpoint is a
//! live one) or of another account, a run would record that account's
//! events as the source's, and after a cursor Stripe does not know (the
//! other account has no such event) 30 days of them. Stripe's own fields
//! say whose an event is:
//!
//! - `livemode`: "Has the value `true` if the object exists in live mode or
//!   the value `false` if the object exists in test mode"
//!   (<https://docs.stripe.com/api/events/object#event_object-livemode>);
//! - `account`: "The connected account that originates the event", on
//!   Connect events only
//!   (<https://docs.stripe.com/api/events/object#event_object-account>);
//! - `GET /v1/account`: the key's own account, its `id` `acct_…`
//!   (<https://docs.stripe.com/api/accounts/retrieve>).
//!
//! What the source takes is what it was set up with
//! ([`StripeApi::livemode`](super::StripeApi::livemode),
//! [`StripeApi::for_account`](super::StripeApi::for_account)), else what its
//! receiver has taken: the newest events of the source in the inbox, pushed
//! by its webhook endpoint (or pulled by earlier runs), carry the source's
//! mode and `account`. Learnt from the inbox rather than from the key, which
//! is the thing that may be wrong, and with no setting to keep in step.
//! An event that does not match ends the run before it is recorded
//! ([`ReconcileError::ForeignAccount`]).
//!
//! Two accounts in one mode, neither Connect, list events that look alike;
//! `for_account` tells them apart (one `GET /v1/account` a run), and so does
//! a cursor: Stripe keeps every event 30 days, so a cursor younger than that
//! which Stripe says it does not know was read with another account's key.

use http::header::AUTHORIZATION;
use serde::Deserialize;
use serde_json::Value;

use super::api_client::ApiRequest;
use super::base_url::trailing_slash;
use super::error::ReconcileError;
use super::run_context::RunContext;
use super::stripe_api::{StripeApi, EVENTS_HORIZON};
use tickmark_driver::store::admin::EventFilter;

/// How many of the source's newest inbox events are looked at for one that
/// says its mode (every Stripe event does; a hand-made one may not).
const INBOX_LOOK: u32 = 20;

/// A cursor younger than the horizon by at least this is one Stripe must
/// still have (a day of margin for clocks).
const CURSOR_MARGIN: chrono::Duration = chrono::Duration::days(1);

/// What the source's events are: mode and account, and why we think so.
#[derive(Debug, Clone, Default)]
pub(crate) struct SourceAccount {
    /// `None`: nothing to go by (nothing configured, an empty inbox).
    livemode: Option<bool>,
    /// The Connect account the source's events come from; `None` for an
    /// account's own events, which carry no `account`.
    account: Option<String>,
    /// Where `livemode` and `account` come from, in words.
    why: String,
}

/// The fields of an event that say whose it is.
#[derive(Debug, Deserialize)]
struct Whose {
    id: String,
    livemode: Option<bool>,
    account: Option<String>,
}

/// `GET /v1/account`'s answer, the part read.
#[derive(Debug, Deserialize)]
struct Account {
    id: String,
}

impl SourceAccount {
    /// What `run.source` takes: as configured, else as its inbox shows.
    /// With a configured account, asks Stripe whose the key is first.
    pub async fn of(api: &StripeApi, run: &RunContext<'_>) -> Result<Self, ReconcileError> {
        if let Some(expected) = api.configured_account() {
            let actual = key_account(api, run).await?;
            if actual != expected {
                return Err(foreign(
                    run,
                    format!("the API key is account {actual}'s"),
                    format!(
                        "the source takes account {expected}'s events (StripeApi::for_account)"
                    ),
                    format!("give a key of account {expected}"),
                ));
            }
        }
        let learnt = inbox_account(run).await?;
        let (livemode, why) = match (api.configured_livemode(), &learnt) {
            (Some(livemode), _) => (
                Some(livemode),
                "as configured (StripeApi::livemode)".to_owned(),
            ),
            (None, Some(whose)) => (
                whose.livemode,
                format!("as its newest event in the inbox, {}, is", whose.id),
            ),
            (None, None) => (None, String::new()),
        };
        Ok(Self {
            livemode,
            account: learnt.and_then(|whose| whose.account),
            why,
        })
    }

    /// Refuse `event` unless it is of the source's mode and account.
    pub fn check(&self, run: &RunContext<'_>, event: &Value) -> Result<(), ReconcileError> {
        // Every listed event has an id (`heads_of` checked it); `livemode`
        // and `account` may be absent, and an event is judged by what it has.
        let Ok(whose) = Whose::deserialize(event) else {
            return Ok(());
        };
        if let (Some(expected), Some(actual)) = (self.livemode, whose.livemode) {
            if expected != actual {
                return Err(foreign(
                    run,
                    format!("Stripe listed {}, a {} event", whose.id, mode(actual)),
                    format!(
                        "the source's events are {} events ({})",
                        mode(expected),
                        self.why
                    ),
                    format!(
                        "give the source's {} key ({}), or, if the source really takes {} \
                         events now, say so (StripeApi::livemode({actual}), `--stripe-mode {}`)",
                        mode(expected),
                        key_prefixes(expected),
                        mode(actual),
                        if actual { "live" } else { "test" },
                    ),
                ));
            }
        }
        if let Some(account) = &whose.account {
            if self.account.as_ref() != Some(account) {
                let expected = match &self.account {
                    Some(expected) => format!("account {expected}'s"),
                    None => "the key's own account's (no Connect `account`)".to_owned(),
                };
                return Err(foreign(
                    run,
                    format!(
                        "Stripe listed {}, an event of connected account {account}",
                        whose.id
                    ),
                    format!("the source's events are {expected}"),
                    "give the key of the source's account (Connect accounts' events are not \
                     reconciled: docs/reconcile.md)"
                        .to_owned(),
                ));
            }
        }
        Ok(())
    }
}

/// Refuse a cursor Stripe says it does not know when it was created within
/// the 30 days Stripe keeps events: the key is another account's (or
/// mode's) than the one the cursor was read with. Reading the 30 days
/// instead would record that account's events.
pub(crate) fn check_lost_cursor(run: &RunContext<'_>, cursor: &str) -> Result<(), ReconcileError> {
    let Some(at) = run.cursor_at() else {
        return Ok(());
    };
    let horizon = chrono::Duration::from_std(EVENTS_HORIZON).unwrap_or(chrono::Duration::MAX);
    if run.now - at >= horizon - CURSOR_MARGIN {
        return Ok(());
    }
    Err(foreign(
        run,
        format!("Stripe does not know the cursor's event {cursor}"),
        format!(
            "it was created at {}, within the 30 days Stripe keeps every event, by the key of \
             the runs before",
            at.format("%Y-%m-%dT%H:%M:%SZ")
        ),
        format!(
            "give the key of the account and mode the source was reconciled with; if the \
             source really moved to this key's account, forget the cursor \
             (`tickmark reconcile --source {} --from-scratch`)",
            run.source
        ),
    ))
}

/// The source's newest inbox event that says its mode.
async fn inbox_account(run: &RunContext<'_>) -> Result<Option<Whose>, ReconcileError> {
    let filter = EventFilter {
        source: Some(run.source.to_owned()),
        limit: INBOX_LOOK,
        ..EventFilter::default()
    };
    let newest = run.engine.store().event_list(&filter).await?;
    Ok(newest.into_iter().find_map(|record| {
        let whose = Whose::deserialize(&record.event.payload).ok()?;
        whose.livemode?;
        Some(whose)
    }))
}

/// The account the API key belongs to: `GET /v1/account`'s `id`.
async fn key_account(api: &StripeApi, run: &RunContext<'_>) -> Result<String, ReconcileError> {
    let mut url = api.base_url().clone();
    url.set_path(&format!("{}v1/account", trailing_slash(url.path())));
    let request = ApiRequest::get(url).header(AUTHORIZATION, format!("Bearer {}", api.api_key()));
    let response = run.send(&request).await?;
    let what = request.what();
    if !response.status.is_success() {
        return Err(response.refused(
            &what,
            "StripeApi::for_account reads the key's account: give the key read access to it \
             (a restricted key: Account, Read), or leave for_account out",
        ));
    }
    Ok(response.json::<Account>(&what)?.id)
}

/// The refusal, in the run's words.
fn foreign(run: &RunContext<'_>, found: String, expected: String, fix: String) -> ReconcileError {
    ReconcileError::ForeignAccount {
        source_name: run.source.to_owned(),
        found,
        expected,
        fix,
    }
}

/// `live-mode` or `test-mode`, as Stripe's docs speak of events.
fn mode(livemode: bool) -> &'static str {
    if livemode {
        "live-mode"
    } else {
        "test-mode"
    }
}

/// The prefixes of a mode's secret and restricted keys
/// (<https://docs.stripe.com/keys#obtain-api-keys>).
fn key_prefixes(livemode: bool) -> &'static str {
    if livemode {
        "sk_live_… or rk_live_…"
    } else {
        "sk_test_… or rk_test_…"
    }
}
