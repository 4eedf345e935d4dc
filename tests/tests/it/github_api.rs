//! The fake GitHub (`tickmark_tests::github_api`) against GitHub's
//! documented webhook-deliveries API: Link pagination, the 3-day retention,
//! 401/404/422, rate limits and server errors, a failed delivery and its
//! redelivery (same guid, `redelivery: true`, signed again, verified by
//! tickmark's own GitHub verifier), and GitHub's official client (octokit)
//! paging and redelivering through it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tickmark::receiver::providers::{Delivery, Provider, Verdict};
use tickmark_receiver::providers::github::GitHub;
use tickmark_tests::github_api::{FakeGitHub, HookRef};
use tickmark_tests::http_client::{HttpClient, Outgoing, Reply};

const SECRET: &str = "It's a Secret to Everybody";

/// A webhook receiver on loopback: records every request, answers `status`
/// after `delay`.
#[derive(Clone)]
struct Receiver {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    status: Arc<AtomicU16>,
    _task: Arc<AbortOnDrop>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Clone)]
struct ReceiverState {
    received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    status: Arc<AtomicU16>,
    delay: Duration,
}

async fn receive(
    State(state): State<ReceiverState>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    state.received.lock().unwrap().push((headers, body));
    tokio::time::sleep(state.delay).await;
    StatusCode::from_u16(state.status.load(Ordering::SeqCst)).unwrap()
}

impl Receiver {
    async fn start_on(addr: &str, delay: Duration) -> Receiver {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().unwrap();
        let state = ReceiverState {
            received: Arc::default(),
            status: Arc::new(AtomicU16::new(200)),
            delay,
        };
        let router = Router::new()
            .route("/hooks/github", axum::routing::post(receive))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.ok();
        });
        Receiver {
            addr,
            received: state.received,
            status: state.status,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    async fn start() -> Receiver {
        Self::start_on("127.0.0.1:0", Duration::ZERO).await
    }

    fn url(&self) -> String {
        format!("http://{}/hooks/github", self.addr)
    }

    fn received(&self) -> Vec<(HeaderMap, Bytes)> {
        self.received.lock().unwrap().clone()
    }
}

/// A loopback address nothing listens on (bound, then released).
async fn down_address() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

async fn get(github: &FakeGitHub, path: &str) -> Reply {
    let request = Outgoing::get(path)
        .header("authorization", format!("Bearer {}", github.token()))
        .header("accept", "application/vnd.github+json")
        .header("x-github-api-version", "2022-11-28");
    HttpClient::new()
        .send(github.addr(), &request)
        .await
        .expect("GET the fake")
}

async fn post(github: &FakeGitHub, path: &str) -> Reply {
    let request = Outgoing::post(path, Vec::new())
        .header("authorization", format!("token {}", github.token()))
        .header("accept", "application/vnd.github+json");
    HttpClient::new()
        .send(github.addr(), &request)
        .await
        .expect("POST the fake")
}

/// The URL of `rel` in a Link header.
fn link(reply: &Reply, rel: &str) -> Option<String> {
    let header = reply.header("link")?;
    header.split(", ").find_map(|part| {
        let (url, params) = part.split_once(">; ")?;
        (params == format!("rel=\"{rel}\"")).then(|| url.trim_start_matches('<').to_owned())
    })
}

