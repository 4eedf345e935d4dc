//! The receiver inside an application's own axum router: merged next to the
//! application's routes and fallback, nested under a prefix, at a path
//! template of its own; every configuration error returned, never a panic;
//! and the start-up warnings that compare the mounted sources with the
//! handlers. Served over a real socket (`axum::serve` on `127.0.0.1:0`), on
//! both backends.
//!
//! Before `Receiver::router` became a plain router, merging it into an
//! application with a fallback panicked ("Cannot merge two `Router`s that
//! both have a fallback").

use crate::receiver_support::{assert_answer, now, record_everything, unsigned, Kind};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tickmark::receiver::{ReceiverConfigError, StartupWarning};
use tickmark::{Backend, Engine, EventState, Handler, Handlers, Receiver};
use tickmark_receiver::DEFAULT_PATH;
use tickmark_tests::conformance::engine;
use tickmark_tests::http_client::{oneshot, HttpClient, LoopbackServer, Outgoing, Reply};
use tickmark_tests::test_steps::Record;
use tickmark_tests::TestDb;

/// What the application answers for a path it does not know.
const APP_NOT_FOUND: &str = "the app has no such page";
/// What the application answers for another method on one of its routes.
const APP_WRONG_METHOD: &str = "the app takes GET here";

/// An application with a route of its own, its own fallback and its own
/// 405, all set before `add` merges or nests the receiver's router into it,
/// as an existing application's router is.
fn app(add: impl FnOnce(Router) -> Router) -> Router {
    let existing = Router::new()
        .route("/", get(|| async { "the app's home" }))
        .fallback(|| async { (StatusCode::NOT_FOUND, APP_NOT_FOUND) })
        .method_not_allowed_fallback(|| async {
            (StatusCode::METHOD_NOT_ALLOWED, APP_WRONG_METHOD)
        });
    add(existing)
}

/// The application and its database, served on a loopback socket.
struct Served {
    db: TestDb,
    server: LoopbackServer,
    client: HttpClient,
}

impl Served {
    /// `None` when PostgreSQL tests are skipped.
    async fn start(backend: Backend, router: impl FnOnce(Engine) -> Router) -> Option<Served> {
        let db = TestDb::new(backend).await?;
        let engine = engine(&db, record_everything());
        let server = LoopbackServer::start(router(engine)).await;
        Some(Served {
            db,
            server,
            client: HttpClient::new(),
        })
    }

    async fn send(&self, request: &Outgoing) -> Reply {
        self.client
            .send(self.server.addr, request)
            .await
            .expect("the application answers")
    }

    /// A signed Stripe delivery of `id`, POSTed to `path`.
    async fn deliver(&self, path: &str, id: &str) -> Reply {
        let mut delivery = Kind::Stripe.delivery(Kind::Stripe.secret(), id, now());
        delivery.path = path.into();
        self.send(&delivery).await
    }

    /// Assert that the event was recorded once, for a worker to run.
    async fn assert_recorded(&self, id: &str) {
        let record = self.db.record_of("stripe", id).await;
        assert_eq!(record.state, EventState::Pending, "{record:?}");
    }
}

fn text(reply: &Reply) -> &str {
    std::str::from_utf8(&reply.body).unwrap_or_default()
}

/// A receiver with the Stripe source, at the default path.
fn stripe(engine: Engine) -> Receiver {
    Receiver::new(engine)
        .source("stripe", Kind::Stripe.provider())
        .expect("a valid source")
}

