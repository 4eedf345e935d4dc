//! `shopsync` with payloads sealed and subjects recorded (docs/privacy.md),
//! answering Shopify's mandatory compliance topics: a real `shopsync`
//! process, real sockets, signed deliveries, a fake Admin API.
//!
//! No customer's email reaches the SQLite file. `customers/data_request`
//! answers with the customer's events and no one else's;
//! `customers/redact` erases the customer's events and the answer that
//! listed them, a redelivery of an erased order is a duplicate that calls
//! the Admin API no more, and another customer's events are untouched;
//! `shop/redact` erases every event of the shop and none of another's.

use serde_json::json;
use tickmark::privacy::{Keyring, Privacy, SubjectKey};
use tickmark::{Backend, Engine, Handlers};
use tickmark_tests::http_client::HttpClient;
use tickmark_tests::TestDb;

use crate::shopsync_one_body_two_topics::{settle, App, FakeAdminApi};

const KEYS: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const SUBJECT_KEY: &str = "QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";

const COOL_SHOP: &str = "cool-shop.myshopify.com";
const GONE_SHOP: &str = "gone-shop.myshopify.com";

/// Customers: (id, email, order, shop).
const ANNA: (u64, &str, u64, &str) = (191_167, "anna-5d1c@example.com", 8_000_001, COOL_SHOP);
const BORIS: (u64, &str, u64, &str) = (191_168, "boris-77e0@example.com", 8_000_002, COOL_SHOP);
const CLARA: (u64, &str, u64, &str) = (191_169, "clara-0b9f@example.com", 8_000_003, GONE_SHOP);

fn paid_order(customer: (u64, &str, u64, &str)) -> String {
    let (id, email, order, _) = customer;
    json!({
        "id": order,
        "email": email,
        "financial_status": "paid",
        "customer": { "id": id, "email": email },
        "line_items": [{"variant_id": 7, "quantity": 1}],
    })
    .to_string()
}

/// The SQLite file and its WAL, as bytes read as text.
fn at_rest(db: &TestDb) -> String {
    let path = db.url.trim_start_matches("sqlite://");
    let mut bytes = std::fs::read(path).expect("the SQLite file");
    if let Ok(wal) = std::fs::read(format!("{path}-wal")) {
        bytes.extend(wal);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// An engine with shopsync's keys, to read what it stored.
fn reader(db: &TestDb) -> Engine {
    Engine::new(db.store.clone(), Handlers::new())
        .unwrap()
        .with_privacy(
            Privacy::new()
                .with_keys(Keyring::parse(KEYS).unwrap())
                .with_subject_key(SubjectKey::parse(SUBJECT_KEY).unwrap()),
        )
}

async fn erased(db: &TestDb, webhook_id: &str) -> bool {
    db.record_of("shopify", webhook_id)
        .await
        .erased_at
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compliance_topics_answer_and_erase_one_customer_or_shop() {
    let db = TestDb::new(Backend::Sqlite).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (api_server, api) = FakeAdminApi::start().await;
    let env = [
        ("TICKMARK_KEYS", KEYS),
        ("TICKMARK_SUBJECT_KEY", SUBJECT_KEY),
    ];
    let mut app = App::start(dir.path(), &db.url, api_server.addr, &env).await;
    let client = HttpClient::new();

    for customer in [ANNA, BORIS, CLARA] {
        let (_, _, order, shop) = customer;
        let body = paid_order(customer);
        for topic in ["orders/create", "orders/paid"] {
            let id = format!("{}-{order}", topic.replace('/', "-"));
            assert_eq!(app.send_for(&client, shop, topic, &id, &body).await, "new");
        }
    }
    settle(&db, &app).await;
    let stored = at_rest(&db);
    for (_, email, ..) in [ANNA, BORIS, CLARA] {
        assert!(!stored.contains(email), "{email} is stored in clear");
    }

    // A data request: Anna's two events, opened, and nothing of Boris's.
    let request = json!({
        "shop_id": 1, "shop_domain": COOL_SHOP, "orders_requested": [ANNA.2],
        "customer": { "id": ANNA.0, "email": ANNA.1, "phone": "555-625-1199" },
        "data_request": { "id": 9999 },
    })
    .to_string();
    let topic = "customers/data_request";
    assert_eq!(
        app.send(&client, topic, "data-request-1", &request).await,
        "new"
    );
    settle(&db, &app).await;
    let answer = reader(&db)
        .event_status("shopify", "data-request-1")
        .await
        .unwrap()
        .unwrap();
    let output = answer.steps[0].output.clone().expect("an answer");
    assert_eq!(output["data_request_id"], 9999);
    let mut ids: Vec<&str> = output["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["orders-create-8000001", "orders-paid-8000001"]);
    assert!(!output.to_string().contains(BORIS.1));
    assert!(output.to_string().contains(ANNA.1));
    assert!(
        !at_rest(&db).contains(ANNA.1),
        "the answer is stored in clear"
    );

    // Anna's redaction: her events and the answer that listed them.
    let redact = json!({
        "shop_id": 1, "shop_domain": COOL_SHOP,
        "customer": { "id": ANNA.0, "email": ANNA.1, "phone": "555-625-1199" },
        "orders_to_redact": [ANNA.2],
    })
    .to_string();
    assert_eq!(
        app.send(&client, "customers/redact", "redact-1", &redact)
            .await,
        "new"
    );
    settle(&db, &app).await;
    for id in [
        "orders-create-8000001",
        "orders-paid-8000001",
        "data-request-1",
    ] {
        assert!(erased(&db, id).await, "{id} is not erased\n{}", app.log());
    }
    for id in ["orders-create-8000002", "orders-paid-8000002"] {
        assert!(!erased(&db, id).await, "{id}, Boris's, was erased");
    }
    let boris = reader(&db)
        .event_status("shopify", "orders-create-8000002")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(boris.record.event.payload["body"]["email"], BORIS.1);

    // Shopify redelivers Anna's order: a duplicate; nothing more is called.
    let calls_before = api.of(&ANNA.2.to_string());
    let body = paid_order(ANNA);
    let again = app
        .send(&client, "orders/create", "orders-create-8000001", &body)
        .await;
    assert_eq!(again, "duplicate");
    settle(&db, &app).await;
    assert_eq!(api.of(&ANNA.2.to_string()), calls_before);

    // The gone shop's redaction, 48 hours after uninstall: its events go,
    // the other shop's stay.
    let shop_redact = json!({ "shop_id": 2, "shop_domain": GONE_SHOP }).to_string();
    let status = app
        .send_for(
            &client,
            GONE_SHOP,
            "shop/redact",
            "shop-redact-1",
            &shop_redact,
        )
        .await;
    assert_eq!(status, "new");
    settle(&db, &app).await;
    for id in ["orders-create-8000003", "orders-paid-8000003"] {
        assert!(erased(&db, id).await, "{id} is not erased\n{}", app.log());
    }
    assert!(!erased(&db, "orders-paid-8000002").await);

    tickmark_tests::terminate::terminate(&mut app.child, "shopsync").await;
    api_server.shutdown().await;
}