fn ids(reply: &Reply) -> Vec<u64> {
    reply
        .json()
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn link_pagination_walks_seven_deliveries_three_at_a_time() {
    let github = FakeGitHub::start().await;
    let receiver = Receiver::start().await;
    let hook_id = github.add_repo_hook("octo", "shop", &receiver.url(), SECRET);
    let hook = HookRef::repo("octo", "shop", hook_id);
    for n in 0..7 {
        github
            .send(hook.clone(), "issues", json!({"action": "opened", "n": n}))
            .await;
    }
    let expected: Vec<u64> = github
        .deliveries(hook.clone())
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(expected.len(), 7);
    assert!(expected.windows(2).all(|w| w[0] > w[1]), "newest first");

    let path = format!("/repos/octo/shop/hooks/{hook_id}/deliveries");
    let mut url = format!("{}{path}?per_page=3", github.base_url());
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let reply = get(&github, url.strip_prefix(&github.base_url()).unwrap()).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        let page = ids(&reply);
        sizes.push(page.len());
        if !seen.is_empty() {
            let prev = link(&reply, "prev").expect("a later page links back");
            let back = get(&github, prev.strip_prefix(&github.base_url()).unwrap()).await;
            assert_eq!(
                ids(&back).last(),
                seen.last(),
                "prev is the page just before"
            );
        }
        seen.extend(page);
        match link(&reply, "next") {
            Some(next) => {
                assert!(
                    next.starts_with(&format!("{}{path}?", github.base_url())),
                    "{next}"
                );
                assert!(
                    next.contains("per_page=3") && next.contains("cursor="),
                    "{next}"
                );
                url = next;
            }
            None => break,
        }
    }
    assert_eq!(sizes, [3, 3, 1]);
    assert_eq!(seen, expected);

    // Defaults and limits: 30 a page without per_page (no Link: one page),
    // per_page above 100 is cut to 100.
    let all = get(&github, &path).await;
    assert_eq!(ids(&all), expected);
    assert!(all.header("link").is_none());
    assert_eq!(
        ids(&get(&github, &format!("{path}?per_page=1000")).await).len(),
        7
    );

    let item = &all.json()[0];
    for field in [
        "id",
        "guid",
        "delivered_at",
        "redelivery",
        "duration",
        "status",
        "status_code",
        "event",
        "action",
        "installation_id",
        "repository_id",
    ] {
        assert!(item.get(field).is_some(), "{field} missing from {item}");
    }
    assert_eq!(item["action"], "opened");
    assert_eq!(item["status"], "OK");
    assert_eq!(item["status_code"], 200);
}

#[tokio::test]
async fn deliveries_older_than_three_days_are_no_longer_listed() {
    let github = FakeGitHub::start().await;
    let receiver = Receiver::start().await;
    let hook_id = github.add_repo_hook("octo", "shop", &receiver.url(), SECRET);
    let hook = HookRef::repo("octo", "shop", hook_id);
    let old = github.send(hook.clone(), "push", json!({})).await;
    github.advance(Duration::from_secs(2 * 86_400));
    let new = github.send(hook.clone(), "push", json!({})).await;
    let path = format!("/repos/octo/shop/hooks/{hook_id}/deliveries");
    assert_eq!(ids(&get(&github, &path).await), [new.id, old.id]);

    github.advance(Duration::from_secs(86_400));
    assert_eq!(ids(&get(&github, &path).await), [new.id]);
    assert_eq!(
        get(&github, &format!("{path}/{}", old.id)).await.status,
        404
    );
    assert_eq!(
        post(&github, &format!("{path}/{}/attempts", old.id))
            .await
            .status,
        404
    );
    assert_eq!(
        get(&github, &format!("{path}/{}", new.id)).await.status,
        200
    );
    assert_eq!(
        github.deliveries(hook).len(),
        2,
        "the handle still shows both"
    );
}

