//! Reconciliation's storage: one cursor per source, and a lease that lets
//! one process at a time reconcile it, fenced as an event's lease is
//! (`crates/tickmark-driver/src/store/reconcile.rs`).

use std::time::Duration;

use chrono::{TimeZone, Utc};
use tickmark::{Backend, StoreError};
use tickmark_driver::store::{ReconcileCursor, ReconcileLease};

use crate::TestDb;

const LEASE: Duration = Duration::from_secs(30);

async fn take(db: &TestDb, source: &str, owner: &str) -> Option<ReconcileLease> {
    db.store
        .reconcile_lease_take(source, owner, LEASE)
        .await
        .expect("take")
}

async fn row(db: &TestDb, source: &str) -> ReconcileCursor {
    db.store
        .reconcile_cursors()
        .await
        .expect("cursors")
        .into_iter()
        .find(|row| row.source == source)
        .unwrap_or_else(|| panic!("a row for {source}"))
}

/// What a crashed reconciler's lease looks like once it has run out.
async fn expire(db: &TestDb, source: &str) {
    let sql = match db.backend() {
        Backend::Postgres => format!(
            "UPDATE tickmark_reconcile_cursors SET lease_until = now() - interval '1 second' \
             WHERE source = '{source}'"
        ),
        Backend::Sqlite => format!(
            "UPDATE tickmark_reconcile_cursors \
             SET lease_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 second') \
             WHERE source = '{source}'"
        ),
    };
    assert_eq!(db.probe.execute(&sql).await, 1, "{source} has a row");
}

fn assert_reconcile_lease_lost<T: std::fmt::Debug>(
    result: Result<T, StoreError>,
    source: &str,
    what: &str,
) {
    match result {
        Err(StoreError::ReconcileLeaseLost { source_name }) => {
            assert_eq!(source_name, source, "{what}")
        }
        other => panic!("{what}: expected ReconcileLeaseLost, got {other:?}"),
    }
}

/// The first take of a source creates its row, with fence 1 and the run's
/// start, and no cursor yet.
pub async fn a_first_reconcile_take_creates_the_row_with_fence_one(db: TestDb) {
    assert!(db.store.reconcile_cursors().await.unwrap().is_empty());
    let lease = take(&db, "stripe", "a").await.expect("granted");
    assert_eq!(
        lease,
        ReconcileLease {
            source: "stripe".into(),
            owner: "a".into(),
            fence: 1
        }
    );
    let row = row(&db, "stripe").await;
    assert_eq!(row.fence, 1);
    assert_eq!(row.lease_owner.as_deref(), Some("a"));
    let until = row.lease_until.expect("a lease");
    let started = row.last_run_started_at.expect("the run's start");
    assert!(until > started, "{until} > {started}");
    assert_eq!((row.cursor, row.cursor_at), (None, None));
    assert_eq!(
        (row.last_run_finished_at, row.last_summary),
        (None, None),
        "no run finished yet"
    );
}

/// While a lease is live, no one else takes the source, nor its holder
/// again (each run takes and gives back); other sources are free.
pub async fn a_live_reconcile_lease_refuses_every_other_take(db: TestDb) {
    take(&db, "stripe", "a").await.expect("granted");
    assert_eq!(take(&db, "stripe", "b").await, None, "b is refused");
    assert_eq!(
        take(&db, "stripe", "a").await,
        None,
        "the holder is refused too"
    );
    assert_eq!(
        row(&db, "stripe").await.fence,
        1,
        "a refusal changes nothing"
    );
    assert_eq!(row(&db, "stripe").await.lease_owner.as_deref(), Some("a"));
    let other = take(&db, "github", "b")
        .await
        .expect("another source is free");
    assert_eq!(other.fence, 1);
}

/// Racing takes of one free source: exactly one is granted.
pub async fn racing_reconcile_takes_grant_one(db: TestDb) {
    let takes = (0..8).map(|i| {
        let store = db.store.clone();
        tokio::spawn(async move {
            store
                .reconcile_lease_take("stripe", &format!("owner-{i}"), LEASE)
                .await
                .expect("take")
        })
    });
    let mut granted = Vec::new();
    for take in takes.collect::<Vec<_>>() {
        if let Some(lease) = take.await.unwrap() {
            granted.push(lease);
        }
    }
    assert_eq!(granted.len(), 1, "{granted:?}");
    let row = row(&db, "stripe").await;
    assert_eq!(row.fence, 1);
    assert_eq!(row.lease_owner, Some(granted[0].owner.clone()));
}

