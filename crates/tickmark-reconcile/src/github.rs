//! GitHub: the deliveries the receiver missed, from the hook's delivery log,
//! sent again by GitHub itself.
//!
//! GitHub does not retry a failed delivery, and lists a hook's deliveries
//! for 3 days; a run reads that log (a repository's, an organisation's or
//! the App's hook), and for every event (GUID) with no delivery answered
//! 2xx that the inbox does not have, asks GitHub to redeliver it, so the
//! signed delivery arrives through the receiver with its GUID (the dedup
//! key). Or, when configured, it fetches the delivery's payload and records
//! it directly.
//! <https://docs.github.com/en/webhooks/using-webhooks/handling-failed-webhook-deliveries>,
//! <https://docs.github.com/en/rest/repos/webhooks#list-deliveries-for-a-repository-webhook>,
//! <https://docs.github.com/en/rest/repos/webhooks#redeliver-a-delivery-for-a-repository-webhook>
//!
//! The log is newest first, paged by the `Link` header. A run reads it down
//! to the cursor less [`CURSOR_OVERLAP`] (or a window's start), holding
//! the newest and the last page and each page's address, then goes back up
//! page by page, oldest first, moving the cursor (the newest delivery id
//! handled) after each page.
//! The `status` filter is not used: a delivery GitHub could not make at
//! all must be seen too, and a GUID's later success must be seen with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use http::header::{ACCEPT, AUTHORIZATION};
use serde::Deserialize;
use url::Url;

use super::api_client::{ApiRequest, ApiResponse};
use super::base_url::{parse_base, trailing_slash};
use super::error::ReconcileError;
use super::kind_filter::KindFilter;
use super::link_header::next_link;
use super::run_context::RunContext;
use tickmark_driver::event::NewEvent;

/// How long GitHub lists a hook's deliveries on github.com.
/// <https://docs.github.com/en/webhooks/testing-and-troubleshooting-webhooks/redelivering-webhooks>
pub const DELIVERIES_HORIZON: Duration = Duration::from_secs(3 * 24 * 60 * 60);

/// Which hook's deliveries to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitHubHook {
    /// A repository's hook: `/repos/{owner}/{repo}/hooks/{id}`.
    Repository {
        /// The owner (user or organisation).
        owner: String,
        /// The repository.
        repo: String,
        /// The hook's id.
        hook_id: u64,
    },
    /// An organisation's hook: `/orgs/{org}/hooks/{id}`.
    Organization {
        /// The organisation.
        org: String,
        /// The hook's id.
        hook_id: u64,
    },
    /// The GitHub App's own hook: `/app/hook` (authenticated as the App, with a JWT).
    App,
}

impl GitHubHook {
    /// Read `repos/OWNER/REPO/hooks/ID`, `orgs/ORG/hooks/ID` or `app`.
    pub fn parse(text: &str) -> Result<Self, ReconcileError> {
        let parts: Vec<&str> = text.trim_matches('/').split('/').collect();
        let id = |text: &str| {
            text.parse::<u64>().map_err(|_| {
                ReconcileError::Config(format!("GitHub hook `{text}`: the hook id is a number"))
            })
        };
        match parts.as_slice() {
            ["app"] | ["app", "hook"] => Ok(GitHubHook::App),
            ["repos", owner, repo, "hooks", hook] => Ok(GitHubHook::Repository {
                owner: (*owner).to_owned(),
                repo: (*repo).to_owned(),
                hook_id: id(hook)?,
            }),
            ["orgs", org, "hooks", hook] => Ok(GitHubHook::Organization {
                org: (*org).to_owned(),
                hook_id: id(hook)?,
            }),
            _ => Err(ReconcileError::Config(format!(
                "GitHub hook `{text}`: give repos/OWNER/REPO/hooks/ID, orgs/ORG/hooks/ID or app"
            ))),
        }
    }

