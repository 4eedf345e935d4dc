//! What the fake GitHub keeps: hooks and their deliveries, and the JSON
//! GitHub's REST API renders them as.
//!
//! Field names and types follow GitHub's OpenAPI description as shipped in
//! `@octokit/openapi-types` (schemas `hook-delivery-item` and
//! `hook-delivery`), documented at
//! <https://docs.github.com/en/rest/repos/webhooks#list-deliveries-for-a-repository-webhook>
//! and <https://docs.github.com/en/rest/repos/webhooks#get-a-delivery-for-a-repository-webhook>.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};

/// Which hook: a repository's, an organisation's, or the GitHub App's (the
/// App has one hook, so its paths carry no hook id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HookRef {
    /// A repository webhook, `/repos/{owner}/{repo}/hooks/{id}`.
    Repo {
        /// The repository's owner.
        owner: String,
        /// The repository's name.
        repo: String,
        /// The hook id.
        id: u64,
    },
    /// An organisation webhook, `/orgs/{org}/hooks/{id}`.
    Org {
        /// The organisation's login.
        org: String,
        /// The hook id.
        id: u64,
    },
    /// The GitHub App's webhook, `/app/hook`.
    App,
}

impl HookRef {
    /// A repository hook.
    pub fn repo(owner: &str, repo: &str, id: u64) -> Self {
        Self::Repo {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
            id,
        }
    }

    /// An organisation hook.
    pub fn org(org: &str, id: u64) -> Self {
        Self::Org {
            org: org.to_owned(),
            id,
        }
    }

    /// The path of its deliveries list, e.g. `/repos/o/r/hooks/1/deliveries`.
    pub fn deliveries_path(&self) -> String {
        match self {
            Self::Repo { owner, repo, id } => {
                format!("/repos/{owner}/{repo}/hooks/{id}/deliveries")
            }
            Self::Org { org, id } => format!("/orgs/{org}/hooks/{id}/deliveries"),
            Self::App => "/app/hook/deliveries".to_owned(),
        }
    }

    /// The same hook? Owner, repository and organisation names are not case
    /// sensitive on GitHub ("The name is not case sensitive", in the path
    /// parameters of the endpoints above).
    pub(crate) fn same_as(&self, other: &HookRef) -> bool {
        match (self, other) {
            (
                Self::Repo { owner, repo, id },
                Self::Repo {
                    owner: o2,
                    repo: r2,
                    id: i2,
                },
            ) => id == i2 && owner.eq_ignore_ascii_case(o2) && repo.eq_ignore_ascii_case(r2),
            (Self::Org { org, id }, Self::Org { org: o2, id: i2 }) => {
                id == i2 && org.eq_ignore_ascii_case(o2)
            }
            (Self::App, Self::App) => true,
            _ => false,
        }
    }

    /// `X-GitHub-Hook-Installation-Target-Type`: what the hook is installed
    /// on (<https://docs.github.com/en/webhooks/webhook-events-and-payloads#delivery-headers>).
    pub(crate) fn target_type(&self) -> &'static str {
        match self {
            Self::Repo { .. } => "repository",
            Self::Org { .. } => "organization",
            Self::App => "integration",
        }
    }
}

/// A configured hook: where it posts and the secret it signs with.
#[derive(Debug, Clone)]
pub(crate) struct Hook {
    pub reference: HookRef,
    /// The id in `X-GitHub-Hook-ID` (the App hook has one too, outside paths).
    pub id: u64,
    /// `X-GitHub-Hook-Installation-Target-ID`.
    pub target_id: u64,
    pub url: String,
    pub secret: String,
}

