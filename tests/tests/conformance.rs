//! The store conformance suite, once per backend.

mod sqlite {
    tickmark_tests::conformance_suite!(tickmark::Backend::Sqlite);
}

mod postgres {
    tickmark_tests::conformance_suite!(tickmark::Backend::Postgres);
}

/// Cases only PostgreSQL needs: SQLite's write lock already serialises
/// every write transaction.
mod postgres_only {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_accept_waits_for_a_wait_being_decided_on_its_key() {
        let Some(db) = tickmark_tests::TestDb::new(tickmark::Backend::Postgres).await else {
            return;
        };
        tickmark_tests::conformance::waits::an_accept_waits_for_a_wait_being_decided_on_its_key(db)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_accept_racing_the_prune_of_its_key_is_a_duplicate() {
        let Some(db) = tickmark_tests::TestDb::new(tickmark::Backend::Postgres).await else {
            return;
        };
        tickmark_tests::conformance::tombstones::an_accept_racing_the_prune_of_its_key_is_a_duplicate(db)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_databases_key_hash_is_the_rust_one() {
        let Some(db) = tickmark_tests::TestDb::new(tickmark::Backend::Postgres).await else {
            return;
        };
        tickmark_tests::conformance::tombstones::the_databases_key_hash_is_the_rust_one(db).await;
    }
}