    /// The path of its deliveries, with no leading slash.
    fn deliveries_path(&self) -> String {
        match self {
            GitHubHook::Repository {
                owner,
                repo,
                hook_id,
            } => format!("repos/{owner}/{repo}/hooks/{hook_id}/deliveries"),
            GitHubHook::Organization { org, hook_id } => {
                format!("orgs/{org}/hooks/{hook_id}/deliveries")
            }
            GitHubHook::App => "app/hook/deliveries".to_owned(),
        }
    }
}

/// What a run does with an event GitHub failed to deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GitHubRecovery {
    /// Ask GitHub to send it again (`POST …/deliveries/{id}/attempts`): the
    /// signed delivery arrives through the receiver. The default.
    #[default]
    Redeliver,
    /// Fetch the delivery's payload (`GET …/deliveries/{id}`) and record it
    /// directly, for a receiver GitHub cannot reach right now.
    FetchPayload,
}

/// Makes the `Authorization` token for each request: a fixed token, or a
/// fresh JWT for the App's hook.
pub type TokenSource = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// How to reach a hook's delivery log.
#[derive(Clone)]
pub struct GitHubApi {
    token: TokenSource,
    base_url: Url,
    hook: GitHubHook,
    recovery: GitHubRecovery,
    page_size: u32,
}

impl std::fmt::Debug for GitHubApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitHubApi")
            .field("base_url", &self.base_url.as_str())
            .field("hook", &self.hook)
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

impl GitHubApi {
    /// `https://api.github.com`, `hook`, with this token (a personal or
    /// installation token with the hooks' read and write permission; for
    /// [`GitHubHook::App`], the App's JWT: see [`with_token_source`](Self::with_token_source)).
    pub fn new(token: impl Into<String>, hook: GitHubHook) -> Self {
        let token = token.into();
        Self {
            token: Arc::new(move || Ok(token.clone())),
            base_url: Url::parse("https://api.github.com").expect("a valid constant URL"),
            hook,
            recovery: GitHubRecovery::default(),
            page_size: 100,
        }
    }

    /// Make the token anew for each request (an App's JWT lives 10 minutes).
    pub fn with_token_source(mut self, source: TokenSource) -> Self {
        self.token = source;
        self
    }

    /// Another address for the API (GitHub Enterprise Server's
    /// `https://HOST/api/v3`, a test server): `https://`, or `http://` on a
    /// loopback host only (the token goes with every request).
    pub fn with_base_url(mut self, base_url: &str) -> Result<Self, ReconcileError> {
        self.base_url = parse_base(base_url)?;
        Ok(self)
    }

    /// Redeliver (the default) or fetch the payloads.
    pub fn with_recovery(mut self, recovery: GitHubRecovery) -> Self {
        self.recovery = recovery;
        self
    }

    /// Deliveries per page (1 to 100).
    pub fn with_page_size(mut self, size: u32) -> Self {
        self.page_size = size.clamp(1, 100);
        self
    }

    fn url(&self, path: &str) -> Url {
        let mut url = self.base_url.clone();
        url.set_path(&format!("{}{path}", trailing_slash(url.path())));
        url
    }

    fn request(&self, request: ApiRequest) -> Result<ApiRequest, ReconcileError> {
        let token = (self.token)().map_err(|error| {
            ReconcileError::Config(format!("cannot make the GitHub token: {error}"))
        })?;
        Ok(request
            .header(ACCEPT, "application/vnd.github+json")
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .header(
                http::HeaderName::from_static("x-github-api-version"),
                "2022-11-28",
            ))
    }
}

/// One entry of a hook's delivery log.
#[derive(Debug, Clone, Deserialize)]
struct Delivery {
    id: u64,
    guid: String,
    delivered_at: DateTime<Utc>,
    status_code: u16,
    event: String,
}

/// How far behind the cursor a run reads the log again. A delivery is
/// listed once its attempt ends (GitHub waits up to 10 s for a receiver), so
/// it can appear after a newer one the last run already read; re-reading a
/// margin finds it, and costs nothing else: a GUID delivered, or one the
/// inbox has, is left alone.
pub const CURSOR_OVERLAP: Duration = Duration::from_secs(5 * 60);

