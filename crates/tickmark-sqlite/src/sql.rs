//! The SQLite store's statements. SQLite has no data-modifying CTEs, so a
//! transition is an event update (filtering on state and fencing token) and, if
//! it changed a row, a step upsert, in one `BEGIN IMMEDIATE` transaction.

/// Insert unless the dedup key (or the replay key, when given) exists; the
/// unique indexes are the judge. `ON CONFLICT DO NOTHING` without a target
/// covers every unique index: both keys are decided by this one statement.
pub const EVENT_INSERT: &str = "
    INSERT INTO tickmark_events
        (source, dedup_key, kind, payload, plan, state, step_count, due_at, received_at,
         resource_key, resource_seq, replay_key, limit_key, limit_n, tenant_key, head_start_ms,
         traceparent, tracestate, subjects)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)
    ON CONFLICT DO NOTHING
    RETURNING id";

/// Whether a tombstone says an event with these keys (?2 its dedup key's
/// hash, ?3 its replay key's or NULL) of source ?1 was accepted before and
/// pruned. Asked inside the write transaction, before the insert.
pub const TOMBSTONED: &str = "
    SELECT 1 FROM tickmark_tombstones WHERE source = ?1 AND key_hash IN (?2, ?3) LIMIT 1";

/// Which due events a claim may take (`?1` now, `?3`/`?4` the sources and
/// kinds to skip, `?5` alone, `?6` pending): one text, in every statement
/// that chooses for a claim, so a suspect is reported waiting
/// ([`EVENT_SUSPECT_WAITS`]) only when a claim alone could take it. A
/// suspect (marked so, or an expired lease that was held alone or whose
/// step was interrupted before) only for a claim alone; a pending event if
/// `?6`; an expired batch lease on its second chance for a batch claim, or
/// a claim alone that takes pending events too. An ordered event waits
/// while an earlier event of its resource is unfinished, a limited event
/// while its key is full (the caller keeps a batch within the limit).
macro_rules! claimable {
    () => {
        claimable!("")
    };
    // `$also`: one more condition on `e` (a fair claim's tenant).
    ($also:literal) => {
        concat!(
            "
    FROM tickmark_events AS e
    WHERE e.state IN ('pending', 'running') AND e.rank_at <= ?1 AND e.due_at <= ?1
      AND CASE WHEN e.suspect OR (e.state = 'running' AND (e.claimed_alone OR e.interrupted > 0))
                    THEN ?5
               WHEN e.state = 'pending' THEN ?6
               ELSE ?6 OR NOT ?5 END
      AND e.source NOT IN (SELECT value FROM json_each(?3))
      AND (e.source || char(31) || e.kind) NOT IN (SELECT value FROM json_each(?4))
      AND NOT EXISTS (
          SELECT 1 FROM tickmark_events AS earlier
          WHERE earlier.resource_key = e.resource_key AND earlier.id < e.id
            AND earlier.state IN ('pending', 'running'))
      AND (e.limit_key IS NULL OR (
          SELECT count(*) FROM tickmark_events AS r
          WHERE r.limit_key = e.limit_key AND r.state = 'running' AND r.due_at > ?1) < e.limit_n)
      ",
            $also,
            "
    ORDER BY e.rank_at, e.id"
        )
    };
}

/// What a claim reads of each due event: `held` counts a limited event's
/// key's running events.
macro_rules! due_columns {
    () => {
        "SELECT e.id, e.state, e.limit_key, e.limit_n,
           CASE WHEN e.limit_key IS NULL THEN 0 ELSE
               (SELECT count(*) FROM tickmark_events AS r
                WHERE r.limit_key = e.limit_key AND r.state = 'running' AND r.due_at > ?1)
           END AS held, e.tenant_key, e.rank_at"
    };
}

/// The due time of the first event a claim may take, read without the
/// write lock: whether anything is due (`?2` is unused, so that this takes
/// the parameters of [`EVENT_DUE`]).
pub const EVENT_ANY_DUE: &str = concat!(
    "SELECT e.due_at",
    claimable!(),
    "
    LIMIT CASE WHEN ?2 > 0 THEN 1 ELSE 0 END"
);

/// The due events, walking `tickmark_events_rank` (the due time less a
/// handler's head start: migration 0013) in order (inside the write
/// transaction, so no other writer can claim them in between), at most `?2`.
pub const EVENT_DUE: &str = concat!(
    due_columns!(),
    claimable!(),
    "
    LIMIT ?2"
);

