//! The store conformance suite: every case runs against SQLite and PostgreSQL
//! (`tests/tests/it/conformance.rs` instantiates it once per backend with
//! [`conformance_suite!`](crate::conformance_suite)).

pub mod admin;
pub mod blame;
pub mod blame_suspects;
pub mod fair_share;
pub mod fencing;
pub mod flow;
pub mod inbox;
pub mod isolation;
pub mod long_handlers;
pub mod ordering;
pub mod portable_sql;
pub mod priorities;
pub mod reconcile;
pub mod replan;
pub mod retries;
pub mod running;
pub mod shutdown;
pub mod tombstones;
pub mod typed;
pub mod waits;

use std::time::Duration;

use tickmark::{Engine, Handlers, WorkerConfig};

use crate::TestDb;

/// An engine on `db` with `handlers` and the probe registered.
pub fn engine(db: &TestDb, handlers: Handlers) -> Engine {
    Engine::new(db.store.clone(), handlers)
        .expect("valid handlers")
        .with_resource(db.probe.clone())
}

/// Accept an empty `order.paid` event from `shop` with this id.
pub async fn order_paid(engine: &Engine, id: &str) -> tickmark::Accepted {
    engine
        .accept(tickmark::NewEvent::with_id(
            "shop",
            id,
            "order.paid",
            serde_json::json!({}),
        ))
        .await
        .expect("accept")
}

/// A worker configuration for tests: short lease, quick polling.
pub fn quick_worker(name: &str) -> WorkerConfig {
    WorkerConfig::default()
        .with_name(name)
        .with_lease(Duration::from_secs(2))
        .with_poll_every(Duration::from_millis(200))
        .with_grace(Duration::from_secs(1))
        .with_concurrency(4)
}

