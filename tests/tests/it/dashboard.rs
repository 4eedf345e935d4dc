//! The dashboard and `/metrics`, on both backends, with real events run by a
//! real worker: the pages show the step-status table and audit trail, the
//! filters filter, hostile values are escaped, every page and `/metrics`
//! need the token (bearer or a browser session from the login form, whose
//! forms carry a CSRF token), the retry button changes nothing without it,
//! and `/metrics` is valid OpenMetrics text, read by two parsers, whose
//! counters move with deliveries and steps.

use axum::Router;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use tickmark::dashboard::Dashboard;
use tickmark::receiver::providers::Stripe;
use tickmark::{
    Engine, EventState, Handler, Handlers, NewEvent, Receiver, Step, StepContext, StepError,
    StepResult,
};
use tickmark_tests::conformance::{engine, fair_share, order_paid, quick_worker};
use tickmark_tests::http_client::{oneshot, Outgoing, Reply};
use tickmark_tests::test_steps::{Flaky, Record};
use tickmark_tests::TestDb;

/// Form fields, as posted.
type Form<'a> = &'a [(&'a str, &'a str)];

const TOKEN: &str = "dashboard-test-token-0123456789";
const STRIPE_SECRET: &str = "whsec_dashboard_test_secret";

// Every case, once per backend: the modules `sqlite` and `postgres`.
tickmark_tests::per_backend!(fresh_db => [
    pages_show_the_overview_the_list_and_the_step_status_table,
    filters_narrow_the_event_list,
    hostile_ids_payloads_and_errors_are_escaped_everywhere,
    retry_needs_the_token_and_requeues_a_dead_event,
    the_token_guards_every_page_and_metrics,
    a_browser_session_reads_pages_and_its_forms_are_csrf_safe,
    metrics_are_valid_prometheus_text_and_move_with_work,
    an_event_page_says_which_limit_holds_the_event_back,
    a_waiting_step_shows_what_it_waits_for_on_the_page_and_in_metrics,
    tenants_show_on_the_overview_and_in_metrics_with_bounded_labels,
]);

// ---------------------------------------------------------------------------
// Set-up

/// `shop/order.paid` runs three recording steps; `shop/order.refunded` fails
/// terminally (a dead letter); anything else has no handler (ignored).
fn handlers() -> Handlers {
    Handlers::new()
        .on(
            "shop",
            "order.paid",
            Handler::new()
                .named_step("first", Record::default())
                .named_step("second", Record::default())
                .named_step("third", Record::default()),
        )
        .on(
            "shop",
            "order.refunded",
            Handler::new().named_step(
                "refund",
                Flaky {
                    fail_first: 99,
                    terminal: true,
                },
            ),
        )
}

async fn accept(engine: &Engine, source: &str, id: &str, kind: &str, payload: serde_json::Value) {
    engine
        .accept(NewEvent::with_id(source, id, kind, payload))
        .await
        .expect("accept");
}

async fn run_all(engine: &Engine) {
    engine
        .worker(quick_worker("dashboard-test"))
        .expect("valid worker settings")
        .run_until_idle()
        .await
        .expect("worker");
}

async fn seq_of(db: &TestDb, source: &str, id: &str) -> i64 {
    db.store
        .event_find(source, id)
        .await
        .expect("find")
        .expect("accepted")
        .event
        .seq
}

/// A read as an operator's script sends it: with the bearer token (every
/// page needs it).
async fn get(router: &Router, path: &str) -> Reply {
    get_with_bearer(router, path, TOKEN).await
}

/// A read with no credentials at all.
async fn get_anonymous(router: &Router, path: &str) -> Reply {
    oneshot(router, &Outgoing::get(path)).await
}

/// A read with a browser's session cookie (`tickmark_session=…`).
async fn get_with_cookie(router: &Router, path: &str, cookie: &str) -> Reply {
    oneshot(router, &Outgoing::get(path).header("cookie", cookie)).await
}

async fn get_with_bearer(router: &Router, path: &str, token: &str) -> Reply {
    oneshot(
        router,
        &Outgoing::get(path).header("authorization", format!("Bearer {token}")),
    )
    .await
}

/// POST a form, optionally with a bearer token.
async fn post_form(
    router: &Router,
    path: &str,
    fields: &[(&str, &str)],
    bearer: Option<&str>,
) -> Reply {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    let mut request =
        Outgoing::post(path, body).header("content-type", "application/x-www-form-urlencoded");
    if let Some(token) = bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    oneshot(router, &request).await
}

fn text(reply: &Reply) -> String {
    String::from_utf8(reply.body.to_vec()).expect("UTF-8 page")
}

/// A 200 HTML page's text, with the headers every page carries.
fn page(reply: &Reply) -> String {
    assert_eq!(reply.status, 200, "{}", text(reply));
    assert_eq!(
        reply.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = reply.header("content-security-policy").expect("CSP");
    assert!(csp.contains("default-src 'none'"), "{csp}");
    text(reply)
}

/// The HTML between `<table … id="{id}">` and its `</table>`.
fn table<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table #{id} in\n{html}"));
    let end = html[start..].find("</table>").expect("table end") + start;
    &html[start..end]
}

// ---------------------------------------------------------------------------
// Pages