/// The due events of tenant `?7` a batch claim may take, in due order, at
/// most `?2` (a fair claim: `fair.rs`).
pub const EVENT_DUE_OF_TENANT: &str = concat!(
    due_columns!(),
    claimable!("AND e.tenant_key = ?7"),
    "
    LIMIT ?2"
);

/// Whether an unfinished event has a tenant: claims are then fair. (The
/// tenant index, named: an empty one answers at once, however long the
/// backlog of events without a tenant.)
pub const EVENT_ANY_TENANT: &str = "
    SELECT 1 FROM tickmark_events INDEXED BY tickmark_events_tenant
    WHERE state IN ('pending', 'running') AND tenant_key IS NOT NULL
    LIMIT 1";

/// The first tenant with an event due at `?1`: where a walk over the
/// tenant index starts ([`TENANT_NEXT_DUE`] goes on). The index is named:
/// left to choose, SQLite walked the due index and sorted every due event.
pub const TENANT_FIRST_DUE: &str = "
    SELECT tenant_key FROM tickmark_events INDEXED BY tickmark_events_tenant
    WHERE state IN ('pending', 'running') AND tenant_key IS NOT NULL
      AND rank_at <= ?1 AND due_at <= ?1
    ORDER BY tenant_key
    LIMIT 1";

/// The first tenant after `?2` with an event due at `?1` (a range of the
/// tenant index: `?2 IS NULL OR …` here would read all of it).
pub const TENANT_NEXT_DUE: &str = "
    SELECT tenant_key FROM tickmark_events INDEXED BY tickmark_events_tenant
    WHERE state IN ('pending', 'running') AND tenant_key > ?2
      AND rank_at <= ?1 AND due_at <= ?1
    ORDER BY tenant_key
    LIMIT 1";

/// A tenant's weight and virtual time (none: weight 1, at the clock).
pub const TENANT_WEIGHT: &str = "SELECT weight, pass FROM tickmark_tenants WHERE tenant_key = ?1";

/// The fleet's virtual time.
pub const FAIR_CLOCK: &str = "SELECT virtual_time FROM tickmark_fair_clock";

/// Charge tenant `?1` for `?3` events claimed from `?2` (the clock, or its
/// virtual time if later); answers the start of its last one.
pub const TENANT_CHARGE: &str = "
    INSERT INTO tickmark_tenants (tenant_key, pass) VALUES (?1, ?2 + ?3)
    ON CONFLICT (tenant_key) DO UPDATE SET pass = max(pass, ?2) + ?3 / weight
    RETURNING pass - 1.0 / weight";

/// Move the clock to `?1` if that is later.
pub const FAIR_CLOCK_MOVE: &str =
    "UPDATE tickmark_fair_clock SET virtual_time = ?1 WHERE virtual_time < ?1";

/// Lease the chosen events with new fencing tokens; a running row here had an
/// expired lease, so this claim takes it over: every claim counts a run,
/// and a run lost beside others (not held alone) is counted `interrupted`,
/// refunded (docs/guarantees.md, exact blame). A suspect taken (only a
/// claim alone takes one) stays one until its step is marked, whatever
/// gives it back before.
pub const EVENT_CLAIM: &str = "
    UPDATE tickmark_events
    SET state = 'running',
        lease_owner = ?1,
        lease_token = lease_token + 1,
        due_at = ?2,
        attempt = attempt + 1,
        interrupted = interrupted + CASE WHEN state = 'running' AND NOT claimed_alone THEN 1 ELSE 0 END,
        claimed_alone = ?5,
        suspect = suspect OR (state = 'running' AND (claimed_alone OR interrupted > 0)),
        step_started_at = ?3,
        progress = NULL,
        progress_message = NULL,
        snoozed = 0,
        throttled_by = NULL,
        takeovers = takeovers + (state = 'running'),
        last_error = CASE WHEN state = 'running'
            THEN 'interrupted: the lease of ' || coalesce(lease_owner, 'a worker')
                 || ' expired before step ' || next_step
                 || ' was marked; re-running it with the same idempotency key'
            ELSE last_error END
    WHERE id IN (SELECT value FROM json_each(?4))
    RETURNING id, source, dedup_key, kind, payload, received_at, plan, next_step, attempt,
              interrupted, lease_token, resource_key, resource_seq, traceparent, tracestate";