/// Merged into an application that has its own routes, fallback and 405:
/// no panic; deliveries are verified and recorded; the receiver's own path
/// keeps its JSON answers (unknown source 404, another method 405); every
/// other path, `/healthz` included, is the application's.
async fn merged_into_an_app_with_its_own_fallback(backend: Backend) {
    let Some(app) = Served::start(backend, |engine| {
        app(|routes| routes.merge(stripe(engine).router()))
    })
    .await
    else {
        return;
    };
    assert_answer(
        &app.deliver("/hooks/stripe", "evt_merged").await,
        200,
        "new",
        None,
    );
    app.assert_recorded("evt_merged").await;
    assert_answer(
        &app.deliver("/hooks/stripe", "evt_merged").await,
        200,
        "duplicate",
        None,
    );
    let unsigned = unsigned(
        Kind::Stripe.delivery(Kind::Stripe.secret(), "evt_unsigned", now()),
        Kind::Stripe,
    );
    assert_answer(
        &app.send(&unsigned).await,
        401,
        "rejected",
        Some("missing_signature"),
    );
    assert_answer(
        &app.deliver("/hooks/paypal", "evt_elsewhere").await,
        404,
        "rejected",
        Some("unknown_source"),
    );
    let wrong_method = app.send(&Outgoing::get("/hooks/stripe")).await;
    assert_answer(&wrong_method, 405, "rejected", Some("method_not_allowed"));
    assert_eq!(wrong_method.header("allow"), Some("POST"));
    assert_answer(
        &app.send(&Outgoing::get("/hooks/paypal")).await,
        404,
        "rejected",
        Some("unknown_source"),
    );

    let home = app.send(&Outgoing::get("/")).await;
    assert_eq!((home.status, text(&home)), (200, "the app's home"));
    let posted_home = app.send(&Outgoing::post("/", "x")).await;
    assert_eq!(
        (posted_home.status, text(&posted_home)),
        (405, APP_WRONG_METHOD)
    );
    for path in ["/nope", "/healthz", "/hooks", "/hooks/stripe/extra"] {
        let reply = app.send(&Outgoing::get(path)).await;
        assert_eq!((reply.status, text(&reply)), (404, APP_NOT_FOUND), "{path}");
    }
    assert_eq!(
        app.db
            .probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await,
        1
    );
}

/// Nested under a prefix: deliveries come in under it, and the paths
/// outside it are the application's.
async fn nested_under_a_prefix(backend: Backend) {
    let Some(app) = Served::start(backend, |engine| {
        app(|routes| routes.nest("/integrations", stripe(engine).router()))
    })
    .await
    else {
        return;
    };
    assert_answer(
        &app.deliver("/integrations/hooks/stripe", "evt_nested")
            .await,
        200,
        "new",
        None,
    );
    app.assert_recorded("evt_nested").await;
    assert_answer(
        &app.send(&Outgoing::get("/integrations/hooks/stripe")).await,
        405,
        "rejected",
        Some("method_not_allowed"),
    );
    let outside = app.deliver("/hooks/stripe", "evt_outside").await;
    assert_eq!((outside.status, text(&outside)), (404, APP_NOT_FOUND));
    let health = app.send(&Outgoing::get("/integrations/healthz")).await;
    assert_eq!((health.status, text(&health)), (404, APP_NOT_FOUND));
}

/// At a path template of its own, merged or served alone: deliveries are
/// received there and nowhere else; alone, `/healthz` and the JSON answers
/// for other paths are still there.
async fn a_custom_path_template(backend: Backend) {
    let at_webhooks = |engine: Engine| {
        Receiver::new(engine)
            .path("/webhooks/{source}/events")
            .expect("a valid template")
            .source("stripe", Kind::Stripe.provider())
            .expect("a valid source")
    };
    let Some(app) = Served::start(backend, |engine| {
        app(|routes| routes.merge(at_webhooks(engine).router()))
    })
    .await
    else {
        return;
    };
    assert_answer(
        &app.deliver("/webhooks/stripe/events", "evt_templated")
            .await,
        200,
        "new",
        None,
    );
    app.assert_recorded("evt_templated").await;
    let default_path = app.deliver("/hooks/stripe", "evt_default").await;
    assert_eq!(
        (default_path.status, text(&default_path)),
        (404, APP_NOT_FOUND)
    );

    let Some(alone) =
        Served::start(backend, |engine| at_webhooks(engine).standalone_router()).await
    else {
        return;
    };
    assert_answer(
        &alone.deliver("/webhooks/stripe/events", "evt_alone").await,
        200,
        "new",
        None,
    );
    assert_answer(
        &alone.deliver("/hooks/stripe", "evt_default").await,
        404,
        "rejected",
        Some("not_found"),
    );
    assert_answer(
        &alone.send(&Outgoing::get("/healthz")).await,
        200,
        "ok",
        None,
    );
    assert_answer(
        &alone.send(&Outgoing::get("/webhooks/stripe/events")).await,
        405,
        "rejected",
        Some("method_not_allowed"),
    );
}

/// A template at the root (`/{source}`) serves alone next to `/healthz`:
/// the static route wins for `/healthz`, every other name is a source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_at_the_root_leaves_healthz_alone() {
    let db = TestDb::sqlite().await;
    let router = Receiver::new(engine(&db, record_everything()))
        .path("/{source}")
        .and_then(|receiver| receiver.source("stripe", Kind::Stripe.provider()))
        .expect("a valid receiver")
        .standalone_router();
    let mut delivery = Kind::Stripe.delivery(Kind::Stripe.secret(), "evt_root", now());
    delivery.path = "/stripe".into();
    assert_answer(&oneshot(&router, &delivery).await, 200, "new", None);
    assert_answer(
        &oneshot(&router, &Outgoing::get("/healthz")).await,
        200,
        "ok",
        None,
    );
    delivery.path = "/paypal".into();
    assert_answer(
        &oneshot(&router, &delivery).await,
        404,
        "rejected",
        Some("unknown_source"),
    );
}