/// One delivery attempt, as GitHub records it. Deliveries are
/// listed newest first and identified by `id`; `guid` is the event's
/// (`X-GitHub-Delivery`), kept by every redelivery of it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// The delivery id (new for every attempt, redeliveries included).
    pub id: u64,
    /// The event's guid, sent as `X-GitHub-Delivery`.
    pub guid: String,
    /// The hook it was sent to.
    pub hook: HookRef,
    /// When it was sent, on the fake's clock (unix seconds).
    pub delivered_at: i64,
    /// Whether it is a redelivery (`POST …/attempts`).
    pub redelivery: bool,
    /// Seconds the attempt took.
    pub duration: f64,
    /// `OK`, `Invalid HTTP Response: <code>`, `timed out`,
    /// `failed to connect to network` or `failed to connect to host`.
    pub status: String,
    /// The receiver's HTTP status; 0 when no HTTP response came back.
    pub status_code: u16,
    /// `X-GitHub-Event`.
    pub event: String,
    /// The payload's `action`, when it has one.
    pub action: Option<String>,
    /// The payload's `installation.id`, when it has one.
    pub installation_id: Option<i64>,
    /// The payload's `repository.id`, when it has one.
    pub repository_id: Option<i64>,
    /// The URL it was posted to.
    pub url: String,
    /// The request headers, in the order sent.
    pub request_headers: Vec<(String, String)>,
    /// The exact body bytes sent (what the signature covers).
    pub request_body: Vec<u8>,
    /// The payload, as JSON.
    pub payload: Value,
    /// The response headers (empty when no response).
    pub response_headers: Vec<(String, String)>,
    /// The response body as text (None when no response).
    pub response_body: Option<String>,
}

/// `2021-05-12T20:33:44Z`, as GitHub writes `delivered_at`.
pub(crate) fn timestamp(unix: i64) -> String {
    DateTime::<Utc>::from_timestamp(unix, 0)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl DeliveryRecord {
    /// The `hook-delivery-item` JSON of the list endpoint.
    pub fn item_json(&self) -> Value {
        json!({
            "id": self.id,
            "guid": self.guid,
            "delivered_at": timestamp(self.delivered_at),
            "redelivery": self.redelivery,
            "duration": self.duration,
            "status": self.status,
            "status_code": self.status_code,
            "event": self.event,
            "action": self.action,
            "installation_id": self.installation_id,
            "repository_id": self.repository_id,
            "throttled_at": Value::Null,
        })
    }

    /// The `hook-delivery` JSON of the single-delivery endpoint: the item
    /// plus `url`, `request: {headers, payload}` and
    /// `response: {headers, payload}` (the response payload is text).
    pub fn full_json(&self) -> Value {
        let mut value = self.item_json();
        let headers = |pairs: &[(String, String)]| {
            let mut map = Map::new();
            for (name, value) in pairs {
                map.insert(name.clone(), Value::String(value.clone()));
            }
            Value::Object(map)
        };
        if let Value::Object(map) = &mut value {
            map.insert("url".into(), Value::String(self.url.clone()));
            map.insert(
                "request".into(),
                json!({ "headers": headers(&self.request_headers), "payload": self.payload }),
            );
            let response_headers =
                if self.response_body.is_none() && self.response_headers.is_empty() {
                    Value::Null
                } else {
                    headers(&self.response_headers)
                };
            map.insert(
                "response".into(),
                json!({ "headers": response_headers, "payload": self.response_body }),
            );
        }
        value
    }

    /// Whether the documented `status` filter admits it: `success` is a
    /// `status_code` in 200–399, `failure` in 400–599 (the
    /// `webhook-delivery-status` parameter of the list endpoints). A delivery
    /// that got no HTTP response (status_code 0) is in neither.
    pub(crate) fn matches(&self, filter: StatusFilter) -> bool {
        match filter {
            StatusFilter::Any => true,
            StatusFilter::Success => (200..=399).contains(&self.status_code),
            StatusFilter::Failure => (400..=599).contains(&self.status_code),
        }
    }
}

/// The list endpoints' `status` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusFilter {
    Any,
    Success,
    Failure,
}

/// What [`super::FakeGitHub::send`] returns: the new delivery's id and guid
/// and how it went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentDelivery {
    /// The delivery id.
    pub id: u64,
    /// The event guid (`X-GitHub-Delivery`).
    pub guid: String,
    /// The receiver's status code (0: no HTTP response).
    pub status_code: u16,
    /// The recorded status text.
    pub status: String,
}

/// One request the fake's REST API answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The raw query string, when there was one.
    pub query: Option<String>,
    /// The status the fake answered with.
    pub status: u16,
}