/// Extend every lease still held under its token; an expired lease is not revived.
pub const EVENT_HEARTBEAT_MANY: &str = "
    UPDATE tickmark_events
    SET due_at = ?1
    WHERE state = 'running' AND due_at > ?2
      AND (id, lease_token) IN (
          SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?3))
    RETURNING id";

/// Hand a leased event back, due at ?3 (refunding the attempt when ?4; ?5
/// marks a snooze, ?6 says why).
pub const EVENT_RELEASE: &str = "
    UPDATE tickmark_events
    SET state = 'pending', due_at = ?3,
        attempt = CASE WHEN ?4 THEN max(attempt - 1, 0) ELSE attempt END,
        snoozed = ?5, last_error = coalesce(?6, last_error), throttled_by = ?7,
        progress = NULL, progress_message = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running'";

/// Take one token from a bucket (GCRA; see the PostgreSQL statement): `?2`
/// is now in µs, `?3` the refill in µs, `?4` the burst. Returns the new
/// arrival time when a token was taken, no row when the bucket is empty.
pub const RATE_TAKE: &str = "
    INSERT INTO tickmark_rate_buckets AS b (bucket, tat_us) VALUES (?1, ?2 + ?3)
    ON CONFLICT (bucket) DO UPDATE
    SET tat_us = max(b.tat_us, ?2) + ?3
    WHERE max(b.tat_us, ?2) + ?3 - ?2 <= ?4 * ?3
    RETURNING tat_us";

/// The bucket was empty: a place in the line of waiting steps (see the
/// PostgreSQL statement); `?2` is now in µs. Answers µs from now.
pub const RATE_WAIT: &str = "
    UPDATE tickmark_rate_buckets
    SET wait_us = max(wait_us + ?3, tat_us - (?4 - 1) * ?3)
    WHERE bucket = ?1
    RETURNING wait_us - ?2";

/// What the running step reports, under its live lease (?5 is now).
pub const EVENT_PROGRESS: &str = "
    UPDATE tickmark_events SET progress = ?3, progress_message = ?4
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND due_at > ?5";

/// Make ?3 the last applied sequence of resource ?2 if it is newer (or already
/// this event's: a resumed run), under the event's lease ?5. Returns a row only when it is.
pub const RESOURCE_APPLY: &str = "
    INSERT INTO tickmark_resources (resource_key, last_seq, event_seq, applied_at)
    SELECT ?2, ?3, ?1, ?4
    -- Only under the event's lease: a stale holder changes nothing.
    WHERE EXISTS (SELECT 1 FROM tickmark_events
                  WHERE id = ?1 AND lease_token = ?5 AND state = 'running')
    ON CONFLICT (resource_key) DO UPDATE
    SET last_seq = excluded.last_seq, event_seq = excluded.event_seq, applied_at = excluded.applied_at
    WHERE tickmark_resources.last_seq < excluded.last_seq
       OR (tickmark_resources.last_seq = excluded.last_seq
           AND tickmark_resources.event_seq = excluded.event_seq)
    RETURNING last_seq";

/// The last applied sequence of a resource.
pub const RESOURCE_LAST: &str = "SELECT last_seq FROM tickmark_resources WHERE resource_key = ?1";

/// Record a leased event as stale: recorded, never applied.
pub const EVENT_MARK_STALE: &str = "
    UPDATE tickmark_events
    SET state = 'stale', finished_at = ?4, last_error = ?3, attempt = max(attempt - 1, 0)
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running'";

/// Park a leased event whose plan this build cannot run.
pub const EVENT_PARK: &str = "
    UPDATE tickmark_events
    SET state = 'parked', last_error = ?3, finished_at = ?4, attempt = max(attempt - 1, 0)
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running'";

/// When the suspect a claim alone would take now fell due (no row: none),
/// bound as such a claim is: `?1` now, `?2` = 1, no sources or kinds
/// skipped (`?3`, `?4` = `[]`: a worker claims alone only holding nothing),
/// `?5` alone, `?6` false (suspects only). [`EVENT_ANY_DUE`] itself: what a
/// claim alone could take, and nothing it could not.
pub const EVENT_SUSPECT_WAITS: &str = EVENT_ANY_DUE;

