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
//! The log is newest first, paged by the `Link` header; the cursor is the
//! newest delivery id a complete run read, and the next run stops there.
//! The `status` filter is not used: a delivery GitHub could not make at
//! all must be seen too, and a GUID's later success must be seen with it.

use std::collections::HashMap;
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
use crate::event::NewEvent;

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

/// What the log says of one event (GUID), newest delivery first.
#[derive(Debug)]
struct EventAttempts {
    kind: String,
    delivered: bool,
    /// The newest delivery of it: the one to redeliver or fetch.
    newest: u64,
}

/// Read the hook's log and recover what the receiver never answered.
pub(crate) async fn pull(api: &GitHubApi, run: &mut RunContext<'_>) -> Result<(), ReconcileError> {
    let filter = KindFilter::of(run);
    // From the cursor when there is one (the log itself keeps 3 days);
    // else, or when asked for a window, back to the window's start.
    let stop_at: Option<u64> = match run.request.since {
        Some(_) => None,
        None => run.cursor_id().and_then(|cursor| cursor.parse().ok()),
    };
    let start = match (run.request.since, stop_at) {
        (None, Some(_)) => None,
        (since, _) => Some(run.window_start(since.unwrap_or(DELIVERIES_HORIZON))),
    };
    let (events, order, newest) = read_log(api, run, start, stop_at).await?;
    for guid in order {
        let Some(attempts) = events.get(&guid) else {
            continue;
        };
        if !filter.takes(&attempts.kind) {
            run.summary.not_handled += 1;
            continue;
        }
        recover(api, run, &guid, attempts).await?;
    }
    run.summary.complete = true;
    // A window (`--since`) that does not reach back to the cursor leaves a
    // gap the cursor must not jump.
    let no_gap = match (start, run.cursor_at()) {
        (Some(start), Some(at)) => at >= start,
        _ => true,
    };
    if let Some((id, at)) = newest {
        if run.summary.failed == 0 && no_gap && stop_at.is_none_or(|stop| id > stop) {
            run.advance(&id.to_string(), Some(at)).await?;
        }
    }
    Ok(())
}

/// The log from now back to `start` or to the cursor: each GUID's
/// attempts, the GUIDs oldest first, and the newest delivery.
async fn read_log(
    api: &GitHubApi,
    run: &mut RunContext<'_>,
    start: Option<DateTime<Utc>>,
    stop_at: Option<u64>,
) -> Result<
    (
        HashMap<String, EventAttempts>,
        Vec<String>,
        Option<(u64, DateTime<Utc>)>,
    ),
    ReconcileError,
> {
    let mut url = api.url(&api.hook.deliveries_path());
    url.query_pairs_mut()
        .append_pair("per_page", &api.page_size.to_string());
    let mut events: HashMap<String, EventAttempts> = HashMap::new();
    let mut order = Vec::new();
    let mut newest = None;
    loop {
        let request = api.request(ApiRequest::get(url.clone()))?;
        let response = run.send(&request).await?;
        let page: Vec<Delivery> = answer(&request, &response)?.json(&request.what())?;
        let mut reached_end = page.is_empty();
        for delivery in page {
            let before_start = start.is_some_and(|start| delivery.delivered_at < start);
            if stop_at.is_some_and(|stop| delivery.id <= stop) || before_start {
                reached_end = true;
                break;
            }
            newest.get_or_insert((delivery.id, delivery.delivered_at));
            let delivered = (200..300).contains(&delivery.status_code);
            match events.get_mut(&delivery.guid) {
                Some(attempts) => attempts.delivered |= delivered,
                None => {
                    order.push(delivery.guid.clone());
                    events.insert(
                        delivery.guid,
                        EventAttempts {
                            kind: delivery.event,
                            delivered,
                            newest: delivery.id,
                        },
                    );
                }
            }
        }
        run.page_done();
        let next = next_link(&response.headers);
        match next {
            Some(next) if !reached_end => url = same_origin(api, &request, &next)?,
            _ => break,
        }
    }
    order.reverse();
    Ok((events, order, newest))
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
        (digest.len() == 32).then(|| crate::replay_key::replay_key(&[], &digest))
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

    /// The key of a fetched delivery is the key the receiver gives the same
    /// delivery pushed: checked against the receiver's own verifier.
    #[cfg(feature = "receiver")]
    #[test]
    fn a_fetched_delivery_has_the_replay_key_of_its_pushed_copy() {
        use hmac::{Hmac, Mac as _};

        use crate::receiver::providers::{Delivery, GitHub, Provider, Verdict};

        let body = br#"{"action":"opened","number":7}"#;
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"hook secret").unwrap();
        mac.update(body);
        let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        let mut headers = http::HeaderMap::new();
        headers.insert("x-hub-signature-256", signature.parse().unwrap());
        headers.insert("x-github-delivery", "guid-1".parse().unwrap());
        headers.insert("x-github-event", "pull_request".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        let pushed = GitHub::new(["hook secret"])
            .unwrap()
            .verify(&Delivery {
                headers: &headers,
                body,
                public_url: "https://hooks.example/github",
                now: chrono::Utc::now(),
            })
            .unwrap();
        let Verdict::Event(pushed) = pushed else {
            panic!("an event: {pushed:?}");
        };
        // As `GET …/deliveries/{id}` shows it: GitHub's own header spelling.
        let fetched: SentRequest = serde_json::from_value(serde_json::json!({
            "headers": { "X-GitHub-Delivery": "guid-1", "X-Hub-Signature-256": signature },
            "payload": { "action": "opened", "number": 7 },
        }))
        .unwrap();
        assert!(pushed.replay_key.is_some());
        assert_eq!(fetched.replay_key(), pushed.replay_key);
        let unsigned: SentRequest =
            serde_json::from_value(serde_json::json!({ "headers": {}, "payload": {} })).unwrap();
        assert_eq!(unsigned.replay_key(), None);
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
