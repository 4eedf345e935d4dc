//! Shared by the `receiver_*` tests: a signer for every provider (computed
//! with `hmac`/`sha1`/`sha2` directly, independently of the verifiers under
//! test), and a harness that serves a receiver on a fresh database, in-process
//! (`tower::ServiceExt::oneshot`) or over a real loopback socket.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use tickmark::receiver::providers::{
    Algorithm, Encoding, FieldSource, GenericHmac, GenericHmacConfig, GitHub, Provider, Shopify,
    Slack, StandardWebhooks, Stripe, Twilio,
};
use tickmark::receiver::PublicBaseUrl;
use tickmark::{Backend, Engine, Handler, Handlers, Receiver, WorkerStats, ANY};
use tickmark_tests::conformance::{engine, quick_worker};
use tickmark_tests::http_client::{oneshot, HttpClient, LoopbackServer, Outgoing, Reply};
use tickmark_tests::test_steps::Record;
use tickmark_tests::TestDb;

/// Where providers are told the receiver lives (Twilio signs it).
pub const PUBLIC_BASE: &str = "https://hooks.example.test";

/// Every body carries this word; tampering changes it after signing.
pub const MARKER: &str = "hello";

/// The providers, as the tests mount them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stripe,
    GitHub,
    Shopify,
    StandardWebhooks,
    Slack,
    Twilio,
    GenericHmac,
}

impl Kind {
    /// All seven.
    pub const ALL: [Kind; 7] = [
        Kind::Stripe,
        Kind::GitHub,
        Kind::Shopify,
        Kind::StandardWebhooks,
        Kind::Slack,
        Kind::Twilio,
        Kind::GenericHmac,
    ];