/// The earliest active row's due time. The index is in rank order (due
/// time less head start, never after the due time): the earliest due time
/// is among the rows ranked no later than the first row's due time (for
/// events without head starts, the first row).
pub const EVENT_NEXT_DUE: &str = "
    SELECT min(due_at) FROM tickmark_events
    WHERE state IN ('pending', 'running')
      AND rank_at <= (SELECT f.due_at FROM tickmark_events AS f
                      WHERE f.state IN ('pending', 'running')
                      ORDER BY f.rank_at, f.id LIMIT 1)
    HAVING count(*) > 0";

/// Running events, and pending ones except those waiting at a wait step whose
/// deadline (after `?1`, now) has not come and that no match has woken.
pub const EVENT_COUNT_ACTIVE: &str = "
    SELECT count(*) FROM tickmark_events
    WHERE state = 'running'
       OR (state = 'pending' AND (wait_until IS NULL OR due_at <= ?1))";

/// Events per state, and superseded events per (source, kind), in one scan.
pub const EVENT_COUNT_BY_STATE: &str = "
    SELECT state,
           CASE WHEN state = 'superseded' THEN source END AS source,
           CASE WHEN state = 'superseded' THEN kind END AS kind,
           count(*)
    FROM tickmark_events GROUP BY 1, 2, 3 ORDER BY 1, 2, 3";

/// Running events whose lease expired (their worker died or stalled).
pub const EVENT_COUNT_STUCK: &str =
    "SELECT count(*) FROM tickmark_events WHERE state = 'running' AND rank_at <= ?1 AND due_at <= ?1";

/// The due time of the oldest due pending event.
pub const EVENT_OLDEST_PENDING: &str = "
    SELECT min(due_at) FROM tickmark_events
    WHERE state = 'pending' AND rank_at <= ?1 AND due_at <= ?1";

/// One event by row number.
pub const EVENT_GET: &str = "
    SELECT id, source, dedup_key, kind, payload, received_at, state, step_count, next_step,
           attempt, due_at, lease_owner, lease_token, takeovers, interrupted, last_error, finished_at,
           traceparent, tracestate, erased_at
    FROM tickmark_events WHERE id = ?1";

/// One event by dedup key.
pub const EVENT_FIND: &str = "
    SELECT id, source, dedup_key, kind, payload, received_at, state, step_count, next_step,
           attempt, due_at, lease_owner, lease_token, takeovers, interrupted, last_error, finished_at,
           traceparent, tracestate, erased_at
    FROM tickmark_events WHERE source = ?1 AND dedup_key = ?2";

/// One event by its replay key (unique per source, like the dedup key).
pub const EVENT_FIND_BY_REPLAY_KEY: &str = "
    SELECT id, source, dedup_key, kind, payload, received_at, state, step_count, next_step,
           attempt, due_at, lease_owner, lease_token, takeovers, interrupted, last_error, finished_at,
           traceparent, tracestate, erased_at
    FROM tickmark_events WHERE source = ?1 AND replay_key = ?2";

/// Outputs of the done steps, for resuming.
pub const STEP_OUTPUTS: &str = "
    SELECT position, output FROM tickmark_steps
    WHERE event_seq = ?1 AND state IN ('done', 'skipped')
    ORDER BY position";

/// Advance the event past step ?3 under lease (?1, ?2); the last step's mark
/// finishes the event. Filters on state, token, position and an unexpired lease.
pub const EVENT_ADVANCE: &str = "
    UPDATE tickmark_events
    SET next_step = next_step + 1,
        state = CASE WHEN next_step + 1 >= step_count THEN 'done' ELSE 'running' END,
        attempt = CASE WHEN next_step + 1 >= step_count THEN attempt ELSE 1 END,
        interrupted = CASE WHEN next_step + 1 >= step_count THEN interrupted ELSE 0 END,
        suspect = 0,
        finished_at = CASE WHEN next_step + 1 >= step_count THEN ?4 END,
        step_started_at = ?4,
        last_error = NULL,
        progress = NULL,
        progress_message = NULL
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND next_step = ?3
      AND due_at > ?4";

/// Record step ?2 done with its output.
pub const STEP_UPSERT_DONE: &str = "
    INSERT INTO tickmark_steps
        (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output)
    VALUES (?1, ?2, ?3, CASE WHEN ?9 THEN 'skipped' ELSE 'done' END, ?4, ?5, ?6, ?7, ?8)
    ON CONFLICT (event_seq, position) DO UPDATE
    SET state = excluded.state, attempts = excluded.attempts, lease_token = excluded.lease_token,
        started_at = excluded.started_at, finished_at = excluded.finished_at,
        output = excluded.output, last_error = NULL";