/// Expand to the whole suite once per backend, through
/// [`per_backend!`](crate::per_backend!): the tests `sqlite::<case>` and
/// `postgres::<case>`, each on a fresh database. The cases are named by
/// their module here (`inbox::…`), which the expansion brings into scope.
#[macro_export]
macro_rules! conformance_suite {
    () => {
        #[allow(unused_imports)]
        use $crate::conformance::*;
        $crate::per_backend!(fresh_db => [
            inbox::concurrent_duplicate_accepts_yield_one_new,
            inbox::a_duplicate_delivery_never_reruns_a_step,
            inbox::events_without_an_id_are_deduplicated_by_body_hash,
            inbox::an_event_without_handler_is_recorded_as_ignored,
            inbox::a_delayed_event_is_not_claimed_before_its_time,
            running::steps_run_in_order_with_keys_and_earlier_outputs,
            running::the_step_status_view_is_readable_with_plain_sql,
            running::a_transactional_steps_effect_commits_with_its_mark,
            running::a_crash_after_a_mark_resumes_at_the_first_unfinished_step,
            running::an_interrupted_step_is_shown_then_rerun_with_the_same_key,
            running::an_accepted_event_wakes_an_idle_worker_without_polling,
            running::a_claim_leases_many_events_at_once,
            running::a_step_longer_than_its_lease_keeps_it_by_heartbeat,
            blame::a_lease_lost_beside_others_is_refunded_and_one_held_alone_is_charged,
            fair_share::a_flooding_tenant_does_not_hold_back_another,
            fair_share::claims_follow_the_tenants_weights,
            fair_share::a_tenant_alone_gets_the_whole_batch,
            fair_share::an_idle_tenant_saves_no_slots_for_later,
            fair_share::events_without_a_tenant_are_claimed_beside_the_tenants,
            fair_share::a_weight_that_is_not_a_positive_number_is_refused,
            priorities::a_head_start_passes_younger_events_and_never_older_ones,
            priorities::a_head_start_never_runs_an_event_before_it_is_due,
            priorities::a_head_start_orders_a_tenants_own_events_within_its_share,
            blame::a_worker_runs_the_suspects_of_a_dead_batch_without_charging_them,
            blame_suspects::a_suspect_given_back_before_its_step_ran_stays_a_suspect,
            blame_suspects::a_suspect_no_claim_could_take_is_not_reported_waiting,
            blame_suspects::an_engine_under_a_steady_backlog_runs_its_suspect_alone_soon,
            fencing::a_taken_over_lease_can_neither_mark_nor_heartbeat,
            fencing::a_retried_mark_is_confirmed_only_while_its_lease_holds,
            fencing::an_expired_lease_cannot_mark_even_before_a_takeover,
            fencing::a_refused_transactional_mark_rolls_back_the_steps_writes,
            fencing::a_worker_that_loses_its_lease_stops_its_step,
            retries::a_failed_step_is_retried_on_a_stored_schedule_that_survives_a_restart,
            retries::the_event_is_dead_lettered_after_the_last_attempt,
            retries::a_terminal_failure_dead_letters_at_once,
            retries::a_step_that_kills_its_worker_every_time_is_dead_lettered,
            retries::a_panicking_step_is_a_retryable_failure,
            retries::an_unknown_step_type_parks_the_event,
            shutdown::shutdown_lets_a_running_step_finish_then_releases_the_event,
            shutdown::shutdown_past_the_grace_period_cancels_and_releases,
            long_handlers::a_step_that_times_out_is_a_retryable_failure,
            long_handlers::a_steps_own_retry_policy_overrides_the_handlers,
            long_handlers::progress_shows_in_the_step_status_table_while_the_step_runs,
            long_handlers::a_snoozed_step_runs_again_later_without_spending_an_attempt,
            long_handlers::a_delayed_event_runs_once_its_time_has_come,
            long_handlers::a_cancelled_event_stops_its_running_step_within_a_heartbeat,
            ordering::stale_events_are_recorded_and_never_applied,
            ordering::the_sequence_check_decides_staleness_per_resource,
            ordering::one_resource_runs_one_event_at_a_time_in_acceptance_order,
            ordering::a_source_limit_caps_concurrent_events,
            ordering::an_operator_retry_applies_a_stale_event,
            flow::an_empty_bucket_throttles_the_step_without_spending_an_attempt,
            flow::workers_on_one_database_share_each_bucket,
            flow::an_unknown_rate_limit_parks_the_event,
            flow::a_key_never_has_more_running_events_than_its_limit,
            flow::racing_claims_never_exceed_a_keys_limit,
            flow::workers_run_every_event_of_a_limited_key,
            flow::a_burst_of_one_key_runs_once_for_the_latest_event,
            flow::a_debounced_burst_keeps_the_newest_sequence,
            flow::a_started_event_is_not_superseded,
            flow::racing_accepts_of_one_key_leave_one_event_waiting,
            waits::a_waiting_event_holds_nothing_until_a_match_wakes_it,
            waits::a_match_accepted_before_the_wait_is_found,
            waits::a_match_older_than_the_lookback_is_not_found,
            waits::a_timeout_runs_the_timeout_branch,
            waits::a_timeout_without_a_timeout_branch_dead_letters,
            waits::a_match_racing_the_timeout_settles_one_outcome,
            waits::accepts_racing_the_start_of_waits_lose_no_wake_up,
            waits::a_durable_timer_survives_a_restart,
            waits::an_operator_feeds_or_times_out_a_wait_by_hand,
            admin::retry_from_a_step_keeps_earlier_steps_and_reruns_later_ones_with_the_same_keys,
            admin::retry_resumes_a_dead_event_at_its_failed_step_and_wakes_a_worker,
            admin::the_audit_trail_records_every_manual_action,
            admin::actions_are_refused_in_states_that_do_not_allow_them,
            admin::the_store_enforces_a_transition_the_rules_would_refuse,
            admin::cancelling_a_running_event_fences_its_worker,
            admin::a_worker_running_a_cancelled_event_stops_and_marks_nothing,
            admin::skipping_or_marking_done_the_last_step_finishes_the_event,
            admin::skipping_a_middle_step_runs_the_rest,
            admin::a_forced_retry_of_an_interrupted_event_fences_the_old_lease,
            admin::prune_deletes_only_finished_events_older_than_the_cutoff,
            replan::ignored_events_run_once_after_a_deploy_adds_their_handler,
            replan::a_replan_of_a_kind_without_a_handler_is_refused,
            tombstones::a_redelivery_of_a_pruned_event_is_a_duplicate_within_the_dedup_window,
            tombstones::a_pruned_events_replay_key_still_catches_a_replay,
            tombstones::an_event_older_than_the_dedup_window_leaves_no_tombstone,
            tombstones::a_batch_mixing_pruned_and_new_keys_answers_each,
            admin::status_counts_states_stuck_events_and_throughput,
            admin::events_are_listed_and_looked_up_by_number_or_key,
            portable_sql::a_transactional_step_written_once_runs_on_either_backend,
            portable_sql::an_engine_transaction_dropped_uncommitted_rolls_back,
            typed::a_payload_that_does_not_decode_parks_until_a_fixed_build_is_retried,
            typed::a_question_mark_on_a_serde_error_parks_after_one_attempt,
            typed::a_typed_output_is_read_only_when_declared,
            typed::a_read_of_a_missing_or_later_step_is_refused_by_engine_new,
            reconcile::a_first_reconcile_take_creates_the_row_with_fence_one,
            reconcile::a_live_reconcile_lease_refuses_every_other_take,
            reconcile::racing_reconcile_takes_grant_one,
            reconcile::an_expired_reconcile_lease_is_taken_over_and_fences_the_old_owner,
            reconcile::an_expired_reconcile_lease_cannot_advance_even_before_a_takeover,
            reconcile::a_reconcile_advance_moves_the_cursor_and_extends_the_lease,
            reconcile::a_reconcile_release_records_the_summary_and_frees_the_source,
            reconcile::a_reconcile_reset_waits_for_a_free_source_and_forgets_the_cursor,
            reconcile::reconcile_cursors_are_listed_in_byte_order_of_source,
        ]);
    };
}