/// What one stretch of the log says of one event (GUID).
#[derive(Debug)]
struct EventAttempts {
    kind: String,
    delivered: bool,
    /// The newest delivery of it: the one to redeliver or fetch.
    newest: u64,
}

/// Where a run stops reading down the log.
#[derive(Debug, Clone, Copy)]
enum Floor {
    /// Deliveries made before this time (a window's start, or the cursor's
    /// time less [`CURSOR_OVERLAP`]) are not read.
    At(DateTime<Utc>),
    /// Deliveries up to this id are not read (a cursor of unknown time).
    After(u64),
}

impl Floor {
    fn below(self, delivery: &Delivery) -> bool {
        match self {
            Floor::At(at) => delivery.delivered_at < at,
            Floor::After(id) => delivery.id <= id,
        }
    }
}

/// One page of the log as the way down found it: its address, and its
/// oldest and newest delivery.
#[derive(Debug)]
struct Anchor {
    url: Url,
    low: u64,
    high: u64,
}

/// The way down: each page's anchor, newest first, and the first and last
/// pages read (the newest and the oldest), held so that they are not read
/// twice (the newest would be pushed on by every delivery since, the run's
/// own redeliveries included).
#[derive(Debug, Default)]
struct Scan {
    anchors: Vec<Anchor>,
    newest_page: Vec<Delivery>,
    oldest_page: Vec<Delivery>,
}

/// What the way up keeps: the GUIDs handled in this run (an event's
/// deliveries can span pages), and the cursor as moved so far.
#[derive(Debug)]
struct Handled {
    guids: HashSet<String>,
    cursor: Option<u64>,
    moves: bool,
}

/// Read the hook's log and recover what the receiver never answered: down
/// the log from now to the cursor (less a margin) or the window's start,
/// holding one page, then back up page by page, oldest first, moving the
/// cursor after each page.
pub(crate) async fn pull(api: &GitHubApi, run: &mut RunContext<'_>) -> Result<(), ReconcileError> {
    let filter = KindFilter::of(run);
    let cursor: Option<u64> = run.cursor_id().and_then(|cursor| cursor.parse().ok());
    let overlap = chrono::Duration::from_std(CURSOR_OVERLAP).unwrap_or(chrono::Duration::zero());
    let floor = match (run.request.since, cursor, run.cursor_at()) {
        (None, Some(_), Some(at)) => Floor::At(at.checked_sub_signed(overlap).unwrap_or(at)),
        (None, Some(id), None) => Floor::After(id),
        (since, _, _) => Floor::At(run.window_start(since.unwrap_or(DELIVERIES_HORIZON))),
    };
    // A window (`--since`) that does not reach back to the cursor leaves a
    // gap the cursor must not jump.
    let no_gap = match (run.request.since, run.cursor_at()) {
        (Some(since), Some(at)) => at >= run.window_start(since),
        _ => true,
    };
    let Scan {
        anchors,
        mut newest_page,
        mut oldest_page,
    } = scan(api, run, floor).await?;
    let mut handled = Handled {
        guids: HashSet::new(),
        cursor,
        moves: no_gap,
    };
    for (k, anchor) in anchors.iter().enumerate().rev() {
        // A page behind the cursor (the margin read again) holds nothing a
        // run has not read: it does not count toward the page cap, so a run
        // always gets past it.
        let behind = cursor.is_some_and(|cursor| anchor.high <= cursor);
        if !behind {
            run.check_page_cap()?;
        }
        let upper = k.checked_sub(1).map(|newer| anchors[newer].low);
        let page = if k + 1 == anchors.len() {
            std::mem::take(&mut oldest_page)
        } else if k == 0 {
            std::mem::take(&mut newest_page)
        } else {
            read_down_to(api, run, anchor).await?
        };
        let stretch: Vec<Delivery> = page
            .into_iter()
            .filter(|delivery| {
                delivery.id >= anchor.low
                    && upper.is_none_or(|upper| delivery.id < upper)
                    && !floor.below(delivery)
            })
            .collect();
        handle_stretch(api, run, &filter, &mut handled, stretch).await?;
        if behind {
            run.scan_page_done();
        } else {
            run.page_done();
        }
    }
    run.summary.complete = true;
    Ok(())
}