#[tokio::test]
async fn bad_credentials_unknown_resources_and_bad_parameters() {
    let github = FakeGitHub::start().await;
    let hook_id = github.add_repo_hook("octo", "shop", "http://127.0.0.1:9/", SECRET);
    let path = format!("/repos/octo/shop/hooks/{hook_id}/deliveries");
    let client = HttpClient::new();

    let anonymous = client
        .send(github.addr(), &Outgoing::get(&path))
        .await
        .unwrap();
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.json()["message"], "Bad credentials");
    assert!(anonymous.json()["documentation_url"].is_string());
    let wrong = Outgoing::get(&path).header("authorization", "Bearer ghp_wrong");
    assert_eq!(
        client.send(github.addr(), &wrong).await.unwrap().status,
        401
    );
    let token = Outgoing::get(&path).header("authorization", format!("token {}", github.token()));
    assert_eq!(
        client.send(github.addr(), &token).await.unwrap().status,
        200
    );

    assert_eq!(get(&github, &path).await.json(), json!([]));
    assert_eq!(
        get(&github, "/repos/OCTO/Shop/hooks/1/deliveries")
            .await
            .status,
        200,
        "names are not case sensitive"
    );
    for missing in [
        format!("/repos/octo/shop/hooks/{}/deliveries", hook_id + 1),
        format!("/repos/octo/other/hooks/{hook_id}/deliveries"),
        "/repos/octo/shop/hooks/abc/deliveries".to_owned(),
        format!("{path}/42"),
        format!("/orgs/octo/hooks/{hook_id}/deliveries"),
        "/app/hook/deliveries".to_owned(),
        "/repos/octo/shop/hooks".to_owned(),
    ] {
        let reply = get(&github, &missing).await;
        assert_eq!(reply.status, 404, "{missing}");
        assert_eq!(reply.json()["message"], "Not Found", "{missing}");
    }
    assert_eq!(
        post(&github, &format!("{path}/42/attempts")).await.status,
        404
    );

    for bad in ["per_page=ten", "cursor=nonsense", "status=ok"] {
        assert_eq!(
            get(&github, &format!("{path}?{bad}")).await.status,
            422,
            "{bad}"
        );
    }
    let old_version = Outgoing::get(&path)
        .header("authorization", format!("Bearer {}", github.token()))
        .header("x-github-api-version", "2021-01-01");
    assert_eq!(
        client
            .send(github.addr(), &old_version)
            .await
            .unwrap()
            .status,
        400
    );

    let statuses: Vec<u16> = github.requests().iter().map(|r| r.status).collect();
    assert_eq!(&statuses[..3], [401, 401, 200]);
    assert!(github
        .requests()
        .iter()
        .any(|r| r.query.as_deref() == Some("status=ok")));
}

#[tokio::test]
async fn rate_limits_and_server_errors_answer_once_each() {
    let github = FakeGitHub::start().await;
    let hook_id = github.add_org_hook("octo", "http://127.0.0.1:9/", SECRET);
    let path = format!("/orgs/octo/hooks/{hook_id}/deliveries");

    github.rate_limit_next(1, Duration::from_secs(7));
    github.secondary_rate_limit_next(1, Duration::from_secs(60));
    github.primary_rate_limit_next(1, Duration::from_secs(3600));
    github.fail_next(2, 502);

    let limited = get(&github, &path).await;
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), Some("7"));
    assert!(limited.json()["message"]
        .as_str()
        .unwrap()
        .contains("secondary rate limit"));
    let secondary = get(&github, &path).await;
    assert_eq!(secondary.status, 403);
    assert_eq!(secondary.header("retry-after"), Some("60"));
    let primary = get(&github, &path).await;
    assert_eq!(primary.status, 403);
    assert_eq!(primary.header("x-ratelimit-remaining"), Some("0"));
    let reset: i64 = primary
        .header("x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(reset, github.now() + 3600);
    assert_eq!(get(&github, &path).await.status, 502);
    assert_eq!(get(&github, &path).await.status, 502);
    assert_eq!(get(&github, &path).await.status, 200);
    let statuses: Vec<u16> = github.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 403, 403, 502, 502, 200]);
}

/// Verify one received request with tickmark's GitHub verifier.
fn verify(headers: &HeaderMap, body: &[u8]) -> tickmark::receiver::providers::VerifiedEvent {
    let verifier = GitHub::new([SECRET]).unwrap();
    let delivery = Delivery {
        headers,
        body,
        public_url: "https://example.test/hooks/github",
        now: chrono::Utc::now(),
    };
    match verifier.verify(&delivery).expect("the signature verifies") {
        Verdict::Event(event) => event,
        other => panic!("not an event: {other:?}"),
    }
}