/// The tenants of fair claiming, on the overview (most unfinished first)
/// and on `/metrics`: the ten with the most by name, the rest added up as
/// `tenant="other"`.
pub async fn tenants_show_on_the_overview_and_in_metrics_with_bounded_labels(db: TestDb) {
    let engine = engine(&db, fair_share::fair_handlers());
    // Twelve tenants: shop-0 has 13 events, shop-1 12, … shop-11 2.
    for shop in 0..12 {
        fair_share::accept(&engine, &format!("shop-{shop}"), 13 - shop).await;
    }
    let router = Dashboard::new(engine.clone()).token(TOKEN).router();

    let overview = page(&get(&router, "/").await);
    let tenants = table(&overview, "tenants");
    assert!(
        tenants.contains(">shop-0<") && tenants.contains(">13<"),
        "{tenants}"
    );
    assert!(!tenants.contains(">shop-11<"), "ten shown: {tenants}");

    let ops = tickmark::ops::router(
        engine.clone(),
        Some(Dashboard::new(engine.clone()).token(TOKEN)),
    );
    let metrics = text(&get(&ops, "/metrics").await);
    for line in [
        "tickmark_tenant_events{tenant=\"shop-0\",state=\"pending\"} 13",
        "tickmark_tenant_events{tenant=\"shop-9\",state=\"pending\"} 4",
        // shop-10 and shop-11: 3 + 2.
        "tickmark_tenant_events{tenant=\"other\",state=\"pending\"} 5",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    assert!(!metrics.contains("shop-10"), "{metrics}");
}

/// The overview counts by source and state, the list shows every event,
/// and an event's page has its step-status table (names, states, keys,
/// attempts, outputs), payload and audit trail.
pub async fn pages_show_the_overview_the_list_and_the_step_status_table(db: TestDb) {
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_page").await;
    accept(
        &engine,
        "shop",
        "evt_refund",
        "order.refunded",
        serde_json::json!({ "amount": 1200, "currency": "eur" }),
    )
    .await;
    run_all(&engine).await;
    let router = Dashboard::new(engine.clone()).token(TOKEN).router();

    let overview = page(&get(&router, "/").await);
    let counts = table(&overview, "counts");
    assert!(counts.contains(">shop<"), "{counts}");
    assert!(counts.contains("class=\"state s-done\">done<"), "{counts}");
    assert!(counts.contains("class=\"state s-dead\">dead<"), "{counts}");
    assert!(
        overview.contains("Latest dead letters") && overview.contains("evt_refund"),
        "{overview}"
    );

    let list = page(&get(&router, "/events").await);
    let rows = table(&list, "events");
    for id in ["evt_page", "evt_refund"] {
        assert!(rows.contains(id), "{id} in\n{rows}");
    }
    assert!(rows.contains("planned failure"), "the dead letter's error");

    let seq = seq_of(&db, "shop", "evt_page").await;
    let event = page(&get(&router, &format!("/events/{seq}")).await);
    let steps = table(&event, "steps");
    for (position, step) in ["first", "second", "third"].into_iter().enumerate() {
        let row = format!(
            "<td class=\"num\">{position}</td><td>{step}</td><td><span class=\"state s-done\">done</span></td><td class=\"num\">1</td>"
        );
        assert!(steps.contains(&row), "{row} in\n{steps}");
        assert!(
            steps.contains(&format!("shop:evt_page:{step}")),
            "key of {step}"
        );
    }
    // Outputs, JSON-escaped then HTML-escaped.
    assert!(
        steps.contains("&quot;key&quot;: &quot;shop:evt_page:third&quot;"),
        "{steps}"
    );
    assert!(event.contains("id=\"payload\""));
    assert!(
        event.contains("id=\"audit-empty\""),
        "no operator action yet"
    );
    assert!(event.contains("name=\"token\""), "the retry form");

    let dead_seq = seq_of(&db, "shop", "evt_refund").await;
    let dead = page(&get(&router, &format!("/events/{dead_seq}")).await);
    let steps = table(&dead, "steps");
    assert!(
        steps.contains("<tr class=\"fail\"><td class=\"num\">0</td><td>refund</td><td><span class=\"state s-dead\">dead</span>"),
        "{steps}"
    );
    assert!(steps.contains("shop:evt_refund:refund"));
    assert!(steps.contains("class=\"error\"") && steps.contains("planned failure 1 of 99"));
    assert!(
        dead.contains("&quot;currency&quot;: &quot;eur&quot;"),
        "payload"
    );

    // Once an operator acts, the audit trail has the row.
    let reply = post_form(
        &router,
        &format!("/events/{dead_seq}/retry"),
        &[("token", TOKEN), ("reason", "card updated")],
        None,
    )
    .await;
    assert_eq!(reply.status, 303, "{}", text(&reply));
    let after = page(&get(&router, &format!("/events/{dead_seq}")).await);
    let audit = table(&after, "audit");
    for expected in [">dashboard<", ">retry<", ">card updated<"] {
        assert!(audit.contains(expected), "{expected} in\n{audit}");
    }

    let wrong_method = get(&router, &format!("/events/{dead_seq}/retry")).await;
    assert_eq!(wrong_method.status, 405);
    for missing in ["/events/999999", "/events/not-a-number", "/nowhere"] {
        let reply = get(&router, missing).await;
        assert_eq!(reply.status, 404, "{missing}");
        assert!(text(&reply).contains("<!doctype html>"));
    }
}

/// State, source, kind, since and limit narrow the list; `id` finds by
/// dedup key or row number; a bad filter is a 400 that says why.
pub async fn filters_narrow_the_event_list(db: TestDb) {
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_a").await;
    order_paid(&engine, "evt_b").await;
    accept(
        &engine,
        "shop",
        "evt_dead",
        "order.refunded",
        serde_json::json!({}),
    )
    .await;
    run_all(&engine).await;
    accept(
        &engine,
        "billing",
        "inv_1",
        "invoice.paid",
        serde_json::json!({}),
    )
    .await;
    let router = Dashboard::new(engine.clone()).token(TOKEN).router();

    let all = ["evt_a", "evt_b", "evt_dead", "inv_1"];
    let cases: [(&str, &[&str]); 9] = [
        ("", &all),
        ("?state=dead", &["evt_dead"]),
        ("?state=ignored", &["inv_1"]),
        ("?source=billing", &["inv_1"]),
        ("?kind=order.paid", &["evt_a", "evt_b"]),
        (
            "?state=done&source=shop&kind=order.paid",
            &["evt_a", "evt_b"],
        ),
        ("?since=1h", &all),
        ("?limit=1", &["inv_1"]),
        ("?id=evt_b", &["evt_b"]),
    ];
    for (query, expected) in cases {
        let html = page(&get(&router, &format!("/events{query}")).await);
        let rows = table(&html, "events");
        for id in all {
            assert_eq!(
                rows.contains(&format!(">{id}<")),
                expected.contains(&id),
                "{id} for `{query}` in\n{rows}"
            );
        }
    }

    let seq = seq_of(&db, "shop", "evt_dead").await;
    let html = page(&get(&router, &format!("/events?id={seq}")).await);
    assert!(table(&html, "events").contains(">evt_dead<"));

    let none = page(&get(&router, "/events?kind=no.such.kind").await);
    assert!(none.contains("id=\"no-events\""));

    for bad in ["?state=exploded", "?since=soon", "?limit=0", "?limit=99999"] {
        let reply = get(&router, &format!("/events{bad}")).await;
        assert_eq!(reply.status, 400, "{bad}");
    }
    assert!(text(&get(&router, "/events?state=exploded").await).contains("unknown state"));

    // The filter form shows what was asked.
    let html = page(&get(&router, "/events?state=dead&kind=order.refunded").await);
    assert!(html.contains("<option value=\"dead\" selected>dead</option>"));
    assert!(html.contains("name=\"kind\" value=\"order.refunded\""));
}

/// A step whose output carries markup.
#[derive(Debug, Serialize, Deserialize)]
struct HostileOutput;

#[typetag::serde(name = "dashboard_test_hostile_output")]
#[async_trait::async_trait]
impl Step for HostileOutput {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Ok(serde_json::json!({ "html": "<script>alert('output')</script>" }))
    }
}

/// A step that fails terminally with markup in its error.
#[derive(Debug, Serialize, Deserialize)]
struct HostileError;

#[typetag::serde(name = "dashboard_test_hostile_error")]
#[async_trait::async_trait]
impl Step for HostileError {
    async fn run(&self, _ctx: &mut StepContext<'_>) -> StepResult {
        Err(StepError::terminal(
            "<script>alert('error')</script><img src=x onerror=alert(1)>",
        ))
    }
}

