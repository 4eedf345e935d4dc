//! The store conformance suite, once per backend.

// The modules `sqlite` and `postgres`.
tickmark_tests::conformance_suite!();

/// Cases only PostgreSQL needs: SQLite's write lock already serialises
/// every write transaction.
mod postgres_only {
    use tickmark_tests::conformance::isolation;

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
    async fn the_accepts_check_reads_unanalyzed_tombstones_by_key() {
        let Some(db) = tickmark_tests::TestDb::new(tickmark::Backend::Postgres).await else {
            return;
        };
        tickmark_tests::conformance::tombstones::the_accepts_check_reads_unanalyzed_tombstones_by_key(db)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_databases_key_hash_is_the_rust_one() {
        let Some(db) = tickmark_tests::TestDb::new(tickmark::Backend::Postgres).await else {
            return;
        };
        tickmark_tests::conformance::tombstones::the_databases_key_hash_is_the_rust_one(db).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_reads_committed_whatever_the_sessions_default() {
        let Some(db) = tickmark_tests::TestDb::new(tickmark::Backend::Postgres).await else {
            return;
        };
        tickmark_tests::conformance::isolation::the_store_reads_committed_whatever_the_sessions_default(db, "read committed")
            .await;
    }

    tickmark_tests::per_backend!(db from tickmark_tests::TestDb::new(tickmark::Backend::Postgres) => [
        isolation::every_function_pins_its_search_path,
        isolation::the_claim_reads_its_schemas_tables_whatever_the_sessions_search_path,
    ]);
}

/// The cases whose answers rely on READ COMMITTED, on a database whose
/// connections default to REPEATABLE READ (as `ALTER ROLE … SET
/// default_transaction_isolation` would make them): tickmark sets its own
/// level, so they pass unchanged (crates/tickmark-postgres/src/isolation.rs).
mod postgres_repeatable_read {
    use tickmark_tests::conformance::{fencing, flow, inbox, running, tombstones, waits};

    async fn repeatable_read() -> Option<tickmark_tests::TestDb> {
        tickmark_tests::TestDb::postgres_with_settings(&[(
            "default_transaction_isolation",
            "repeatable read",
        )])
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_reads_committed_whatever_the_sessions_default() {
        let Some(db) = repeatable_read().await else {
            return;
        };
        tickmark_tests::conformance::isolation::the_store_reads_committed_whatever_the_sessions_default(db, "repeatable read")
            .await;
    }

    tickmark_tests::per_backend!(db from repeatable_read() => [
        tombstones::an_accept_racing_the_prune_of_its_key_is_a_duplicate,
        tombstones::a_redelivery_of_a_pruned_event_is_a_duplicate_within_the_dedup_window,
        tombstones::a_batch_mixing_pruned_and_new_keys_answers_each,
        inbox::concurrent_duplicate_accepts_yield_one_new,
        inbox::a_duplicate_delivery_never_reruns_a_step,
        inbox::events_without_an_id_are_deduplicated_by_body_hash,
        inbox::a_delayed_event_is_not_claimed_before_its_time,
        running::steps_run_in_order_with_keys_and_earlier_outputs,
        running::a_transactional_steps_effect_commits_with_its_mark,
        running::a_crash_after_a_mark_resumes_at_the_first_unfinished_step,
        running::a_claim_leases_many_events_at_once,
        fencing::a_taken_over_lease_can_neither_mark_nor_heartbeat,
        fencing::a_retried_mark_is_confirmed_only_while_its_lease_holds,
        fencing::a_refused_transactional_mark_rolls_back_the_steps_writes,
        flow::racing_claims_never_exceed_a_keys_limit,
        flow::a_key_never_has_more_running_events_than_its_limit,
        flow::racing_accepts_of_one_key_leave_one_event_waiting,
        waits::accepts_racing_the_start_of_waits_lose_no_wake_up,
        waits::an_accept_waits_for_a_wait_being_decided_on_its_key,
    ]);
}