/// After a lease expires another owner takes it with a higher fence, and
/// the first owner's advance, extend and release are refused and change
/// nothing: the cursor stays the new owner's.
pub async fn an_expired_reconcile_lease_is_taken_over_and_fences_the_old_owner(db: TestDb) {
    let old = take(&db, "stripe", "a").await.expect("granted");
    db.store
        .reconcile_cursor_advance(&old, "evt_1", None, LEASE)
        .await
        .unwrap();
    expire(&db, "stripe").await;
    let new = take(&db, "stripe", "b")
        .await
        .expect("an expired lease is free");
    assert!(new.fence > old.fence, "{new:?} after {old:?}");
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap();
    db.store
        .reconcile_cursor_advance(&new, "evt_2", Some(at), LEASE)
        .await
        .unwrap();
    let before = row(&db, "stripe").await;

    assert_reconcile_lease_lost(
        db.store
            .reconcile_cursor_advance(&old, "evt_old", None, LEASE)
            .await,
        "stripe",
        "the old owner's advance",
    );
    assert_reconcile_lease_lost(
        db.store.reconcile_lease_extend(&old, LEASE).await,
        "stripe",
        "the old owner's extend",
    );
    assert_reconcile_lease_lost(
        db.store
            .reconcile_lease_release(&old, Some(r#"{"old":true}"#))
            .await,
        "stripe",
        "the old owner's release",
    );
    let after = row(&db, "stripe").await;
    assert_eq!(after, before, "the old owner changed nothing");
    assert_eq!(after.cursor.as_deref(), Some("evt_2"));
    assert_eq!(after.cursor_at, Some(at));
    assert_eq!(after.lease_owner.as_deref(), Some("b"));
}

/// An expired lease no one took yet can neither move the cursor nor be
/// extended: the run must stop (and may still give it back).
pub async fn an_expired_reconcile_lease_cannot_advance_even_before_a_takeover(db: TestDb) {
    let lease = take(&db, "stripe", "a").await.expect("granted");
    expire(&db, "stripe").await;
    assert_reconcile_lease_lost(
        db.store
            .reconcile_cursor_advance(&lease, "evt_1", None, LEASE)
            .await,
        "stripe",
        "an advance on an expired lease",
    );
    assert_reconcile_lease_lost(
        db.store.reconcile_lease_extend(&lease, LEASE).await,
        "stripe",
        "an extend of an expired lease",
    );
    assert_eq!(row(&db, "stripe").await.cursor, None);
    db.store
        .reconcile_lease_release(&lease, None)
        .await
        .expect("no take came since: the lease is still its to give back");
    assert_eq!(row(&db, "stripe").await.lease_owner, None);
}

/// An advance moves the cursor and its time and extends the lease; an
/// extend moves only the lease; both show in `reconcile_cursors`.
pub async fn a_reconcile_advance_moves_the_cursor_and_extends_the_lease(db: TestDb) {
    let lease = take(&db, "stripe", "a").await.expect("granted");
    let taken_until = row(&db, "stripe").await.lease_until.unwrap();
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 6, 31, 34).unwrap();
    db.store
        .reconcile_cursor_advance(&lease, "evt_1", Some(at), Duration::from_secs(600))
        .await
        .unwrap();
    let advanced = row(&db, "stripe").await;
    assert_eq!(advanced.cursor.as_deref(), Some("evt_1"));
    assert_eq!(advanced.cursor_at, Some(at));
    let advanced_until = advanced.lease_until.unwrap();
    assert!(
        advanced_until > taken_until + chrono::Duration::seconds(500),
        "{advanced_until} after {taken_until}"
    );
    assert_eq!(advanced.fence, lease.fence, "an advance keeps the fence");

    db.store
        .reconcile_lease_extend(&lease, Duration::from_secs(1200))
        .await
        .unwrap();
    let extended = row(&db, "stripe").await;
    assert!(extended.lease_until.unwrap() > advanced_until + chrono::Duration::seconds(500));
    assert_eq!(
        extended.cursor.as_deref(),
        Some("evt_1"),
        "extend keeps the cursor"
    );
    assert_eq!(extended.cursor_at, Some(at));

    db.store
        .reconcile_cursor_advance(&lease, "evt_2", None, LEASE)
        .await
        .unwrap();
    let moved = row(&db, "stripe").await;
    assert_eq!(moved.cursor.as_deref(), Some("evt_2"));
    assert_eq!(
        moved.cursor_at, None,
        "the cursor and its time move together"
    );
}

/// A release records the run's summary and end, frees the source for
/// another owner at once, keeps the cursor, and cannot be repeated.
pub async fn a_reconcile_release_records_the_summary_and_frees_the_source(db: TestDb) {
    let lease = take(&db, "stripe", "a").await.expect("granted");
    db.store
        .reconcile_cursor_advance(&lease, "evt_9", None, LEASE)
        .await
        .unwrap();
    let summary = r#"{"listed":3,"accepted":1,"duplicates":2}"#;
    db.store
        .reconcile_lease_release(&lease, Some(summary))
        .await
        .unwrap();
    let released = row(&db, "stripe").await;
    assert_eq!(released.last_summary.as_deref(), Some(summary));
    assert!(released.last_run_finished_at.is_some());
    assert_eq!((released.lease_owner, released.lease_until), (None, None));
    assert_eq!(released.cursor.as_deref(), Some("evt_9"));

    assert_reconcile_lease_lost(
        db.store.reconcile_lease_release(&lease, None).await,
        "stripe",
        "a second release",
    );
    let next = take(&db, "stripe", "b").await.expect("free at once");
    assert_eq!(next.fence, lease.fence + 1);
    assert_eq!(
        row(&db, "stripe").await.last_summary.as_deref(),
        Some(summary)
    );
}

/// A reset is refused while a live lease is held, forgets the cursor when
/// the source is free, and fences off the holder of an expired lease.
pub async fn a_reconcile_reset_waits_for_a_free_source_and_forgets_the_cursor(db: TestDb) {
    assert!(
        db.store.reconcile_cursor_reset("unknown").await.unwrap(),
        "nothing to forget"
    );
    let lease = take(&db, "stripe", "a").await.expect("granted");
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 6, 0, 0).unwrap();
    db.store
        .reconcile_cursor_advance(&lease, "evt_1", Some(at), LEASE)
        .await
        .unwrap();
    let leased = row(&db, "stripe").await;
    assert!(
        !db.store.reconcile_cursor_reset("stripe").await.unwrap(),
        "refused while leased"
    );
    assert_eq!(
        row(&db, "stripe").await,
        leased,
        "a refused reset changes nothing"
    );

    db.store
        .reconcile_lease_release(&lease, Some("{}"))
        .await
        .unwrap();
    assert!(db.store.reconcile_cursor_reset("stripe").await.unwrap());
    let reset = row(&db, "stripe").await;
    assert_eq!((reset.cursor, reset.cursor_at), (None, None));
    assert_eq!(
        reset.last_summary.as_deref(),
        Some("{}"),
        "the last run stays"
    );

    let expired = take(&db, "stripe", "b").await.expect("granted");
    db.store
        .reconcile_cursor_advance(&expired, "evt_2", None, LEASE)
        .await
        .unwrap();
    expire(&db, "stripe").await;
    assert!(
        db.store.reconcile_cursor_reset("stripe").await.unwrap(),
        "an expired lease does not hold a reset back"
    );
    assert_reconcile_lease_lost(
        db.store.reconcile_lease_release(&expired, None).await,
        "stripe",
        "the expired holder's release after a reset",
    );
    let after = row(&db, "stripe").await;
    assert_eq!(after.cursor, None);
    assert_eq!(after.lease_owner, None);
}

/// `reconcile_cursors` lists every source in byte order, on both backends.
pub async fn reconcile_cursors_are_listed_in_byte_order_of_source(db: TestDb) {
    for source in ["stripe", "github", "Shopify"] {
        take(&db, source, "a").await.expect("granted");
    }
    let sources: Vec<String> = db
        .store
        .reconcile_cursors()
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.source)
        .collect();
    assert_eq!(sources, ["Shopify", "github", "stripe"]);
}