/// Down the log by its `Link` header until the floor, holding only the
/// last page: each page must be older than the one before (else the
/// answer makes no progress).
async fn scan(
    api: &GitHubApi,
    run: &mut RunContext<'_>,
    floor: Floor,
) -> Result<Scan, ReconcileError> {
    let mut url = api.url(&api.hook.deliveries_path());
    url.query_pairs_mut()
        .append_pair("per_page", &api.page_size.to_string());
    let mut scan = Scan::default();
    loop {
        run.check_scan_cap(&format!("GET {url}"))?;
        let below = scan.anchors.last().map(|anchor| anchor.low);
        let (page, next) = read_page(api, run, &url, below).await?;
        run.scan_page_done();
        let ids = page.iter().map(|delivery| delivery.id);
        let (Some(low), Some(high)) = (ids.clone().min(), ids.max()) else {
            return Ok(scan);
        };
        let reached_floor = page.iter().any(|delivery| floor.below(delivery));
        scan.anchors.push(Anchor {
            url: url.clone(),
            low,
            high,
        });
        if scan.anchors.len() == 1 {
            scan.newest_page.clone_from(&page);
        }
        scan.oldest_page = page;
        match next {
            Some(next) if !reached_floor => url = next,
            _ => return Ok(scan),
        }
    }
}

/// The page at `anchor` read again, and the pages after it until its
/// oldest delivery (deliveries listed since the way down push it on).
async fn read_down_to(
    api: &GitHubApi,
    run: &mut RunContext<'_>,
    anchor: &Anchor,
) -> Result<Vec<Delivery>, ReconcileError> {
    let mut url = anchor.url.clone();
    let mut read: Vec<Delivery> = Vec::new();
    loop {
        let below = read.iter().map(|delivery| delivery.id).min();
        if below.is_some() {
            // Past the page itself: pushed on by deliveries listed since.
            run.check_scan_cap(&format!("GET {url}"))?;
            run.scan_page_done();
        }
        let (page, next) = read_page(api, run, &url, below).await?;
        let reached = page.iter().any(|delivery| delivery.id <= anchor.low);
        let empty = page.is_empty();
        read.extend(page);
        match next {
            Some(next) if !reached && !empty => url = next,
            _ => return Ok(read),
        }
    }
}

/// One page of the log and its `next` address (on the API's origin).
/// `below`: the oldest delivery of the page before, which every delivery
/// of this one must be older than.
async fn read_page(
    api: &GitHubApi,
    run: &mut RunContext<'_>,
    url: &Url,
    below: Option<u64>,
) -> Result<(Vec<Delivery>, Option<Url>), ReconcileError> {
    let request = api.request(ApiRequest::get(url.clone()))?;
    let response = run.send(&request).await?;
    let page: Vec<Delivery> = answer(&request, &response)?.json(&request.what())?;
    let next = next_link(&response.headers)
        .map(|next| same_origin(api, &request, &next))
        .transpose()?;
    let stuck = |reason: &str| ReconcileError::NoProgress {
        what: request.what(),
        reason: reason.to_owned(),
    };
    if page.is_empty() && next.is_some() {
        return Err(stuck("an empty page with a next page"));
    }
    if below.is_some_and(|below| page.iter().any(|delivery| delivery.id >= below)) {
        return Err(stuck(
            "the next page holds deliveries no older than the page before (the same page again, or it went backward)",
        ));
    }
    Ok((page, next))
}