#[tokio::test]
async fn a_failed_delivery_is_listed_and_redelivered_with_its_guid_once_the_receiver_is_up() {
    let github = FakeGitHub::start().await;
    let down = down_address().await;
    let url = format!("http://{down}/hooks/github");
    let hook_id = github.add_repo_hook("octo", "shop", &url, SECRET);
    let hook = HookRef::repo("octo", "shop", hook_id);
    let payload =
        json!({"action": "opened", "installation": {"id": 77}, "repository": {"id": 1296269}});

    let failed = github.send(hook.clone(), "issues", payload.clone()).await;
    assert_eq!(failed.status_code, 0);
    assert_eq!(failed.status, "failed to connect to network");

    let path = format!("/repos/octo/shop/hooks/{hook_id}/deliveries");
    let listed = get(&github, &path).await.json();
    assert_eq!(listed[0]["id"], failed.id);
    assert_eq!(listed[0]["status"], "failed to connect to network");
    assert_eq!(listed[0]["status_code"], 0);
    assert_eq!(listed[0]["installation_id"], 77);
    assert_eq!(listed[0]["repository_id"], 1296269);
    assert_eq!(listed[0]["redelivery"], false);
    let full = get(&github, &format!("{path}/{}", failed.id)).await.json();
    assert_eq!(full["request"]["payload"], payload);
    assert_eq!(
        full["request"]["headers"]["X-GitHub-Delivery"],
        failed.guid.as_str()
    );
    assert_eq!(full["request"]["headers"]["X-GitHub-Event"], "issues");
    assert_eq!(
        full["request"]["headers"]["X-GitHub-Hook-ID"],
        hook_id.to_string()
    );
    assert_eq!(full["response"]["payload"], Value::Null);
    assert_eq!(full["url"], url.as_str());

    // The receiver comes up on the same address; the redelivery reaches it.
    let receiver = Receiver::start_on(&down.to_string(), Duration::ZERO).await;
    let accepted = post(&github, &format!("{path}/{}/attempts", failed.id)).await;
    assert_eq!(accepted.status, 202);
    assert_eq!(accepted.json(), json!({}));
    github.wait_idle().await;

    let received = receiver.received();
    assert_eq!(received.len(), 1);
    let (headers, body) = &received[0];
    let event = verify(headers, body);
    assert_eq!(event.id.as_deref(), Some(failed.guid.as_str()));
    assert_eq!(event.kind, "issues");
    assert_eq!(event.payload, payload);
    assert_eq!(
        headers["x-github-hook-installation-target-type"],
        "repository"
    );

    let deliveries = github.deliveries(hook.clone());
    assert_eq!(deliveries.len(), 2);
    let redelivered = &deliveries[0];
    assert!(redelivered.id > failed.id);
    assert_eq!(redelivered.guid, failed.guid);
    assert!(redelivered.redelivery);
    assert_eq!(
        (redelivered.status.as_str(), redelivered.status_code),
        ("OK", 200)
    );
    let listed = get(&github, &path).await.json();
    assert_eq!(listed[0]["redelivery"], true);
    assert_eq!(listed[0]["guid"], failed.guid.as_str());

    // An error status is an `Invalid HTTP Response`; the `status` filter
    // goes by status_code ranges, so the refused connection (0) is in neither.
    receiver.status.store(500, Ordering::SeqCst);
    let rejected = github
        .send(hook.clone(), "issues", json!({"action": "closed"}))
        .await;
    assert_eq!(
        (rejected.status.as_str(), rejected.status_code),
        ("Invalid HTTP Response: 500", 500)
    );
    assert_eq!(
        ids(&get(&github, &format!("{path}?status=failure")).await),
        [rejected.id]
    );
    assert_eq!(
        ids(&get(&github, &format!("{path}?status=success")).await),
        [redelivered.id]
    );
    let full = get(&github, &format!("{path}/{}", rejected.id))
        .await
        .json();
    assert!(full["response"]["headers"].is_object());
    assert_eq!(full["response"]["payload"], "");
}