/// Event ids, kinds, payloads, step outputs and errors arrive in webhook
/// bodies: no page ever contains their markup unescaped.
pub async fn hostile_ids_payloads_and_errors_are_escaped_everywhere(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.hostile",
        Handler::new()
            .named_step("echo", HostileOutput)
            .named_step("explode", HostileError),
    );
    let engine = engine(&db, handlers);
    let hostile_id = "<script>alert(\"id\")</script>";
    accept(
        &engine,
        "shop",
        hostile_id,
        "order.hostile",
        serde_json::json!({
            "note": "<script>alert('payload')</script>",
            "attr": "\"><img src=x onerror=alert(2)>",
        }),
    )
    .await;
    accept(
        &engine,
        "shop",
        "evt_kind",
        "<script>alert('kind')</script>",
        serde_json::json!({}),
    )
    .await;
    run_all(&engine).await;
    let seq = seq_of(&db, "shop", hostile_id).await;
    let record = db.store.event_get(seq).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        EventState::Dead,
        "the hostile error dead-lettered it"
    );

    let router = Dashboard::new(engine.clone()).token(TOKEN).router();
    let lookup = format!(
        "/events?id={}",
        form_urlencoded::byte_serialize(hostile_id.as_bytes()).collect::<String>()
    );
    let paths = [
        "/".to_owned(),
        "/events".to_owned(),
        format!("/events/{seq}"),
        lookup,
        "/events?kind=%3Cscript%3Ealert(1)%3C%2Fscript%3E".to_owned(),
        "/events?state=%3Cscript%3E".to_owned(),
        // Out of a quoted attribute (the filter form echoes what was typed).
        "/events?kind=%22%3E%3Cimg+src%3Dx%3E&id=%22%3E%3Cscript%3E".to_owned(),
    ];
    for path in &paths {
        let reply = get(&router, path).await;
        let html = text(&reply);
        let lower = html.to_lowercase();
        assert!(
            !lower.contains("<script"),
            "unescaped <script> on {path}:\n{html}"
        );
        assert!(
            !lower.contains("<img"),
            "unescaped <img> on {path}:\n{html}"
        );
    }
    let event = page(&get(&router, &format!("/events/{seq}")).await);
    // maud escapes `&`, `<`, `>` and `"`; it always double-quotes
    // attributes, so `'` stays as it is.
    for escaped in [
        "&lt;script&gt;alert(&quot;id&quot;)&lt;/script&gt;",
        "&lt;script&gt;alert('payload')&lt;/script&gt;",
        "&lt;script&gt;alert('output')&lt;/script&gt;",
        "&lt;script&gt;alert('error')&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;",
        "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;",
    ] {
        assert!(event.contains(escaped), "{escaped} in\n{event}");
    }
    let list = page(&get(&router, "/events").await);
    assert!(list.contains("&lt;script&gt;alert('kind')&lt;/script&gt;"));
    // A refusal message shown after a retry escapes too.
    let reply = post_form(
        &router,
        &format!("/events/{seq}/retry"),
        &[("token", TOKEN), ("from_step", "<script>x</script>")],
        None,
    )
    .await;
    assert_eq!(reply.status, 400, "{}", text(&reply));
    assert!(!text(&reply).to_lowercase().contains("<script"));
    assert!(text(&reply).contains("&lt;script&gt;x&lt;/script&gt;"));
}

// ---------------------------------------------------------------------------
// The retry button

/// The state, fencing token and audit rows of an event, read with plain SQL.
async fn snapshot(db: &TestDb, seq: i64) -> (String, i64, i64) {
    let state = db
        .probe
        .text(&format!(
            "SELECT state FROM tickmark_events WHERE id = {seq}"
        ))
        .await
        .expect("event row");
    let token = db
        .probe
        .scalar(&format!(
            "SELECT CAST(lease_token AS BIGINT) FROM tickmark_events WHERE id = {seq}"
        ))
        .await;
    let audit = db
        .probe
        .scalar(&format!(
            "SELECT COUNT(*) FROM tickmark_audit WHERE event_seq = {seq}"
        ))
        .await;
    (state, token, audit)
}

/// Without the token (missing, wrong, wrong scheme, none configured) the
/// answer is 401 and the database is untouched; with it, as a form field or
/// a bearer header, a dead event is re-queued and the page redirects; a
/// refusal shows the store's reason.
pub async fn retry_needs_the_token_and_requeues_a_dead_event(db: TestDb) {
    let engine = engine(&db, handlers());
    accept(
        &engine,
        "shop",
        "evt_retry",
        "order.refunded",
        serde_json::json!({}),
    )
    .await;
    run_all(&engine).await;
    let seq = seq_of(&db, "shop", "evt_retry").await;
    let path = format!("/events/{seq}/retry");
    let before = snapshot(&db, seq).await;
    assert_eq!((before.0.as_str(), before.2), ("dead", 0));

    let router = Dashboard::new(engine.clone()).token(TOKEN).router();
    let refused: [(Form, Option<&str>); 5] = [
        (&[], None),
        (&[("token", "")], None),
        (&[("token", "wrong-token")], None),
        (&[("token", &TOKEN[..TOKEN.len() - 1])], None),
        (&[("reason", "no token")], Some("wrong-token")),
    ];
    for (fields, bearer) in refused {
        let reply = post_form(&router, &path, fields, bearer).await;
        assert_eq!(reply.status, 401, "{fields:?} {bearer:?}");
        assert_eq!(
            reply.header("www-authenticate"),
            Some("Bearer realm=\"tickmark\"")
        );
        assert!(text(&reply).contains("Nothing was changed"));
    }
    let basic = oneshot(
        &router,
        &Outgoing::post(&path, "").header("authorization", format!("Basic {TOKEN}")),
    )
    .await;
    assert_eq!(basic.status, 401);
    let read_only = Dashboard::new(engine.clone()).router();
    let reply = post_form(&read_only, &path, &[("token", TOKEN)], Some(TOKEN)).await;
    assert_eq!(reply.status, 401, "no token configured: nothing can act");
    assert!(text(&reply).contains("no token configured"));
    assert_eq!(snapshot(&db, seq).await, before, "nothing changed");

    // The right token, as the form sends it.
    let reply = post_form(
        &router,
        &path,
        &[
            ("token", TOKEN),
            ("reason", "card updated"),
            ("from_step", ""),
        ],
        None,
    )
    .await;
    assert_eq!(reply.status, 303, "{}", text(&reply));
    assert_eq!(
        reply.header("location"),
        Some(format!("/events/{seq}").as_str())
    );
    let after = snapshot(&db, seq).await;
    assert_eq!(after.0, "pending", "re-queued");
    assert!(after.1 > before.1, "the fencing token moved");
    assert_eq!(after.2, 1, "one audit row");
    let audit = db.store.audit_list(seq).await.unwrap();
    assert_eq!(
        (
            audit[0].actor.as_str(),
            audit[0].action.as_str(),
            audit[0].reason.as_deref()
        ),
        ("dashboard", "retry", Some("card updated"))
    );

    // Already queued: refused, with the reason on the event page.
    let reply = post_form(&router, &path, &[], Some(TOKEN)).await;
    assert_eq!(reply.status, 409);
    let html = text(&reply);
    assert!(
        html.contains("id=\"notice\"") && html.contains("Not retried"),
        "{html}"
    );
    assert!(html.contains("already queued"), "{html}");
    assert!(html.contains("id=\"steps\""), "the event page itself");
    assert_eq!(snapshot(&db, seq).await, after);

    // Dead again; an unknown step is refused; a bearer header is enough.
    run_all(&engine).await;
    let dead_again = snapshot(&db, seq).await;
    assert_eq!(dead_again.0, "dead");
    let reply = post_form(&router, &path, &[("from_step", "nope")], Some(TOKEN)).await;
    assert_eq!(reply.status, 400);
    assert!(text(&reply).contains("has no step"));
    assert_eq!(snapshot(&db, seq).await, dead_again);
    let reply = post_form(&router, &path, &[("from_step", "refund")], Some(TOKEN)).await;
    assert_eq!(reply.status, 303, "{}", text(&reply));
    assert_eq!(snapshot(&db, seq).await.0, "pending");

    // Nested under a prefix, the redirect and the links follow it.
    run_all(&engine).await;
    let nested = Router::new().nest("/ops", Dashboard::new(engine.clone()).token(TOKEN).router());
    let reply = post_form(&nested, &format!("/ops{path}"), &[("token", TOKEN)], None).await;
    assert_eq!(reply.status, 303, "{}", text(&reply));
    assert_eq!(
        reply.header("location"),
        Some(format!("/ops/events/{seq}").as_str())
    );
    let html = page(&get(&nested, &format!("/ops/events/{seq}")).await);
    assert!(html.contains(&format!("action=\"/ops/events/{seq}/retry\"")));
    assert!(html.contains("href=\"/ops/events\""));
    let overview = page(&get(&nested, "/ops").await);
    assert!(overview.contains("href=\"/ops/events?state=dead\""));
    // Unknown event: 404 after the token check.
    let reply = post_form(&router, "/events/999999/retry", &[("token", TOKEN)], None).await;
    assert_eq!(reply.status, 404);
}