/// Recover one stretch of the log, oldest event first, then move the cursor
/// to its newest delivery (unless a recovery failed, or a gap is behind).
async fn handle_stretch(
    api: &GitHubApi,
    run: &mut RunContext<'_>,
    filter: &KindFilter,
    handled: &mut Handled,
    mut stretch: Vec<Delivery>,
) -> Result<(), ReconcileError> {
    stretch.sort_by_key(|delivery| delivery.id);
    let mut events: HashMap<&str, EventAttempts> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    for delivery in &stretch {
        let delivered = (200..300).contains(&delivery.status_code);
        let attempts = events.entry(delivery.guid.as_str()).or_insert_with(|| {
            order.push(delivery.guid.as_str());
            EventAttempts {
                kind: delivery.event.clone(),
                delivered: false,
                newest: delivery.id,
            }
        });
        attempts.delivered |= delivered;
        attempts.newest = attempts.newest.max(delivery.id);
    }
    for guid in order {
        let Some(attempts) = events.get(guid) else {
            continue;
        };
        if !handled.guids.insert(guid.to_owned()) {
            continue;
        }
        if !filter.takes(&attempts.kind) {
            run.summary.not_handled += 1;
            continue;
        }
        recover(api, run, guid, attempts).await?;
    }
    let Some(newest) = stretch.last() else {
        return Ok(());
    };
    let moves_on = handled.cursor.is_none_or(|cursor| newest.id > cursor);
    if handled.moves && run.summary.failed == 0 && moves_on {
        run.advance(&newest.id.to_string(), Some(newest.delivered_at))
            .await?;
        handled.cursor = Some(newest.id);
    }
    Ok(())
}

/// Redeliver or fetch one event that no delivery brought in.
async fn recover(
    api: &GitHubApi,
    run: &mut RunContext<'_>,
    guid: &str,
    attempts: &EventAttempts,
) -> Result<(), ReconcileError> {
    if attempts.delivered {
        run.summary.seen += 1;
        run.summary.already_had += 1;
        return Ok(());
    }
    match api.recovery {
        GitHubRecovery::FetchPayload => {
            if run.inbox_has(guid).await? {
                run.summary.seen += 1;
                run.summary.already_had += 1;
                return Ok(());
            }
            let path = format!("{}/{}", api.hook.deliveries_path(), attempts.newest);
            let request = api.request(ApiRequest::get(api.url(&path)))?;
            let response = run.send(&request).await?;
            let full: FullDelivery = answer(&request, &response)?.json(&request.what())?;
            let replay_key = full.request.replay_key();
            let mut event =
                NewEvent::with_id(run.source, guid, &attempts.kind, full.request.payload);
            event.replay_key = replay_key;
            run.record_event(event).await
        }
        GitHubRecovery::Redeliver => {
            run.summary.seen += 1;
            if run.inbox_has(guid).await? {
                run.summary.already_had += 1;
                return Ok(());
            }
            if run.request.dry_run {
                run.summary.redelivered += 1;
                return Ok(());
            }
            let path = format!(
                "{}/{}/attempts",
                api.hook.deliveries_path(),
                attempts.newest
            );
            let request = api.request(ApiRequest::post(api.url(&path), None))?;
            match run.send(&request).await {
                Ok(response) if response.status.is_success() => {
                    run.summary.redelivered += 1;
                    run.engine
                        .metrics()
                        .event_reconciled(run.source, "redelivered");
                    tracing::info!(source = %run.source, event_id = %guid, delivery = attempts.newest, "reconcile: asked GitHub to redeliver");
                }
                Ok(response) => {
                    run.summary.failed += 1;
                    let refused = response.refused(&request.what(), GITHUB_HINT);
                    run.note(refused.to_string());
                }
                Err(error)
                    if error.is_lease_lost() || matches!(error, ReconcileError::Cancelled) =>
                {
                    return Err(error);
                }
                Err(error) => {
                    run.summary.failed += 1;
                    run.note(error.to_string());
                }
            }
            Ok(())
        }
    }
}

/// `GET …/deliveries/{id}`: what was sent.
#[derive(Debug, Deserialize)]
struct FullDelivery {
    request: SentRequest,
}

#[derive(Debug, Deserialize)]
struct SentRequest {
    /// The headers GitHub sent, by name (as GitHub spells them).
    #[serde(default)]
    headers: HashMap<String, serde_json::Value>,
    payload: serde_json::Value,
}