/// The builder as an application writes it, in a function that returns a
/// boxed error: every mistake comes back through `?`.
fn webhooks(
    engine: Engine,
    template: &str,
    names: &[&str],
) -> Result<Router, Box<dyn std::error::Error>> {
    let mut receiver = Receiver::new(engine).path(template)?;
    for name in names {
        receiver = receiver.source(*name, Kind::Stripe.provider())?;
    }
    Ok(receiver.router())
}

/// A bad source name, a name mounted twice and a bad path template are
/// returned as errors that say what to change; none panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_configuration_error_is_returned_with_what_to_do() {
    let db = TestDb::sqlite().await;
    let engine = engine(&db, record_everything());
    let error_of = |template: &str, names: &[&str]| {
        webhooks(engine.clone(), template, names)
            .expect_err("refused")
            .downcast::<ReceiverConfigError>()
            .map(|error| *error)
            .expect("a receiver configuration error")
    };
    assert!(webhooks(engine.clone(), DEFAULT_PATH, &["stripe", "stripe-eu"]).is_ok());

    for bad in ["", "a/b", "a b", ".hidden", "é"] {
        let error = error_of(DEFAULT_PATH, &[bad]);
        assert_eq!(
            error,
            ReceiverConfigError::InvalidSourceName { name: bad.into() }
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!("`{bad}`")) && message.contains("rename it"),
            "{message}"
        );
    }
    let long = "s".repeat(tickmark_receiver::MAX_SOURCE_NAME_LEN + 1);
    assert!(matches!(
        error_of(DEFAULT_PATH, &[&long]),
        ReceiverConfigError::InvalidSourceName { .. }
    ));

    let twice = error_of(DEFAULT_PATH, &["stripe", "github", "stripe"]);
    assert_eq!(
        twice,
        ReceiverConfigError::DuplicateSource {
            name: "stripe".into()
        }
    );
    let message = twice.to_string();
    assert!(
        message.contains("`stripe` is mounted twice") && message.contains("`stripe-2`"),
        "{message}"
    );

    for (template, problem) in [
        ("webhooks/{source}", "must start with `/`"),
        ("/webhooks", "must hold `{source}`"),
        ("/{source}/{source}", "exactly once"),
        ("/{tenant}/{source}", "no other capture"),
        ("/hooks/:source", "only ASCII letters"),
        ("/hooks/{source}/", "empty path segment"),
    ] {
        let error = error_of(template, &["stripe"]);
        assert!(
            matches!(&error, ReceiverConfigError::InvalidPathTemplate { template: t, .. } if t == template),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains(problem) && message.contains("write it like `/webhooks/{source}`"),
            "{template}: {message}"
        );
    }
}

/// At start-up the receiver says which mounted sources no handler takes
/// (a warning: all their events would be `ignored`) and which sources the
/// handlers name that it does not mount (informational).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_compares_the_mounted_sources_with_the_handlers() {
    let db = TestDb::sqlite().await;
    let handlers = Handlers::new()
        .on(
            "stripe",
            "invoice.paid",
            Handler::new().named_step("first", Record::default()),
        )
        .on(
            "paddle",
            "transaction.completed",
            Handler::new().named_step("first", Record::default()),
        );
    let receiver = Receiver::new(engine(&db, handlers))
        .source("stripe", Kind::Stripe.provider())
        .and_then(|receiver| receiver.source("github", Kind::GitHub.provider()))
        .expect("valid sources");
    let warnings = receiver.startup_warnings();
    assert_eq!(
        warnings,
        [
            StartupWarning::UnhandledSource {
                source: "github".into()
            },
            StartupWarning::UnmountedSource {
                source: "paddle".into()
            },
        ]
    );
    assert!(!warnings[0].is_informational());
    assert!(warnings[1].is_informational());
    assert_eq!(warnings[0].source_name(), "github");

    // With a handler for every source, nothing is said.
    let everything = Receiver::new(engine(&db, record_everything()))
        .source("github", Kind::GitHub.provider())
        .expect("a valid source");
    assert!(everything.startup_warnings().is_empty());
}

// Every case, once per backend: the modules `sqlite` and `postgres`.
tickmark_tests::per_backend!(backend => [
    merged_into_an_app_with_its_own_fallback,
    nested_under_a_prefix,
    a_custom_path_template,
]);