/// With a token, every page and `/metrics` need it: without it (or with a
/// wrong one) the answer is 401 with the login form, and none of the data;
/// with the bearer token, 200. `metrics_public` opens `/metrics` alone.
/// Without a token configured the dashboard shows nothing at all.
pub async fn the_token_guards_every_page_and_metrics(db: TestDb) {
    let engine = engine(&db, handlers());
    order_paid(&engine, "evt_private").await;
    let seq = seq_of(&db, "shop", "evt_private").await;
    let private = tickmark::ops::router(
        engine.clone(),
        Some(Dashboard::new(engine.clone()).token(TOKEN)),
    );
    let pages = [
        "/".to_owned(),
        "/events".to_owned(),
        "/events?state=pending".to_owned(),
        "/events?id=evt_private".to_owned(),
        format!("/events/{seq}"),
        "/nowhere".to_owned(),
    ];
    // What a leak would show: the event's kind, its step keys, the gauges.
    let leaks = ["order.paid", "shop:evt_private", "tickmark_events"];
    for path in pages.iter().map(String::as_str).chain(["/metrics"]) {
        for reply in [
            get_anonymous(&private, path).await,
            get_with_bearer(&private, path, "wrong-token").await,
            get_with_cookie(&private, path, "tickmark_session=99999999999.00ff").await,
        ] {
            assert_eq!(reply.status, 401, "{path}");
            assert_eq!(
                reply.header("www-authenticate"),
                Some("Bearer realm=\"tickmark\""),
                "{path}"
            );
            let body = text(&reply);
            for leak in leaks {
                assert!(!body.contains(leak), "{path} leaks {leak}:\n{body}");
            }
        }
        let reply = get_with_bearer(&private, path, TOKEN).await;
        let expected = if path == "/nowhere" { 404 } else { 200 };
        assert_eq!(reply.status, expected, "{path}: {}", text(&reply));
    }
    // A page's 401 is the login form, which comes back to the page asked for.
    let login = text(&get_anonymous(&private, &format!("/events/{seq}")).await);
    assert!(
        login.contains("type=\"password\" name=\"token\""),
        "{login}"
    );
    assert!(
        login.contains(&format!("name=\"next\" value=\"/events/{seq}\"")),
        "{login}"
    );
    assert_eq!(get_anonymous(&private, "/login").await.status, 200);

    // `metrics_public` opens /metrics, and nothing else.
    let scraped = tickmark::ops::router(
        engine.clone(),
        Some(
            Dashboard::new(engine.clone())
                .token(TOKEN)
                .metrics_public(true),
        ),
    );
    let metrics = get_anonymous(&scraped, "/metrics").await;
    assert_eq!(metrics.status, 200);
    assert!(text(&metrics).contains("tickmark_events"));
    for path in &pages {
        assert_eq!(get_anonymous(&scraped, path).await.status, 401, "{path}");
    }

    // No token configured: the pages show nothing, even to a bearer.
    let unconfigured = tickmark::ops::router(engine.clone(), Some(Dashboard::new(engine.clone())));
    for path in &pages {
        let reply = get_with_bearer(&unconfigured, path, TOKEN).await;
        assert_eq!(reply.status, 401, "{path}");
        let body = text(&reply);
        assert!(body.contains("no token configured"), "{body}");
        for leak in leaks {
            assert!(!body.contains(leak), "{path} leaks {leak}:\n{body}");
        }
    }
}

/// The value of the session cookie a `Set-Cookie` header sets, as a
/// `Cookie` header would send it back.
fn session_cookie(reply: &Reply) -> String {
    let set = reply.header("set-cookie").expect("a Set-Cookie header");
    set.split(';').next().expect("name=value").trim().to_owned()
}

/// The value of the hidden `csrf` field of a page's form.
fn csrf_of(html: &str) -> String {
    let start = html
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no csrf field in\n{html}"))
        + "name=\"csrf\" value=\"".len();
    let end = html[start..].find('"').expect("closing quote") + start;
    html[start..end].to_owned()
}