    /// The source name (mounted at `/hooks/{source}`).
    pub fn source(self) -> &'static str {
        match self {
            Kind::Stripe => "stripe",
            Kind::GitHub => "github",
            Kind::Shopify => "shopify",
            Kind::StandardWebhooks => "standard",
            Kind::Slack => "slack",
            Kind::Twilio => "twilio",
            Kind::GenericHmac => "generic",
        }
    }

    /// The current signing secret.
    pub fn secret(self) -> &'static str {
        match self {
            Kind::Stripe => "whsec_current_test_secret",
            // whsec_ + base64("current-standard-webhooks-key-32")
            Kind::StandardWebhooks => "whsec_Y3VycmVudC1zdGFuZGFyZC13ZWJob29rcy1rZXktMzI=",
            _ => "current-test-secret",
        }
    }

    /// The previous secret, still accepted during a rotation.
    pub fn previous_secret(self) -> &'static str {
        match self {
            Kind::Stripe => "whsec_previous_test_secret",
            // whsec_ + base64("previous-standard-webhooks-key!!")
            Kind::StandardWebhooks => "whsec_cHJldmlvdXMtc3RhbmRhcmQtd2ViaG9va3Mta2V5ISE=",
            _ => "previous-test-secret",
        }
    }

    /// A secret the receiver does not know.
    pub fn wrong_secret(self) -> &'static str {
        match self {
            Kind::Stripe => "whsec_somebody_elses_secret",
            // whsec_ + base64("somebody-elses-webhooks-key-here")
            Kind::StandardWebhooks => "whsec_c29tZWJvZHktZWxzZXMtd2ViaG9va3Mta2V5LWhlcmU=",
            _ => "somebody-elses-secret",
        }
    }

    /// Whether the scheme signs a timestamp (and so refuses stale ones).
    pub fn has_timestamp(self) -> bool {
        matches!(self, Kind::Stripe | Kind::StandardWebhooks | Kind::Slack)
    }

    /// The header that carries the signature.
    pub fn signature_header(self) -> &'static str {
        match self {
            Kind::Stripe => "stripe-signature",
            Kind::GitHub => "x-hub-signature-256",
            Kind::Shopify => "x-shopify-hmac-sha256",
            Kind::StandardWebhooks => "webhook-signature",
            Kind::Slack => "x-slack-signature",
            Kind::Twilio => "x-twilio-signature",
            Kind::GenericHmac => "x-signature",
        }
    }

    /// The verifier, with the current and previous secrets (a rotation).
    pub fn provider(self) -> Box<dyn Provider> {
        let secrets = [self.secret(), self.previous_secret()];
        match self {
            Kind::Stripe => Box::new(Stripe::new(secrets).unwrap()),
            Kind::GitHub => Box::new(GitHub::new(secrets).unwrap()),
            Kind::Shopify => Box::new(Shopify::new(secrets).unwrap()),
            Kind::StandardWebhooks => Box::new(StandardWebhooks::new(secrets).unwrap()),
            Kind::Slack => Box::new(Slack::new(secrets).unwrap()),
            Kind::Twilio => Box::new(Twilio::new(secrets).unwrap()),
            Kind::GenericHmac => {
                let mut config = GenericHmacConfig::new(
                    "X-Signature",
                    Algorithm::Sha256,
                    Encoding::Hex,
                    secrets,
                );
                config.prefix = Some("sha256=".into());
                config.id = Some(FieldSource::JsonPointer("/id".into()));
                config.kind = Some(FieldSource::Header("X-Event-Type".into()));
                Box::new(GenericHmac::new(config).unwrap())
            }
        }
    }

    /// The event type a [`Kind::delivery`] has.
    pub fn event_kind(self) -> &'static str {
        match self {
            Kind::Stripe => "invoice.paid",
            Kind::GitHub => "push",
            Kind::Shopify => "orders/create",
            Kind::StandardWebhooks => "invoice.paid",
            Kind::Slack => "app_mention",
            Kind::Twilio => "message",
            Kind::GenericHmac => "order.created",
        }
    }

    /// A delivery of event `id`, signed with `secret` at Unix time `t`, as
    /// the provider sends it.
    pub fn delivery(self, secret: &str, id: &str, t: i64) -> Outgoing {
        let path = format!("/hooks/{}", self.source());
        match self {
            Kind::Stripe => {
                let body = serde_json::json!({
                    "id": id, "object": "event", "type": "invoice.paid",
                    "data": {"object": {"id": "in_1", "amount_paid": 1200, "note": MARKER}}
                })
                .to_string();
                let signature =
                    hex::encode(hmac256(secret.as_bytes(), format!("{t}.{body}").as_bytes()));
                Outgoing::post(path, body)
                    .header("content-type", "application/json; charset=utf-8")
                    .header("stripe-signature", format!("t={t},v1={signature}"))
            }
            Kind::GitHub => {
                let body =
                    serde_json::json!({"ref": "refs/heads/main", "note": MARKER}).to_string();
                let signature = hex::encode(hmac256(secret.as_bytes(), body.as_bytes()));
                Outgoing::post(path, body)
                    .header("content-type", "application/json")
                    .header("x-hub-signature-256", format!("sha256={signature}"))
                    .header("x-github-delivery", id)
                    .header("x-github-event", "push")
            }
            Kind::Shopify => {
                let body =
                    serde_json::json!({"id": 820982911946154508u64, "note": MARKER}).to_string();
                let signature = b64(&hmac256(secret.as_bytes(), body.as_bytes()));
                Outgoing::post(path, body)
                    .header("content-type", "application/json")
                    .header("x-shopify-hmac-sha256", signature)
                    .header("x-shopify-webhook-id", id)
                    .header("x-shopify-topic", "orders/create")
            }
            Kind::StandardWebhooks => {
                let body = serde_json::json!({"type": "invoice.paid", "data": {"note": MARKER}})
                    .to_string();
                let key = base64::engine::general_purpose::STANDARD
                    .decode(secret.trim_start_matches("whsec_"))
                    .unwrap();
                let signature = b64(&hmac256(&key, format!("{id}.{t}.{body}").as_bytes()));
                Outgoing::post(path, body)
                    .header("content-type", "application/json")
                    .header("webhook-id", id)
                    .header("webhook-timestamp", t.to_string())
                    .header("webhook-signature", format!("v1,{signature}"))
            }
            Kind::Slack => {
                let body = serde_json::json!({
                    "type": "event_callback", "event_id": id,
                    "event": {"type": "app_mention", "text": MARKER}
                })
                .to_string();
                let signature = hex::encode(hmac256(
                    secret.as_bytes(),
                    format!("v0:{t}:{body}").as_bytes(),
                ));
                Outgoing::post(path, body)
                    .header("content-type", "application/json")
                    .header("x-slack-request-timestamp", t.to_string())
                    .header("x-slack-signature", format!("v0={signature}"))
            }
            Kind::Twilio => {
                let params = [
                    ("MessageSid", "SM0123456789abcdef"),
                    ("From", "+15550001111"),
                    ("Body", MARKER),
                ];
                let url = format!("{PUBLIC_BASE}{path}");
                twilio_form(secret, &url, &path, &params).header("i-twilio-idempotency-token", id)
            }
            Kind::GenericHmac => {
                let body = serde_json::json!({"id": id, "total": 5, "note": MARKER}).to_string();
                let signature = hex::encode(hmac256(secret.as_bytes(), body.as_bytes()));
                Outgoing::post(path, body)
                    .header("content-type", "application/json")
                    .header("x-signature", format!("sha256={signature}"))
                    .header("x-event-type", "order.created")
            }
        }
    }
}

