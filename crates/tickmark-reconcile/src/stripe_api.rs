//! How to reach a Stripe account's events ([`StripeApi`]: the key, the
//! address, the account and mode the source's events are in) and the limits
//! Stripe's API sets. Pulling from it is `stripe.rs`; holding a run to the
//! account and mode, `stripe_account.rs`: both read this, neither the other.

use std::time::Duration;

use url::Url;

use super::base_url::parse_base;
use super::error::ReconcileError;

/// How long Stripe keeps events listable: 30 days.
/// <https://docs.stripe.com/api/events>
pub const EVENTS_HORIZON: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// How far a first run looks back unless told: the 3 days Stripe retries
/// a live-mode delivery for (what is older was either delivered or given up).
pub const DEFAULT_FIRST_LOOKBACK: Duration = Duration::from_secs(3 * 24 * 60 * 60);

/// The most types one list request may filter on (`types[]`).
/// <https://docs.stripe.com/api/events/list#list_events-types>
pub const MAX_TYPES: usize = 20;

/// The largest page Stripe serves.
const MAX_PAGE: u32 = 100;

/// How to reach a Stripe account's events.
#[derive(Clone)]
pub struct StripeApi {
    pub(super) api_key: String,
    pub(super) base_url: Url,
    pub(super) only_failed: bool,
    pub(super) first_lookback: Duration,
    pub(super) page_size: u32,
    /// The mode the source's events are in, when configured.
    livemode: Option<bool>,
    /// The account the key must be, when configured.
    account: Option<String>,
}

impl std::fmt::Debug for StripeApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripeApi")
            .field("base_url", &self.base_url.as_str())
            .field("only_failed", &self.only_failed)
            .field("first_lookback", &self.first_lookback)
            .field("page_size", &self.page_size)
            .field("livemode", &self.livemode)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl StripeApi {
    /// Stripe's API (`https://api.stripe.com`) with this secret or
    /// restricted key (a restricted key needs only read access to events).
    pub fn new(api_key: impl Into<String>) -> Self {
        Self {
            api_key: api_key.into(),
            base_url: Url::parse("https://api.stripe.com").expect("a valid constant URL"),
            only_failed: false,
            first_lookback: DEFAULT_FIRST_LOOKBACK,
            page_size: MAX_PAGE,
            livemode: None,
            account: None,
        }
    }

    /// The source's events are live-mode (`true`) or test-mode (`false`)
    /// events: a run refuses an event of the other mode (a key of the other
    /// mode) before recording it. Unset, the mode is the one of the source's
    /// newest events in the inbox (`stripe_account.rs`).
    pub fn livemode(mut self, livemode: bool) -> Self {
        self.livemode = Some(livemode);
        self
    }

    /// The key must be account `account`'s (`acct_…`): each run asks
    /// Stripe (`GET /v1/account`, which a restricted key needs read access
    /// to) and refuses another account's key before reading any event.
    pub fn for_account(mut self, account: impl Into<String>) -> Self {
        self.account = Some(account.into());
        self
    }

    /// The configured account, if any.
    pub(crate) fn configured_account(&self) -> Option<&str> {
        self.account.as_deref()
    }

    /// The configured mode, if any.
    pub(crate) fn configured_livemode(&self) -> Option<bool> {
        self.livemode
    }

    /// Where the API is.
    pub(crate) fn base_url(&self) -> &Url {
        &self.base_url
    }

    /// The key requests are sent with.
    pub(crate) fn api_key(&self) -> &str {
        &self.api_key
    }

    /// Another address for the API (a test server, a proxy): `https://`, or
    /// `http://` on a loopback host only (the key goes with every request).
    pub fn with_base_url(mut self, base_url: &str) -> Result<Self, ReconcileError> {
        self.base_url = parse_base(base_url)?;
        Ok(self)
    }

    /// List only events Stripe has not delivered to every endpoint
    /// (`delivery_success=false`): far fewer pages on a healthy account.
    pub fn only_failed(mut self, only_failed: bool) -> Self {
        self.only_failed = only_failed;
        self
    }

    /// How far a first run looks back (at most [`EVENTS_HORIZON`]).
    pub fn with_first_lookback(mut self, lookback: Duration) -> Self {
        self.first_lookback = lookback.min(EVENTS_HORIZON);
        self
    }

    /// Events per page (1 to 100).
    pub fn with_page_size(mut self, size: u32) -> Self {
        self.page_size = size.clamp(1, MAX_PAGE);
        self
    }
}