/// A browser signs in through the form: a wrong token sets nothing; the
/// right one sets an `HttpOnly`, `Secure`, `SameSite=Strict` session cookie
/// scoped to the dashboard and redirects to the page asked for (never to
/// another site). The cookie reads every page and `/metrics`. Its retry
/// form carries a CSRF token instead of the token: a post with the cookie
/// but without the CSRF token (what a forged cross-site form would send) is
/// 403 and changes nothing; with it, the event is re-queued. A forged
/// cookie, or one signed by another dashboard, reads nothing; signing out
/// needs the CSRF token too and clears the cookie.
pub async fn a_browser_session_reads_pages_and_its_forms_are_csrf_safe(db: TestDb) {
    let engine = engine(&db, handlers());
    accept(
        &engine,
        "shop",
        "evt_session",
        "order.refunded",
        serde_json::json!({}),
    )
    .await;
    run_all(&engine).await;
    let seq = seq_of(&db, "shop", "evt_session").await;
    let page_path = format!("/events/{seq}");
    let retry_path = format!("/events/{seq}/retry");
    let router = tickmark::ops::router(
        engine.clone(),
        Some(Dashboard::new(engine.clone()).token(TOKEN)),
    );

    let wrong = post_form(
        &router,
        "/login",
        &[("token", "wrong-token"), ("next", &page_path)],
        None,
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert!(text(&wrong).contains("not the dashboard's token"));

    let signed_in = post_form(
        &router,
        "/login",
        &[("token", TOKEN), ("next", &page_path)],
        None,
    )
    .await;
    assert_eq!(signed_in.status, 303, "{}", text(&signed_in));
    assert_eq!(signed_in.header("location"), Some(page_path.as_str()));
    let set = signed_in.header("set-cookie").expect("the session cookie");
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attribute), "{attribute} in {set}");
    }
    let cookie = session_cookie(&signed_in);
    assert!(!cookie.contains(TOKEN), "the cookie is not the token");

    // Somewhere else than this dashboard: never.
    for outside in [
        "https://evil.example/",
        "//evil.example/x",
        "/\\evil.example",
    ] {
        let reply = post_form(
            &router,
            "/login",
            &[("token", TOKEN), ("next", outside)],
            None,
        )
        .await;
        assert_eq!(reply.header("location"), Some("/"), "{outside}");
    }

    for path in ["/", "/events", page_path.as_str(), "/metrics"] {
        let reply = get_with_cookie(&router, path, &cookie).await;
        assert_eq!(reply.status, 200, "{path}: {}", text(&reply));
    }
    let html = page(&get_with_cookie(&router, &page_path, &cookie).await);
    assert!(
        !html.contains("name=\"token\""),
        "a signed-in form needs no token"
    );
    assert!(html.contains("action=\"/logout\""), "the sign-out button");
    let csrf = csrf_of(&html);

    // Forged, foreign and expired-looking cookies read nothing.
    let foreign = session_cookie(
        &post_form(
            &Dashboard::new(engine.clone()).token(TOKEN).router(),
            "/login",
            &[("token", TOKEN)],
            None,
        )
        .await,
    );
    let (name_and_expiry, tag) = cookie.rsplit_once('.').expect("expiry.tag");
    let tampered = format!("{}.{}", name_and_expiry.replace('=', "=1"), tag);
    for forged in [foreign.as_str(), tampered.as_str(), "tickmark_session="] {
        assert_eq!(
            get_with_cookie(&router, &page_path, forged).await.status,
            401,
            "{forged}"
        );
    }

    // The retry form: the cookie alone is not enough.
    let before = snapshot(&db, seq).await;
    assert_eq!(before.0, "dead");
    for fields in [
        &[("reason", "forged")][..],
        &[("reason", "forged"), ("csrf", "00")][..],
        &[("reason", "forged"), ("csrf", &csrf[..csrf.len() - 1])][..],
    ] {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let reply = oneshot(
            &router,
            &Outgoing::post(&retry_path, body)
                .header("content-type", "application/x-www-form-urlencoded")
                .header("cookie", &cookie),
        )
        .await;
        assert_eq!(reply.status, 403, "{fields:?}: {}", text(&reply));
        assert!(text(&reply).contains("Nothing was changed"));
    }
    let foreign_csrf = {
        let other = Dashboard::new(engine.clone()).token(TOKEN).router();
        let cookie = session_cookie(&post_form(&other, "/login", &[("token", TOKEN)], None).await);
        csrf_of(&text(&get_with_cookie(&other, &page_path, &cookie).await))
    };
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("csrf", foreign_csrf.as_str())])
        .finish();
    let reply = oneshot(
        &router,
        &Outgoing::post(&retry_path, body)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", &cookie),
    )
    .await;
    assert_eq!(reply.status, 403, "another session's CSRF token");
    assert_eq!(snapshot(&db, seq).await, before, "nothing changed");

    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("csrf", csrf.as_str()), ("reason", "signed in")])
        .finish();
    let reply = oneshot(
        &router,
        &Outgoing::post(&retry_path, body)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", &cookie),
    )
    .await;
    assert_eq!(reply.status, 303, "{}", text(&reply));
    assert_eq!(snapshot(&db, seq).await.0, "pending");
    let audit = db.store.audit_list(seq).await.unwrap();
    assert_eq!(audit[0].reason.as_deref(), Some("signed in"));

    // Signing out needs the CSRF token, and clears the cookie.
    let reply = post_form(&router, "/logout", &[], None).await;
    assert_eq!(reply.status, 401);
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("csrf", csrf.as_str())])
        .finish();
    let reply = oneshot(
        &router,
        &Outgoing::post("/logout", body)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", &cookie),
    )
    .await;
    assert_eq!(reply.status, 303);
    assert_eq!(reply.header("location"), Some("/login"));
    let cleared = reply.header("set-cookie").expect("the cookie cleared");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");

    // Nested under a prefix, the cookie and the redirects follow it.
    let nested = Router::new().nest("/ops", Dashboard::new(engine.clone()).token(TOKEN).router());
    let reply = post_form(
        &nested,
        "/ops/login",
        &[("token", TOKEN), ("next", "/ops/events")],
        None,
    )
    .await;
    assert_eq!(reply.status, 303);
    assert_eq!(reply.header("location"), Some("/ops/events"));
    assert!(reply.header("set-cookie").unwrap().contains("Path=/ops;"));
    let cookie = session_cookie(&reply);
    assert_eq!(
        get_with_cookie(&nested, "/ops/events", &cookie)
            .await
            .status,
        200
    );
}

// ---------------------------------------------------------------------------
// /metrics