/// A failed attempt under lease (?1, ?2): dead-letter when ?5, else schedule
/// the retry at ?6.
pub const EVENT_FAIL: &str = "
    UPDATE tickmark_events
    SET state = CASE WHEN ?5 THEN 'dead' ELSE 'pending' END,
        due_at = ?6,
        last_error = ?7,
        attempt = ?8,
        suspect = 0,
        progress = NULL,
        progress_message = NULL,
        finished_at = CASE WHEN ?5 THEN ?4 END
    WHERE id = ?1 AND lease_token = ?2 AND state = 'running' AND next_step = ?3
      AND due_at > ?4";

/// Record the failed attempt of step ?2.
pub const STEP_UPSERT_FAILED: &str = "
    INSERT INTO tickmark_steps
        (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, last_error)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
    ON CONFLICT (event_seq, position) DO UPDATE
    SET state = excluded.state, attempts = excluded.attempts, lease_token = excluded.lease_token,
        started_at = excluded.started_at, finished_at = excluded.finished_at,
        last_error = excluded.last_error";

/// Events waiting at a wait step (for another event, or a time).
pub const EVENT_COUNT_WAITING: &str =
    "SELECT count(*) FROM tickmark_events WHERE state = 'pending' AND wait_until IS NOT NULL";

/// Whether a mark that changed nothing had been applied under this token,
/// which the event still holds: a retried mark whose lease moved on since
/// (a takeover, an operator) is `LeaseLost`, so its worker stops (found by
/// the simulator: seed 100038).
pub const STEP_MARK_CONFIRM: &str = "
    SELECT 1 FROM tickmark_steps AS s
    JOIN tickmark_events AS e ON e.id = s.event_seq AND e.lease_token = s.lease_token
    WHERE s.event_seq = ?1 AND s.position = ?2 AND s.lease_token = ?3 AND s.state = ?4";

/// The step-status table of one event.
pub const STEP_STATUS: &str = "
    SELECT position, step, idempotency_key, state, attempts, started_at, finished_at, retry_at,
           lease_until, worker, last_error, output, progress, progress_message
    FROM tickmark_step_status
    WHERE event_seq = ?1
    ORDER BY position";

/// Distinct plans of events that may still run.
pub const PLANS_UNFINISHED: &str = "
    SELECT plan, count(*) AS events, min(id) AS example
    FROM tickmark_events
    WHERE state IN ('pending', 'running', 'dead', 'parked')
    GROUP BY plan
    ORDER BY min(id)";

/// Insert a debounced event (scheduled by [`DEBOUNCE_SCHEDULE`] once the
/// burst is decided); `?7` is now.
pub const DEBOUNCE_INSERT: &str = "
    INSERT INTO tickmark_events
        (source, dedup_key, kind, payload, plan, state, step_count, due_at, received_at,
         resource_key, resource_seq, replay_key, limit_key, limit_n, debounce_key,
         burst_started_at, tenant_key, head_start_ms, traceparent, tracestate, subjects)
    VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?7, ?14, ?15,
            ?16, ?17, ?18)
    ON CONFLICT DO NOTHING
    RETURNING id";

/// The key's other events that have not started (inside the write
/// transaction: no claim can take one meanwhile).
pub const DEBOUNCE_WAITING: &str = "
    SELECT id, resource_seq, burst_started_at FROM tickmark_events
    WHERE debounce_key = ?1 AND state = 'pending' AND next_step = 0 AND attempt = 0
      AND wait_until IS NULL AND id <> ?2
    ORDER BY id";

/// Coalesce: the burst's other events (a JSON list) end `superseded`,
/// pointing at the survivor; `?4` is now.
pub const DEBOUNCE_SUPERSEDE: &str = "
    UPDATE tickmark_events
    SET state = 'superseded', superseded_by = ?2, finished_at = ?4, last_error = ?3
    WHERE id IN (SELECT value FROM json_each(?1)) AND state = 'pending'";

/// The survivor runs when the burst has been quiet (or waited long enough).
pub const DEBOUNCE_SCHEDULE: &str = "
    UPDATE tickmark_events SET due_at = ?2, burst_started_at = ?3
    WHERE id = ?1 AND state = 'pending'";