#[tokio::test]
async fn a_slow_receiver_times_out_and_the_app_hook_has_its_own_paths() {
    let github = FakeGitHub::start().await;
    let slow = Receiver::start_on("127.0.0.1:0", Duration::from_secs(3)).await;
    github.set_app_hook(&slow.url(), SECRET);
    github.set_delivery_timeout(Duration::from_millis(200));
    let sent = github
        .send(HookRef::App, "installation", json!({"action": "created"}))
        .await;
    assert_eq!((sent.status.as_str(), sent.status_code), ("timed out", 0));
    let listed = get(&github, "/app/hook/deliveries").await.json();
    assert_eq!(listed[0]["id"], sent.id);
    assert_eq!(
        get(&github, &format!("/app/hook/deliveries/{}", sent.id))
            .await
            .status,
        200
    );
    assert_eq!(
        post(
            &github,
            &format!("/app/hook/deliveries/{}/attempts", sent.id)
        )
        .await
        .status,
        202
    );
    github.wait_idle().await;
    assert_eq!(slow.received().len(), 2);
    let (headers, _) = &slow.received()[1];
    assert_eq!(
        headers["x-github-hook-installation-target-type"],
        "integration"
    );
    assert_eq!(headers["x-github-delivery"], sent.guid.as_str());
}

/// node and the fixture's node_modules, or why not.
fn octokit() -> Result<(String, PathBuf), String> {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/octokit");
    let node = std::env::var("NODE").unwrap_or_else(|_| "node".to_owned());
    let version = std::process::Command::new(&node).arg("--version").output();
    if !version.is_ok_and(|o| o.status.success()) {
        return Err(format!(
            "`{node}` does not run: install Debian's nodejs and npm, then scripts/setup"
        ));
    }
    if !fixture
        .join("node_modules/@octokit/rest/package.json")
        .exists()
    {
        return Err(format!(
            "{} has no node_modules/@octokit/rest: run scripts/setup (npm ci there)",
            fixture.display()
        ));
    }
    Ok((node, fixture))
}

#[tokio::test]
async fn octokit_pages_and_redelivers_as_the_fake_records() {
    let (node, fixture) = match octokit() {
        Ok(found) => found,
        Err(reason) => {
            tickmark_tests::skip::record(&tickmark_tests::skip::current_test(), &reason);
            return;
        }
    };
    let github = FakeGitHub::start().await;
    let receiver = Receiver::start().await;
    let hook_id = github.add_repo_hook("octo", "shop", &receiver.url(), SECRET);
    let hook = HookRef::repo("octo", "shop", hook_id);
    for n in 0..5 {
        if n == 2 {
            receiver.status.store(503, Ordering::SeqCst);
        }
        github
            .send(hook.clone(), "issues", json!({"action": "opened", "n": n}))
            .await;
        receiver.status.store(200, Ordering::SeqCst);
    }
    let failed_guid = github.deliveries(hook.clone())[2].guid.clone();

    let output = tokio::process::Command::new(&node)
        .arg(fixture.join("list_deliveries.mjs"))
        .args([
            github.base_url(),
            github.token(),
            "octo".into(),
            "shop".into(),
            hook_id.to_string(),
        ])
        .current_dir(&fixture)
        .output()
        .await
        .expect("run node");
    assert!(
        output.status.success(),
        "octokit failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("the script prints JSON");
    github.wait_idle().await;

    let before: Vec<_> = github
        .deliveries(hook.clone())
        .into_iter()
        .skip(1)
        .collect();
    let listed: Vec<u64> = report["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, before.iter().map(|d| d.id).collect::<Vec<_>>());
    assert_eq!(report["pages"], 3, "5 deliveries, 2 a page");
    assert_eq!(
        report["deliveries"][2]["status"],
        "Invalid HTTP Response: 503"
    );
    assert_eq!(report["redelivered"]["status"], 202);
    assert_eq!(report["redelivered"]["guid"], failed_guid.as_str());

    let newest = &github.deliveries(hook)[0];
    assert!(newest.redelivery);
    assert_eq!(newest.guid, failed_guid);
    assert_eq!(newest.status, "OK");
    let (headers, body) = receiver.received().last().cloned().unwrap();
    assert_eq!(
        verify(&headers, &body).id.as_deref(),
        Some(failed_guid.as_str())
    );

    let pages: Vec<_> = github
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .map(|r| (r.query.unwrap_or_default(), r.status))
        .collect();
    assert_eq!(pages.len(), 3);
    assert!(pages
        .iter()
        .all(|(query, status)| query.contains("per_page=2") && *status == 200));
}