fn stripe_signature(body: &str, secret: &str) -> String {
    let t = chrono::Utc::now().timestamp();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

async fn deliver(router: &Router, body: &str, secret: &str) -> Reply {
    oneshot(
        router,
        &Outgoing::post("/hooks/stripe", body.as_bytes().to_vec())
            .header("stripe-signature", stripe_signature(body, secret))
            .header("content-type", "application/json"),
    )
    .await
}

/// `/metrics` parses as strict OpenMetrics text (HELP and TYPE for every
/// family, valid names, labels and values, consistent histograms, `# EOF`)
/// and is read by `prometheus-parse` too; its counters and gauges follow
/// what the receiver and the worker did.
pub async fn metrics_are_valid_prometheus_text_and_move_with_work(db: TestDb) {
    let handlers = Handlers::new()
        .on(
            "stripe",
            "invoice.paid",
            Handler::new()
                .named_step("credit", Record::default())
                .named_step("email", Record::default()),
        )
        .on(
            "stripe",
            "charge.refunded",
            Handler::new().named_step(
                "refund",
                Flaky {
                    fail_first: 99,
                    terminal: true,
                },
            ),
        );
    let engine = engine(&db, handlers);
    let receiver = Receiver::new(engine.clone())
        .source("stripe", Stripe::new([STRIPE_SECRET]).unwrap())
        .expect("a valid source")
        .router();
    let ops = tickmark::ops::router(engine.clone(), None);

    let reply = get(&ops, "/metrics").await;
    assert_eq!(reply.status, 200);
    // OpenMetrics, what `prometheus-client` writes (and Prometheus asks for first).
    assert_eq!(
        reply.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let before = exposition::parse(&text(&reply)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        before.value("tickmark_lease_takeovers_total", &[]),
        Some(0.0)
    );
    assert_eq!(
        before.value(
            "tickmark_events_received_total",
            &[("source", "stripe"), ("outcome", "new")]
        ),
        None,
        "no delivery yet"
    );
    assert_eq!(
        before.value("tickmark_oldest_pending_age_seconds", &[]),
        Some(0.0)
    );

    let paid = r#"{"id":"evt_m1","type":"invoice.paid","data":{}}"#;
    let refunded = r#"{"id":"evt_m2","type":"charge.refunded","data":{}}"#;
    let unknown = r#"{"id":"evt_m3","type":"customer.created","data":{}}"#;
    assert_eq!(deliver(&receiver, paid, STRIPE_SECRET).await.status, 200);
    assert_eq!(deliver(&receiver, paid, STRIPE_SECRET).await.status, 200);
    assert_eq!(
        deliver(&receiver, refunded, STRIPE_SECRET).await.status,
        200
    );
    assert_eq!(deliver(&receiver, unknown, STRIPE_SECRET).await.status, 200);
    let forged = deliver(
        &receiver,
        r#"{"id":"evt_m4","type":"invoice.paid"}"#,
        "whsec_forged",
    )
    .await;
    assert_eq!(forged.status, 401);

    // Queued, not yet run.
    let queued =
        exposition::parse(&text(&get(&ops, "/metrics").await)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        queued.value("tickmark_events", &[("state", "pending")]),
        Some(2.0)
    );
    assert!(
        queued
            .value("tickmark_oldest_pending_age_seconds", &[])
            .unwrap()
            >= 0.0
    );

    run_all(&engine).await;
    let after =
        exposition::parse(&text(&get(&ops, "/metrics").await)).unwrap_or_else(|e| panic!("{e}"));
    let received = |outcome| {
        after.value(
            "tickmark_events_received_total",
            &[("source", "stripe"), ("outcome", outcome)],
        )
    };
    assert_eq!(received("new"), Some(2.0));
    assert_eq!(received("duplicate"), Some(1.0));
    assert_eq!(received("ignored"), Some(1.0));
    assert_eq!(
        after.value(
            "tickmark_deliveries_rejected_total",
            &[("source", "stripe"), ("reason", "bad_signature")]
        ),
        Some(1.0)
    );
    for step in ["credit", "email"] {
        assert_eq!(
            after.value("tickmark_steps_done_total", &[("step", step)]),
            Some(1.0)
        );
        assert_eq!(
            after.value("tickmark_step_duration_seconds_count", &[("step", step)]),
            Some(1.0)
        );
        assert_eq!(
            after.value(
                "tickmark_step_duration_seconds_bucket",
                &[("step", step), ("le", "+Inf")]
            ),
            Some(1.0)
        );
    }
    assert_eq!(
        after.value(
            "tickmark_steps_failed_total",
            &[("step", "refund"), ("then", "dead")]
        ),
        Some(1.0)
    );
    assert_eq!(
        after.value("tickmark_events", &[("state", "done")]),
        Some(1.0)
    );
    assert_eq!(
        after.value("tickmark_events", &[("state", "dead")]),
        Some(1.0)
    );
    assert_eq!(
        after.value("tickmark_events", &[("state", "ignored")]),
        Some(1.0)
    );
    assert_eq!(
        after.value("tickmark_events", &[("state", "pending")]),
        None
    );
    assert_eq!(
        after.value("tickmark_oldest_pending_age_seconds", &[]),
        Some(0.0)
    );
    assert_eq!(
        after.kind("tickmark_step_duration_seconds"),
        Some("histogram")
    );
    assert_eq!(after.kind("tickmark_events"), Some("gauge"));
    // OpenMetrics names a counter's family without `_total`; its samples
    // (what queries use) keep it, as asserted above.
    assert_eq!(after.kind("tickmark_steps_done"), Some("counter"));

    // A second, independent reader: the `prometheus-parse` crate.
    let body = text(&get(&ops, "/metrics").await);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|line| Ok(line.to_owned())))
        .expect("prometheus-parse reads /metrics");
    let sample = |name: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == name
                    && s.labels.len() == labels.len()
                    && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
            })
            .map(|s| s.value.clone())
    };
    let number = |value: Option<prometheus_parse::Value>| match value {
        Some(prometheus_parse::Value::Counter(n))
        | Some(prometheus_parse::Value::Gauge(n))
        | Some(prometheus_parse::Value::Untyped(n)) => Some(n),
        _ => None,
    };
    assert_eq!(
        number(sample(
            "tickmark_events_received_total",
            &[("source", "stripe"), ("outcome", "new")]
        )),
        Some(2.0)
    );
    assert_eq!(
        sample("tickmark_events", &[("state", "dead")]),
        Some(prometheus_parse::Value::Gauge(1.0))
    );
    match sample("tickmark_step_duration_seconds", &[("step", "credit")]) {
        Some(prometheus_parse::Value::Histogram(buckets)) => {
            assert_eq!(
                buckets.len(),
                tickmark_core::metrics::DURATION_BUCKETS.len() + 1
            );
            let last = buckets.last().expect("buckets");
            assert!(
                last.less_than.is_infinite() && last.count == 1.0,
                "{buckets:?}"
            );
        }
        other => panic!("the step histogram: {other:?}"),
    }
}

/// A strict reader of the OpenMetrics text format 1.0.0, for the metrics
/// test: every sample belongs to the family declared just before it with
/// both `# HELP` and `# TYPE` (a counter family `x` has the samples
/// `x_total` and `x_created`); names, label names and escapes, and values
/// are checked; a series appears once; histograms are cumulative and end at
/// `+Inf` = `_count`; the text ends with `# EOF`.
mod exposition {
    use std::collections::{BTreeMap, BTreeSet};

    /// One family: `# HELP`, `# TYPE`, and its samples.
    #[derive(Debug, Default)]
    pub struct Family {
        pub name: String,
        pub help: Option<String>,
        pub kind: Option<String>,
        pub samples: Vec<Sample>,
    }