impl SentRequest {
    /// The replay key the receiver gives this delivery when it arrives
    /// signed: derived from its `X-Hub-Signature-256` (`sha256=<64 hex>`),
    /// which covers the body alone (`receiver/providers/github.rs`). So a
    /// fetched event and a later push of the same signed body under another
    /// delivery id are one event, as two pushes would be. `None` when the
    /// hook signs nothing (no secret): the receiver would refuse the push.
    fn replay_key(&self) -> Option<String> {
        let signature = self
            .headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("x-hub-signature-256"))?
            .1
            .as_str()?;
        let digest = hex::decode(signature.trim().strip_prefix("sha256=")?).ok()?;
        (digest.len() == 32).then(|| tickmark_core::replay_key::replay_key(&[], &digest))
    }
}

const GITHUB_HINT: &str = "check the token (it needs the hook's read and write permission; the App's hook takes the App's JWT), the hook and the base URL";

/// A 2xx answer, or GitHub's refusal in words.
fn answer<'r>(
    request: &ApiRequest,
    response: &'r ApiResponse,
) -> Result<&'r ApiResponse, ReconcileError> {
    if response.status.is_success() {
        Ok(response)
    } else {
        Err(response.refused(&request.what(), GITHUB_HINT))
    }
}

/// The `next` link, if it stays on the API's own scheme, host and port
/// (the token goes with it).
fn same_origin(api: &GitHubApi, request: &ApiRequest, next: &str) -> Result<Url, ReconcileError> {
    let url = Url::parse(next).map_err(|error| ReconcileError::Malformed {
        what: request.what(),
        reason: format!("the Link header's next address: {error}"),
    })?;
    if url.origin() != api.base_url.origin() {
        return Err(ReconcileError::Malformed {
            what: request.what(),
            reason: format!(
                "the Link header's next address leaves the API ({}): not followed",
                url.origin().ascii_serialization()
            ),
        });
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of a fetched delivery is derived from the signature GitHub
    /// shows in its log, whatever the header's spelling, as the receiver
    /// derives a pushed delivery's (that the two agree end to end, through
    /// the real receiver, is `reconcile_github::payloads_are_fetched_and_
    /// recorded_while_the_receiver_is_down`: a replay of the fetched body is
    /// a duplicate). The receiver is a layer beside this one: not imported.
    #[test]
    fn a_fetched_delivery_has_the_replay_key_of_its_signature() {
        // An HMAC-SHA256 is 32 bytes; which 32 does not matter here.
        let digest: Vec<u8> = (0..32).collect();
        let signature = format!("sha256={}", hex::encode(&digest));
        // As `GET …/deliveries/{id}` shows it: GitHub's own header spelling.
        let fetched: SentRequest = serde_json::from_value(serde_json::json!({
            "headers": { "X-GitHub-Delivery": "guid-1", "X-Hub-Signature-256": signature },
            "payload": { "action": "opened", "number": 7 },
        }))
        .unwrap();
        assert_eq!(
            fetched.replay_key(),
            Some(tickmark_core::replay_key::replay_key(&[], &digest))
        );
        let unsigned: SentRequest =
            serde_json::from_value(serde_json::json!({ "headers": {}, "payload": {} })).unwrap();
        assert_eq!(unsigned.replay_key(), None);
        let not_sha256: SentRequest = serde_json::from_value(serde_json::json!({
            "headers": { "x-hub-signature-256": "sha1=abcd" },
            "payload": {},
        }))
        .unwrap();
        assert_eq!(not_sha256.replay_key(), None);
    }

    #[test]
    fn hooks_parse_from_their_paths() {
        assert_eq!(GitHubHook::parse("app").unwrap(), GitHubHook::App);
        assert_eq!(
            GitHubHook::parse("repos/octo/shop/hooks/12").unwrap(),
            GitHubHook::Repository {
                owner: "octo".into(),
                repo: "shop".into(),
                hook_id: 12
            }
        );
        assert_eq!(
            GitHubHook::parse("/orgs/octo/hooks/3/").unwrap(),
            GitHubHook::Organization {
                org: "octo".into(),
                hook_id: 3
            }
        );
        assert!(GitHubHook::parse("repos/octo/hooks/x").is_err());
        assert!(GitHubHook::parse("orgs/octo/hooks/notanumber").is_err());
    }
}
