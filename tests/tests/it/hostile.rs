//! Guarantee 8 against a corpus of hostile requests, for every provider
//! (Stripe, GitHub, Shopify, Standard Webhooks with its `webhook-*` and Svix
//! `svix-*` names, Slack, Twilio, generic HMAC), sent as raw bytes over a real
//! socket to a real receiver, on SQLite and PostgreSQL.
//!
//! The corpus: missing and duplicated headers; signatures of the wrong length
//! or encoding, or with bytes that are not ASCII; timestamps far in the past
//! and the future, or too long; bodies that are not UTF-8, not JSON, nested
//! 10,000 deep, or just over the body limit (with and without a
//! Content-Length); ids with control characters or 10 KB long; missing ids;
//! header blocks too large for the HTTP server. Each request gets its exact
//! documented status and, where the receiver answers, its JSON `error` code;
//! after each one `/healthz` still answers and `tickmark_events` is still
//! empty.
//!
//! Header blocks larger than hyper's read buffer (64 KiB under `tickmark::serve`,
//! about 400 KiB under `axum::serve`), or with
//! more than 100 header lines, never reach the receiver: hyper answers
//! `431 Request Header Fields Too Large` itself, with an empty body, and
//! closes the connection (`docs/fuzzing.md`, "Hostile requests"). A header value with a raw
//! control character other than tab is refused by the HTTP parser with a bare
//! `400`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::receiver_support::{
    all_sources, b64, hmac1, hmac256, now, record_everything, Harness, Kind, Transport, PUBLIC_BASE,
};
use base64::Engine as _;
use sha2::Digest as _;
use tickmark::Backend;
use tickmark_receiver::DEFAULT_BODY_LIMIT;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Ten years, in seconds: far beyond any tolerance.
const DECADE: i64 = 10 * 365 * 24 * 3600;

/// A request as raw parts: header values are bytes (they need not be UTF-8).
#[derive(Debug, Clone)]
struct Raw {
    method: &'static str,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// Send the body chunked, without a Content-Length.
    chunked: bool,
}

impl Raw {
    fn post(path: impl Into<String>, body: impl Into<Vec<u8>>) -> Raw {
        Raw {
            method: "POST",
            path: path.into(),
            headers: Vec::new(),
            body: body.into(),
            chunked: false,
        }
    }

    fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Raw {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    /// Replace every header `name` with one of this value.
    fn set(mut self, name: &str, value: impl Into<Vec<u8>>) -> Raw {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.header(name, value)
    }

    fn without(mut self, name: &str) -> Raw {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    /// The same header once more, with the same value.
    fn doubled(self, name: &str) -> Raw {
        let value = self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no header {name} to double"));
        self.header(name, value)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.path).into_bytes();
        out.extend_from_slice(b"host: 127.0.0.1\r\nconnection: close\r\n");
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        if self.chunked {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
            for chunk in self.body.chunks(64 * 1024) {
                out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                out.extend_from_slice(chunk);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
        } else {
            out.extend_from_slice(
                format!("content-length: {}\r\n\r\n", self.body.len()).as_bytes(),
            );
            out.extend_from_slice(&self.body);
        }
        out
    }
}

/// What came back over the socket.
#[derive(Debug)]
struct RawReply {
    status: u16,
    body: Vec<u8>,
}

impl RawReply {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Write `request` (while reading, so a server that answers early and closes
/// is heard) and read the answer until the server closes.
async fn send_raw(addr: SocketAddr, request: &Raw) -> RawReply {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let bytes = request.bytes();
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(&bytes).await;
        let _ = writer.flush().await;
        writer
    });
    let mut received = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    writing.abort();
    let text_end = received
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| {
            panic!(
                "no HTTP answer: {:?}",
                String::from_utf8_lossy(&received[..received.len().min(200)])
            )
        });
    let head = String::from_utf8_lossy(&received[..text_end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    RawReply {
        status,
        body: received[text_end + 4..].to_vec(),
    }
}

fn hex256(key: &[u8], message: &[u8]) -> String {
    hex::encode(hmac256(key, message))
}

fn standard_key(secret: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .expect("base64 key")
}

/// A correctly signed JSON delivery of `body` for `kind`, with event id `id`
/// (in the header where the provider puts it there) at Unix time `t`.
fn signed(kind: Kind, body: &[u8], id: &[u8], t: i64) -> Raw {
    let secret = kind.secret();
    let path = format!("/hooks/{}", kind.source());
    let raw = Raw::post(path.clone(), body.to_vec()).header("content-type", "application/json");
    let with_t = |prefix: &str| {
        let mut message = prefix.as_bytes().to_vec();
        message.extend_from_slice(body);
        message
    };
    match kind {
        Kind::Stripe => raw.header(
            "stripe-signature",
            format!(
                "t={t},v1={}",
                hex256(secret.as_bytes(), &with_t(&format!("{t}.")))
            ),
        ),
        Kind::GitHub => raw
            .header(
                "x-hub-signature-256",
                format!("sha256={}", hex256(secret.as_bytes(), body)),
            )
            .header("x-github-delivery", id)
            .header("x-github-event", "push"),
        Kind::Shopify => raw
            .header(
                "x-shopify-hmac-sha256",
                b64(&hmac256(secret.as_bytes(), body)),
            )
            .header("x-shopify-webhook-id", id)
            .header("x-shopify-topic", "orders/create"),
        Kind::StandardWebhooks => {
            let mut message = id.to_vec();
            message.extend_from_slice(format!(".{t}.").as_bytes());
            message.extend_from_slice(body);
            let signature = b64(&hmac256(&standard_key(secret), &message));
            raw.header("webhook-id", id)
                .header("webhook-timestamp", t.to_string())
                .header("webhook-signature", format!("v1,{signature}"))
        }
        Kind::Slack => raw
            .header("x-slack-request-timestamp", t.to_string())
            .header(
                "x-slack-signature",
                format!(
                    "v0={}",
                    hex256(secret.as_bytes(), &with_t(&format!("v0:{t}:")))
                ),
            ),
        Kind::Twilio => {
            // A JSON body: the URL is signed with the body's SHA-256 in it.
            let hash = hex::encode(sha2::Sha256::digest(body));
            let url = format!("{PUBLIC_BASE}{path}?bodySHA256={hash}");
            raw.header(
                "x-twilio-signature",
                b64(&hmac1(secret.as_bytes(), url.as_bytes())),
            )
            .header("i-twilio-idempotency-token", id)
        }
        Kind::GenericHmac => raw
            .header(
                "x-signature",
                format!("sha256={}", hex256(secret.as_bytes(), body)),
            )
            .header("x-event-type", "order.created"),
    }
}

/// Whether the provider reads the event id from the body (else a header).
fn id_in_body(kind: Kind) -> bool {
    matches!(kind, Kind::Stripe | Kind::Slack | Kind::GenericHmac)
}

/// A valid JSON body for `kind` carrying `id` where the provider reads it.
fn body_with_id(kind: Kind, id: &str) -> Vec<u8> {
    let value = match kind {
        Kind::Stripe => serde_json::json!({"id": id, "type": "invoice.paid"}),
        Kind::Slack => serde_json::json!({
            "type": "event_callback", "event_id": id, "event": {"type": "app_mention"}
        }),
        Kind::GenericHmac => serde_json::json!({"id": id, "total": 1}),
        Kind::StandardWebhooks => serde_json::json!({"type": "invoice.paid"}),
        _ => serde_json::json!({"note": "hostile"}),
    };
    value.to_string().into_bytes()
}

/// A valid, signed delivery of `kind` for event `id`.
fn valid(kind: Kind, id: &str) -> Raw {
    signed(kind, &body_with_id(kind, id), id.as_bytes(), now())
}

/// The signature header's value in a valid delivery.
fn signature_of(raw: &Raw, kind: Kind) -> Vec<u8> {
    raw.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(kind.signature_header()))
        .map(|(_, v)| v.clone())
        .expect("a signature header")
}

/// The signature header with the digest replaced by `digest` (bytes),
/// encoded as the provider encodes it, or by `text` as is.
fn with_signature_text(raw: Raw, kind: Kind, text: &str) -> Raw {
    let value = match kind {
        Kind::Stripe => format!("t={},v1={text}", now()),
        Kind::GitHub | Kind::GenericHmac => format!("sha256={text}"),
        Kind::StandardWebhooks => format!("v1,{text}"),
        Kind::Slack => format!("v0={text}"),
        Kind::Shopify | Kind::Twilio => text.to_owned(),
    };
    raw.set(kind.signature_header(), value)
}

/// The provider's digest length in bytes, and whether it is hex-encoded.
fn digest(kind: Kind) -> (usize, bool) {
    match kind {
        Kind::Twilio => (20, false),
        Kind::Shopify | Kind::StandardWebhooks => (32, false),
        _ => (32, true),
    }
}

/// One hostile request and the answer it must get.
struct Case {
    name: String,
    request: Raw,
    status: u16,
    /// The JSON `error` code; `None` for answers hyper gives itself.
    code: Option<&'static str>,
}

fn case(name: &str, request: Raw, status: u16, code: &'static str) -> Case {
    Case {
        name: name.to_owned(),
        request,
        status,
        code: Some(code),
    }
}

/// The corpus for one provider.
fn corpus(kind: Kind) -> Vec<Case> {
    let header = kind.signature_header();
    let (digest_len, hex_encoded) = digest(kind);
    let encode = |bytes: &[u8]| {
        if hex_encoded {
            hex::encode(bytes)
        } else {
            b64(bytes)
        }
    };
    let wrong_encoding = if hex_encoded {
        // Base64 where hex is expected.
        b64(&vec![7u8; digest_len])
    } else {
        // Hex where base64 is expected: valid base64 letters, wrong length.
        hex::encode(vec![7u8; digest_len])
    };
    let mut cases = vec![
        case(
            "missing signature header",
            valid(kind, "evt_h1").without(header),
            401,
            "missing_signature",
        ),
        case(
            "duplicated signature header",
            valid(kind, "evt_h2").doubled(header),
            401,
            "duplicate_header",
        ),
        case(
            "signature one byte short",
            with_signature_text(
                valid(kind, "evt_h3"),
                kind,
                &encode(&vec![1u8; digest_len - 1]),
            ),
            401,
            "malformed_signature",
        ),
        case(
            "signature one byte long",
            with_signature_text(
                valid(kind, "evt_h4"),
                kind,
                &encode(&vec![1u8; digest_len + 1]),
            ),
            401,
            "malformed_signature",
        ),
        case(
            "signature in the wrong encoding",
            with_signature_text(valid(kind, "evt_h5"), kind, &wrong_encoding),
            401,
            "malformed_signature",
        ),
        case(
            "signature with bytes that are not ASCII",
            valid(kind, "evt_h6").set(header, b"sha256=\xe9\xe9\xff".to_vec()),
            401,
            "malformed_signature",
        ),
        case(
            "64 KB signature header",
            with_signature_text(valid(kind, "evt_h7"), kind, &"a".repeat(64 * 1024)),
            401,
            "malformed_signature",
        ),
        case(
            "right length, wrong digest",
            with_signature_text(valid(kind, "evt_h8"), kind, &encode(&vec![9u8; digest_len])),
            401,
            "bad_signature",
        ),
        case(
            "body changed after signing",
            {
                let mut raw = valid(kind, "evt_h9");
                raw.body.push(b' ');
                raw
            },
            401,
            "bad_signature",
        ),
        case(
            "signed body that is not UTF-8",
            signed(kind, b"{\"id\":\"evt_\xff\xfe\"}", b"evt_h10", now()),
            400,
            "malformed_body",
        ),
        case(
            "signed body that is not JSON",
            signed(kind, b"this is not json", b"evt_h11", now()),
            400,
            "malformed_body",
        ),
        case(
            "signed JSON nested 10,000 deep",
            signed(
                kind,
                format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).as_bytes(),
                b"evt_h12",
                now(),
            ),
            400,
            "malformed_body",
        ),
        case(
            "10 KB event id",
            valid(kind, &format!("evt_{}", "x".repeat(10 * 1024))),
            400,
            "invalid_id",
        ),
        case(
            "body one byte over the limit, with Content-Length",
            signed(kind, &vec![b' '; DEFAULT_BODY_LIMIT + 1], b"evt_h14", now()),
            413,
            "payload_too_large",
        ),
        case(
            "body one byte over the limit, chunked",
            {
                let mut raw = signed(kind, &vec![b' '; DEFAULT_BODY_LIMIT + 1], b"evt_h15", now());
                raw.chunked = true;
                raw
            },
            413,
            "payload_too_large",
        ),
        Case {
            name: "512 KiB header block".into(),
            request: valid(kind, "evt_h16").header("x-padding", "p".repeat(512 * 1024)),
            status: 431,
            code: None,
        },
        Case {
            name: "200 header lines".into(),
            request: (0..200).fold(valid(kind, "evt_h17"), |raw, i| {
                raw.header(&format!("x-pad-{i}"), "p")
            }),
            status: 431,
            code: None,
        },
        Case {
            name: "raw control character in a header value".into(),
            request: valid(kind, "evt_h18").header("x-note", b"a\x01b".to_vec()),
            status: 400,
            code: None,
        },
    ];
    // An id with a control character: in the body as a JSON escape, in a
    // header as a tab (the only control character HTTP lets through).
    let control_id = if id_in_body(kind) {
        let id = "evt_\u{1}_\u{7f}";
        signed(kind, &body_with_id(kind, id), id.as_bytes(), now())
    } else {
        let raw = valid(kind, "evt_placeholder");
        signed(kind, &raw.body, b"evt_\ttab", now())
    };
    cases.push(case(
        "event id with control characters",
        control_id,
        400,
        "invalid_id",
    ));

    match kind {
        Kind::Stripe | Kind::StandardWebhooks | Kind::Slack => {
            let id = "evt_old";
            let body = body_with_id(kind, id);
            cases.push(case(
                "timestamp ten years in the past",
                signed(kind, &body, id.as_bytes(), now() - DECADE),
                401,
                "stale_timestamp",
            ));
            cases.push(case(
                "timestamp ten years in the future",
                signed(kind, &body, id.as_bytes(), now() + DECADE),
                401,
                "future_timestamp",
            ));
            cases.push(case(
                "timestamp of 13 digits",
                signed(kind, &body, id.as_bytes(), 1_000_000_000_000),
                401,
                "malformed_timestamp",
            ));
            cases.push(case(
                "negative timestamp",
                signed(kind, &body, id.as_bytes(), -1),
                401,
                "malformed_timestamp",
            ));
        }
        _ => {}
    }
    match kind {
        Kind::Stripe => {
            cases.push(case(
                "two t= entries",
                valid(kind, "evt_t2").set("stripe-signature", {
                    let mut value = signature_of(&valid(kind, "evt_t2"), kind);
                    value.extend_from_slice(format!(",t={}", now()).as_bytes());
                    value
                }),
                401,
                "malformed_signature",
            ));
            cases.push(case(
                "17 v1= entries",
                with_signature_text(
                    valid(kind, "evt_v17"),
                    kind,
                    &vec![hex::encode([3u8; 32]); 17].join(",v1="),
                ),
                401,
                "malformed_signature",
            ));
            cases.push(case(
                "signed body without an id",
                signed(kind, br#"{"type":"invoice.paid"}"#, b"", now()),
                400,
                "missing_id",
            ));
            cases.push(case(
                "signed body with a numeric id",
                signed(kind, br#"{"id":42,"type":"invoice.paid"}"#, b"", now()),
                400,
                "invalid_id",
            ));
            cases.push(case(
                "signed body without a type",
                signed(kind, br#"{"id":"evt_nt"}"#, b"", now()),
                400,
                "missing_kind",
            ));
        }
        Kind::GitHub => {
            cases.push(case(
                "no delivery id header",
                valid(kind, "evt_gh").without("x-github-delivery"),
                400,
                "missing_id",
            ));
            cases.push(case(
                "duplicated delivery id header",
                valid(kind, "evt_gh").doubled("x-github-delivery"),
                401,
                "duplicate_header",
            ));
            cases.push(case(
                "no event header",
                valid(kind, "evt_gh").without("x-github-event"),
                400,
                "missing_kind",
            ));
            cases.push(case(
                "signature without the sha256= prefix",
                valid(kind, "evt_gh").set(header, hex::encode([1u8; 32])),
                401,
                "malformed_signature",
            ));
        }
        Kind::Shopify => {
            cases.push(case(
                "no webhook id header",
                valid(kind, "evt_sh").without("x-shopify-webhook-id"),
                400,
                "missing_id",
            ));
            cases.push(case(
                "webhook id header that is not ASCII",
                valid(kind, "evt_sh").set("x-shopify-webhook-id", b"\xe9t\xe9".to_vec()),
                400,
                "invalid_id",
            ));
            cases.push(case(
                "no topic header",
                valid(kind, "evt_sh").without("x-shopify-topic"),
                400,
                "missing_kind",
            ));
        }
        Kind::StandardWebhooks => {
            let svix = |raw: Raw| {
                let mut raw = raw;
                for (name, _) in raw.headers.iter_mut() {
                    if let Some(rest) = name.strip_prefix("webhook-") {
                        *name = format!("svix-{rest}");
                    }
                }
                raw
            };
            let id = "msg_hostile";
            let body = body_with_id(kind, id);
            cases.push(case(
                "svix names: missing signature",
                svix(valid(kind, id)).without("svix-signature"),
                401,
                "missing_signature",
            ));
            cases.push(case(
                "svix names: duplicated timestamp",
                svix(valid(kind, id)).doubled("svix-timestamp"),
                401,
                "duplicate_header",
            ));
            cases.push(case(
                "svix names: stale timestamp",
                svix(signed(kind, &body, id.as_bytes(), now() - DECADE)),
                401,
                "stale_timestamp",
            ));
            cases.push(case(
                "svix names: 10 KB id",
                svix(valid(kind, &format!("msg_{}", "y".repeat(10 * 1024)))),
                400,
                "invalid_id",
            ));
            cases.push(case(
                "webhook-id with svix-timestamp and svix-signature (sets never mix)",
                {
                    let raw = svix(valid(kind, id));
                    let id_value = raw
                        .headers
                        .iter()
                        .find(|(n, _)| n == "svix-id")
                        .map(|(_, v)| v.clone())
                        .unwrap();
                    raw.without("svix-id").header("webhook-id", id_value)
                },
                401,
                "missing_timestamp",
            ));
            cases.push(case(
                "no id header",
                valid(kind, id).without("webhook-id"),
                400,
                "missing_id",
            ));
            cases.push(case(
                "no timestamp header",
                valid(kind, id).without("webhook-timestamp"),
                401,
                "missing_timestamp",
            ));
            cases.push(case(
                "17 v1, entries",
                with_signature_text(
                    valid(kind, id),
                    kind,
                    &vec![b64(&[3u8; 32]); 17].join(" v1,"),
                ),
                401,
                "malformed_signature",
            ));
            cases.push(case(
                "signed body without a type",
                signed(kind, b"{}", id.as_bytes(), now()),
                400,
                "missing_kind",
            ));
        }
        Kind::Slack => {
            cases.push(case(
                "no timestamp header",
                valid(kind, "Ev1").without("x-slack-request-timestamp"),
                401,
                "missing_timestamp",
            ));
            cases.push(case(
                "url_verification without a challenge",
                signed(kind, br#"{"type":"url_verification"}"#, b"", now()),
                400,
                "malformed_body",
            ));
            cases.push(case(
                "event_callback without an event_id",
                signed(
                    kind,
                    br#"{"type":"event_callback","event":{"type":"app_mention"}}"#,
                    b"",
                    now(),
                ),
                400,
                "missing_id",
            ));
        }
        Kind::Twilio => {
            cases.push(case(
                "bodySHA256 in the URL that does not match the body",
                {
                    let body = br#"{"note":"x"}"#;
                    let hash = hex::encode([0u8; 32]);
                    let path = format!("/hooks/twilio?bodySHA256={hash}");
                    let url = format!("{PUBLIC_BASE}{path}");
                    Raw::post(path, body.to_vec())
                        .header("content-type", "application/json")
                        .header(
                            "x-twilio-signature",
                            b64(&hmac1(kind.secret().as_bytes(), url.as_bytes())),
                        )
                },
                401,
                "bad_body_hash",
            ));
            cases.push(case(
                "bodySHA256 twice in the URL",
                Raw::post("/hooks/twilio?bodySHA256=a&bodySHA256=b", b"{}".to_vec())
                    .header("content-type", "application/json")
                    .header("x-twilio-signature", b64(&[0u8; 20])),
                401,
                "bad_body_hash",
            ));
            cases.push(case(
                "idempotency token that is not ASCII",
                valid(kind, "tw").set("i-twilio-idempotency-token", b"\xe9".to_vec()),
                400,
                "invalid_id",
            ));
        }
        Kind::GenericHmac => {
            cases.push(case(
                "no event type header",
                valid(kind, "ord_1").without("x-event-type"),
                400,
                "missing_kind",
            ));
            cases.push(case(
                "signed body without the id field",
                signed(kind, br#"{"total":1}"#, b"", now()),
                400,
                "missing_id",
            ));
        }
    }
    cases
}

/// Requests that name no mounted source or use the wrong method.
fn routing_corpus() -> Vec<Case> {
    let stripe = valid(Kind::Stripe, "evt_route");
    let mut wrong_method = stripe.clone();
    wrong_method.method = "PUT";
    let mut get = stripe.clone();
    get.method = "GET";
    vec![
        case(
            "unknown source",
            Raw {
                path: "/hooks/paypal".into(),
                ..stripe.clone()
            },
            404,
            "unknown_source",
        ),
        case(
            "source name with control characters (percent-encoded)",
            Raw {
                path: "/hooks/str%01ipe".into(),
                ..stripe.clone()
            },
            404,
            "unknown_source",
        ),
        case(
            "10 KB source name",
            Raw {
                path: format!("/hooks/{}", "s".repeat(10 * 1024)),
                ..stripe.clone()
            },
            404,
            "unknown_source",
        ),
        case("PUT to a hook", wrong_method, 405, "method_not_allowed"),
        case("GET of a hook", get, 405, "method_not_allowed"),
        case(
            "other path",
            Raw {
                path: "/../../etc/passwd".into(),
                ..stripe
            },
            404,
            "not_found",
        ),
    ]
}

async fn the_hostile_corpus_is_refused_and_nothing_is_written(backend: Backend) {
    let Some(h) = Harness::new(backend, Transport::Socket, record_everything(), all_sources).await
    else {
        return;
    };
    let addr = h.addr().expect("served over a socket");
    let health = Raw {
        method: "GET",
        ..Raw::post("/healthz", Vec::new())
    };
    // The valid form of each request is accepted: the corpus tests refusals,
    // not a receiver that refuses everything.
    for kind in Kind::ALL {
        let sanity = send_raw(addr, &valid(kind, "evt_sanity_check")).await;
        assert_eq!(sanity.status, 200, "{kind:?}: {}", sanity.json());
    }
    h.db.probe.execute("DELETE FROM tickmark_events").await;

    let mut cases: Vec<(String, Case)> = Vec::new();
    for kind in Kind::ALL {
        cases.extend(corpus(kind).into_iter().map(|c| (format!("{kind:?}"), c)));
    }
    cases.extend(routing_corpus().into_iter().map(|c| ("routing".into(), c)));
    let mut failures = Vec::new();
    for (group, case) in &cases {
        let reply = send_raw(addr, &case.request).await;
        let json = reply.json();
        let code_ok = match case.code {
            Some(code) => json["error"] == code && json["status"] == "rejected",
            None => true,
        };
        if reply.status != case.status || !code_ok {
            failures.push(format!(
                "{group}: {}: expected {} {:?}, got {} {}",
                case.name,
                case.status,
                case.code,
                reply.status,
                String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)])
            ));
        }
        let alive = send_raw(addr, &health).await;
        assert_eq!(
            alive.status,
            200,
            "{group}: {}: /healthz after it: {}",
            case.name,
            alive.json()
        );
        assert_eq!(
            h.event_rows().await,
            0,
            "{group}: {}: a refused request wrote a row",
            case.name
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} hostile requests got another answer:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

// Once per backend: the modules `sqlite` and `postgres`.
tickmark_tests::per_backend!(backend => [the_hostile_corpus_is_refused_and_nothing_is_written]);