    /// One sample line.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Sample {
        pub name: String,
        pub labels: BTreeMap<String, String>,
        pub value: f64,
    }

    /// A parsed exposition.
    #[derive(Debug, Default)]
    pub struct Exposition {
        pub families: Vec<Family>,
    }

    impl Exposition {
        /// The value of the sample `name` with exactly `labels`.
        pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
            let wanted: BTreeMap<String, String> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            self.families
                .iter()
                .flat_map(|family| &family.samples)
                .find(|sample| sample.name == name && sample.labels == wanted)
                .map(|sample| sample.value)
        }

        /// A family's TYPE.
        pub fn kind(&self, family: &str) -> Option<&str> {
            self.families
                .iter()
                .find(|f| f.name == family)
                .and_then(|f| f.kind.as_deref())
        }
    }

    fn is_metric_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    fn is_label_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with("__")
    }

    fn parse_value(text: &str) -> Result<f64, String> {
        match text {
            "+Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            "NaN" => Ok(f64::NAN),
            _ if text
                .chars()
                .all(|c| c.is_ascii_digit() || "+-.eE".contains(c)) =>
            {
                text.parse::<f64>()
                    .map_err(|e| format!("bad value `{text}`: {e}"))
            }
            _ => Err(format!("bad value `{text}`")),
        }
    }

    /// `{a="x",b="y\"z"}` → the labels; the rest of the line after `}`.
    fn parse_labels(text: &str) -> Result<(BTreeMap<String, String>, &str), String> {
        let mut labels = BTreeMap::new();
        let mut rest = text.strip_prefix('{').ok_or("labels must start with {")?;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                return Ok((labels, after));
            }
            let eq = rest
                .find('=')
                .ok_or_else(|| format!("no `=` in labels: {text}"))?;
            let name = &rest[..eq];
            if !is_label_name(name) {
                return Err(format!("bad label name `{name}`"));
            }
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or_else(|| format!("label {name}'s value is not quoted"))?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err(format!("unterminated label value in {text}")),
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => return Err(format!("bad escape {other:?} in {text}")),
                    },
                    Some((_, '\n')) => return Err("raw newline in a label value".into()),
                    Some((_, c)) => value.push(c),
                }
            };
            if labels.insert(name.to_owned(), value).is_some() {
                return Err(format!("label `{name}` repeated in {text}"));
            }
            rest = &rest[end + 1..];
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            } else if !rest.starts_with('}') {
                return Err(format!("expected `,` or `}}` in {text}"));
            }
        }
    }

    fn parse_sample(line: &str) -> Result<Sample, String> {
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| format!("no value: {line}"))?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return Err(format!("bad metric name `{name}`"));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..])?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| format!("expected one space before the value: {line}"))?;
        let mut parts = rest.split(' ');
        let value = parse_value(parts.next().unwrap_or(""))?;
        if let Some(timestamp) = parts.next() {
            timestamp
                .parse::<i64>()
                .map_err(|_| format!("bad timestamp in {line}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("trailing text: {line}"));
        }
        Ok(Sample {
            name: name.to_owned(),
            labels,
            value,
        })
    }

    /// Which family a sample name belongs to, given the family's TYPE.
    fn belongs(sample: &str, family: &str, kind: &str) -> bool {
        match kind {
            "counter" => [format!("{family}_total"), format!("{family}_created")]
                .contains(&sample.to_owned()),
            "histogram" => [
                format!("{family}_bucket"),
                format!("{family}_sum"),
                format!("{family}_count"),
                format!("{family}_created"),
            ]
            .contains(&sample.to_owned()),
            "summary" => {
                sample == family
                    || sample == format!("{family}_sum")
                    || sample == format!("{family}_count")
            }
            _ => sample == family,
        }
    }

    /// Parse `text`, or say what is wrong and on which line.
    pub fn parse(text: &str) -> Result<Exposition, String> {
        if !text.ends_with('\n') {
            return Err("the exposition must end with a newline".into());
        }
        let text = text
            .strip_suffix("# EOF\n")
            .ok_or("the exposition must end with `# EOF`")?;
        let mut out = Exposition::default();
        let mut seen_families = BTreeSet::new();
        let mut seen_series = BTreeSet::new();
        for (number, line) in text.lines().enumerate() {
            let at = |e: String| format!("line {}: {e}\n{line}", number + 1);
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                let mut words = comment.trim_start().splitn(3, ' ');
                let keyword = words.next().unwrap_or("");
                if keyword == "EOF" {
                    return Err(at("text after `# EOF`".into()));
                }
                if keyword != "HELP" && keyword != "TYPE" {
                    continue; // a plain comment
                }
                let name = words.next().unwrap_or("");
                let rest = words
                    .next()
                    .ok_or_else(|| at(format!("{keyword} without text")))?;
                if !is_metric_name(name) {
                    return Err(at(format!("bad metric name `{name}`")));
                }
                let current = match out.families.last_mut() {
                    Some(family) if family.name == name && family.samples.is_empty() => family,
                    _ => {
                        if !seen_families.insert(name.to_owned()) {
                            return Err(at(format!("family `{name}` declared twice")));
                        }
                        out.families.push(Family {
                            name: name.to_owned(),
                            ..Family::default()
                        });
                        out.families.last_mut().expect("just pushed")
                    }
                };
                if keyword == "HELP" {
                    if current.help.is_some() {
                        return Err(at("second HELP".into()));
                    }
                    let mut help = String::new();
                    let mut chars = rest.chars();
                    while let Some(c) = chars.next() {
                        match c {
                            '\\' => match chars.next() {
                                Some('\\') => help.push('\\'),
                                Some('n') => help.push('\n'),
                                Some('"') => help.push('"'),
                                other => return Err(at(format!("bad escape {other:?} in HELP"))),
                            },
                            c => help.push(c),
                        }
                    }
                    if help.trim().is_empty() {
                        return Err(at("empty HELP".into()));
                    }
                    current.help = Some(help);
                } else {
                    if current.kind.is_some() {
                        return Err(at("second TYPE".into()));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&rest) {
                        return Err(at(format!("unknown TYPE `{rest}`")));
                    }
                    current.kind = Some(rest.to_owned());
                }
                continue;
            }
            let sample = parse_sample(line).map_err(at)?;
            let family = out
                .families
                .last_mut()
                .ok_or_else(|| at("a sample before any HELP/TYPE".into()))?;
            let (Some(kind), Some(_)) = (family.kind.as_deref(), family.help.as_deref()) else {
                return Err(at(format!("family `{}` lacks HELP or TYPE", family.name)));
            };
            if !belongs(&sample.name, &family.name, kind) {
                return Err(at(format!(
                    "sample `{}` is not part of the {kind} family `{}` declared before it",
                    sample.name, family.name
                )));
            }
            if kind == "counter" && (sample.value < 0.0 || sample.value.is_nan()) {
                return Err(at("a counter below zero".into()));
            }
            if sample.name.ends_with("_bucket") && kind == "histogram" {
                parse_value(
                    sample
                        .labels
                        .get("le")
                        .ok_or_else(|| at("bucket without le".into()))?,
                )
                .map_err(at)?;
            }
            let series = format!("{}{:?}", sample.name, sample.labels);
            if !seen_series.insert(series.clone()) {
                return Err(at(format!("series {series} repeated")));
            }
            family.samples.push(sample);
        }
        for family in &out.families {
            if family.help.is_none() || family.kind.is_none() {
                return Err(format!("family `{}` lacks HELP or TYPE", family.name));
            }
            if family.kind.as_deref() == Some("histogram") {
                check_histogram(family)?;
            }
        }
        Ok(out)
    }

    /// Per label set: buckets ascending in `le` and non-decreasing in count,
    /// ending with `+Inf`, which equals `_count`; `_sum` present.
    fn check_histogram(family: &Family) -> Result<(), String> {
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for sample in family
            .samples
            .iter()
            .filter(|s| s.name.ends_with("_bucket"))
        {
            let mut labels = sample.labels.clone();
            let le = parse_value(&labels.remove("le").unwrap_or_default())?;
            series
                .entry(format!("{labels:?}"))
                .or_default()
                .push((le, sample.value));
        }
        for (labels, buckets) in series {
            if !buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
            {
                return Err(format!("{} {labels}: buckets not cumulative", family.name));
            }
            let (le, inf) = *buckets.last().expect("one bucket at least");
            if le != f64::INFINITY {
                return Err(format!("{} {labels}: no +Inf bucket", family.name));
            }
            let count = family.samples.iter().find(|s| {
                s.name == format!("{}_count", family.name) && format!("{:?}", s.labels) == labels
            });
            let sum = family.samples.iter().find(|s| {
                s.name == format!("{}_sum", family.name) && format!("{:?}", s.labels) == labels
            });
            match (count, sum) {
                (Some(count), Some(_)) if count.value == inf => {}
                _ => {
                    return Err(format!(
                        "{} {labels}: _count must equal +Inf, _sum present",
                        family.name
                    ))
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_reader_refuses_what_prometheus_would() {
        let good = "# HELP a Things.\n# TYPE a counter\na_total{x=\"q\\\"\\\\\\n\"} 3\n# EOF\n";
        let parsed = parse(good).unwrap();
        assert_eq!(parsed.value("a_total", &[("x", "q\"\\\n")]), Some(3.0));
        for bad in [
            "a_total 1\n# EOF\n",                                               // no HELP/TYPE
            "# TYPE a counter\na_total 1\n# EOF\n",                             // no HELP
            "# HELP a x\n# TYPE a counter\na_total 1\n# EOF",                   // no final newline
            "# HELP a x\n# TYPE a counter\na_total 1\n",                        // no # EOF
            "# HELP a x\n# TYPE a counter\n# EOF\na_total 1\n# EOF\n",          // text after # EOF
            "# HELP a x\n# TYPE a counter\nb_total 1\n# EOF\n",                // other family
            "# HELP a x\n# TYPE a counter\na 1\n# EOF\n",                      // counter without _total
            "# HELP a x\n# TYPE a counter\na_total{x=\"1} 1\n# EOF\n",         // unterminated
            "# HELP a x\n# TYPE a counter\na_total{x=\"\\t\"} 1\n# EOF\n",     // bad escape
            "# HELP a x\n# TYPE a counter\na_total{1x=\"1\"} 1\n# EOF\n",      // bad label name
            "# HELP a x\n# TYPE a counter\na_total one\n# EOF\n",              // bad value
            "# HELP a x\n# TYPE a counter\na_total 1\na_total 2\n# EOF\n",     // repeated
            "# HELP a x\n# TYPE a counter\na_total -1\n# EOF\n",               // negative counter
            "# HELP a x\n# TYPE a sometype\na 1\n# EOF\n",                     // unknown type
            "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n# EOF\n",
            "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n# EOF\n",
        ] {
            assert!(parse(bad).is_err(), "accepted:\n{bad}");
        }
    }
}

/// Flow control on the event page: an event of a full concurrency key says
/// which events hold the key (with links), and a superseded event says
/// which event took its place.
pub async fn an_event_page_says_which_limit_holds_the_event_back(db: TestDb) {
    let handlers = Handlers::new()
        .on(
            "shop",
            "product.synced",
            Handler::new()
                .named_step("sync", Record::default())
                .concurrency_per("/shop", 1),
        )
        .on(
            "shop",
            "product.updated",
            Handler::new()
                .named_step("push", Record::default())
                .debounce_per(
                    "/product",
                    std::time::Duration::from_secs(60),
                    std::time::Duration::from_secs(600),
                ),
        );
    let engine = engine(&db, handlers);
    let router = Dashboard::new(engine.clone()).token(TOKEN).router();
    let json = serde_json::json!({ "shop": "a" });
    accept(
        &engine,
        "shop",
        "evt_holder",
        "product.synced",
        json.clone(),
    )
    .await;
    accept(&engine, "shop", "evt_waiter", "product.synced", json).await;
    let holder = seq_of(&db, "shop", "evt_holder").await;
    let waiter = seq_of(&db, "shop", "evt_waiter").await;
    let claimed = db
        .store
        .event_claim_many(&tickmark_driver::store::ClaimParams::new(
            "w",
            10,
            std::time::Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "the key allows one");

    let waiting = page(&get(&router, &format!("/events/{waiter}")).await);
    assert!(waiting.contains("id=\"key-wait\""), "{waiting}");
    assert!(waiting.contains("shop:a"), "{waiting}");
    assert!(
        waiting.contains(&format!("/events/{holder}\">#{holder}</a>")),
        "a link to the holder: {waiting}"
    );
    let holding = page(&get(&router, &format!("/events/{holder}")).await);
    assert!(!holding.contains("id=\"key-wait\""), "the holder runs");

    for id in ["evt_u1", "evt_u2"] {
        accept(
            &engine,
            "shop",
            id,
            "product.updated",
            serde_json::json!({ "product": "p1" }),
        )
        .await;
    }
    let first = seq_of(&db, "shop", "evt_u1").await;
    let second = seq_of(&db, "shop", "evt_u2").await;
    let superseded = page(&get(&router, &format!("/events/{first}")).await);
    assert!(superseded.contains("s-superseded"), "{superseded}");
    assert!(
        superseded.contains(&format!("superseded by event {second}")),
        "{superseded}"
    );
}

/// A waiting step is shown as `waiting`, with what it waits for and its
/// deadline; `/metrics` counts it.
pub async fn a_waiting_step_shows_what_it_waits_for_on_the_page_and_in_metrics(db: TestDb) {
    let handlers = Handlers::new().on(
        "shop",
        "order.created",
        Handler::new()
            .wait(
                "paid",
                tickmark::wait::WaitFor::event("shop", "order.paid")
                    .matching("/id")
                    .timeout(std::time::Duration::from_secs(3 * 24 * 3600)),
            )
            .named_step("fulfill", Record::default())
            .if_matched("paid"),
    );
    let engine = engine(&db, handlers);
    let router = Dashboard::new(engine.clone()).token(TOKEN).router();
    accept(
        &engine,
        "shop",
        "evt_order",
        "order.created",
        serde_json::json!({ "id": 41 }),
    )
    .await;
    run_all(&engine).await;
    let order = seq_of(&db, "shop", "evt_order").await;

    let shown = page(&get(&router, &format!("/events/{order}")).await);
    assert!(shown.contains("s-waiting"), "{shown}");
    assert!(
        shown.contains("waiting for order.paid from shop whose /id is 41"),
        "{shown}"
    );
    let ops = tickmark::ops::router(engine.clone(), None);
    let metrics = text(&get(&ops, "/metrics").await);
    assert!(
        metrics
            .lines()
            .any(|line| line == "tickmark_events_waiting 1"),
        "{metrics}"
    );
}