/// A Twilio form post of `params` to `path`, signed over `signed_url`.
pub fn twilio_form(token: &str, signed_url: &str, path: &str, params: &[(&str, &str)]) -> Outgoing {
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (name, value) in params {
        serializer.append_pair(name, value);
    }
    let body = serializer.finish();
    let mut sorted = params.to_vec();
    sorted.sort();
    let mut data = signed_url.to_owned();
    for (name, value) in sorted {
        data.push_str(name);
        data.push_str(value);
    }
    let signature = b64(&hmac1(token.as_bytes(), data.as_bytes()));
    Outgoing::post(path, body)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-twilio-signature", signature)
}

/// The same request with its body changed after it was signed.
pub fn tampered(mut request: Outgoing) -> Outgoing {
    let body = String::from_utf8(request.body).unwrap();
    assert!(body.contains(MARKER), "{body}");
    request.body = body.replacen(MARKER, "HELLO", 1).into_bytes();
    request
}

/// The same request without its signature header.
pub fn unsigned(mut request: Outgoing, kind: Kind) -> Outgoing {
    request
        .headers
        .retain(|(name, _)| !name.eq_ignore_ascii_case(kind.signature_header()));
    request
}

pub fn hmac256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

pub fn hmac1(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Now, in Unix seconds.
pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Every source mounted, with the current and previous secrets, behind
/// [`PUBLIC_BASE`].
pub fn all_sources(receiver: Receiver) -> Receiver {
    Kind::ALL
        .into_iter()
        .fold(receiver, |receiver, kind| {
            receiver
                .source(kind.source(), kind.provider())
                .expect("a valid source")
        })
        .public_base_url(PublicBaseUrl::parse(PUBLIC_BASE).unwrap())
}

/// One recording step for every event of every source.
pub fn record_everything() -> Handlers {
    Handlers::new().on(
        ANY,
        ANY,
        Handler::new().named_step("first", Record::default()),
    )
}

/// How requests reach the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `tower::ServiceExt::oneshot` on the router.
    InProcess,
    /// A real HTTP/1.1 client over a loopback socket.
    Socket,
}

/// A receiver on a fresh database, reachable by one transport.
pub struct Harness {
    pub db: TestDb,
    pub engine: Engine,
    pub router: axum::Router,
    server: Option<LoopbackServer>,
    client: HttpClient,
}

impl Harness {
    /// `None` when PostgreSQL tests are skipped.
    pub async fn new(
        backend: Backend,
        transport: Transport,
        handlers: Handlers,
        configure: impl FnOnce(Receiver) -> Receiver,
    ) -> Option<Harness> {
        let db = TestDb::new(backend).await?;
        let engine = engine(&db, handlers);
        // Served alone, as `Receiver::serve` serves it: with `/healthz` and
        // JSON answers for every path.
        let router = configure(Receiver::new(engine.clone())).standalone_router();
        let server = match transport {
            Transport::InProcess => None,
            Transport::Socket => Some(LoopbackServer::start(router.clone()).await),
        };
        Some(Harness {
            db,
            engine,
            router,
            server,
            client: HttpClient::new(),
        })
    }

    /// Send one request.
    pub async fn send(&self, request: &Outgoing) -> Reply {
        match &self.server {
            None => oneshot(&self.router, request).await,
            Some(server) => self
                .client
                .send(server.addr, request)
                .await
                .expect("the receiver answers"),
        }
    }

    /// The loopback address, when served over a socket.
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        self.server.as_ref().map(|server| server.addr)
    }

    /// Rows in the inbox.
    pub async fn event_rows(&self) -> i64 {
        self.db
            .probe
            .scalar("SELECT count(*) FROM tickmark_events")
            .await
    }

    /// Run a worker until nothing is left to do.
    pub async fn run_worker(&self) -> WorkerStats {
        self.engine
            .worker(quick_worker("receiver-test"))
            .expect("valid worker settings")
            .run_until_idle()
            .await
            .expect("worker")
    }
}

/// Assert a JSON answer with this status and `status` word (and, for
/// refusals, `error` code).
#[track_caller]
pub fn assert_answer(reply: &Reply, status: u16, word: &str, code: Option<&str>) {
    let json = reply.json();
    assert_eq!(reply.status, status, "{json}");
    assert_eq!(json["status"], word, "{json}");
    if let Some(code) = code {
        assert_eq!(json["error"], code, "{json}");
        assert!(
            json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "a refusal says why: {json}"
        );
    }
    assert!(
        reply
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("application/json")),
        "JSON body"
    );
}
