//! The PostgreSQL store's statements, one per transition. Each transition of a
//! leased event filters on the expected state and the fencing token.

/// Insert many events at once (group commit): one statement, one commit, one
/// NOTIFY. Each unfinished event gets its claim queue row in the same
/// statement, and says so in `queued_due_at` (migration 0017). Rows come
/// sorted by key, so concurrent batches take the unique index's locks in
/// one order. `ON CONFLICT DO NOTHING` names no target, so
/// it covers both unique keys, (source, dedup key) and (source, replay key):
/// the dedup decision on both is this one statement. Answers the keys that
/// were new, with their ids.
pub const EVENT_INSERT_MANY: &str = "
    WITH rows AS (
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                             $6::text[], $7::int[], $8::timestamptz[], $9::text[], $10::bigint[],
                             $12::text[], $13::text[], $14::int[], $15::text[], $16::int[],
                             $17::text[], $18::text[], $19::text[])
            WITH ORDINALITY
            AS r (source, dedup_key, kind, payload, plan, state, step_count, not_before,
                  resource_key, resource_seq, replay_key, limit_key, limit_n, tenant_key,
                  head_start_ms, traceparent, tracestate, subjects, ord)
    ),
    inserted AS (
        INSERT INTO tickmark_events
            (source, dedup_key, kind, payload, plan, state, step_count, due_at, resource_key,
             resource_seq, replay_key, limit_key, limit_n, tenant_key, head_start_ms,
             traceparent, tracestate, subjects, queued_due_at)
        SELECT source, dedup_key, kind, payload::json, plan::json, state, step_count,
               coalesce(not_before, now()), resource_key, resource_seq, replay_key,
               limit_key, limit_n, tenant_key, head_start_ms, traceparent, tracestate, subjects,
               CASE WHEN state IN ('pending', 'running') THEN coalesce(not_before, now()) END
        FROM rows ORDER BY ord
        ON CONFLICT DO NOTHING
        RETURNING id, source, dedup_key, state, queued_due_at, resource_key, limit_key,
                  tenant_key, head_start_ms
    ),
    queued AS (
        INSERT INTO tickmark_queue
            (event_seq, due_at, resource_key, limit_key, tenant_key, head_start_ms)
        SELECT id, queued_due_at, resource_key, limit_key, tenant_key, head_start_ms
        FROM inserted
        WHERE queued_due_at IS NOT NULL
    )
    SELECT inserted.id, inserted.source, inserted.dedup_key
    FROM inserted
    LEFT JOIN LATERAL (SELECT pg_notify($11, '') WHERE inserted.state = 'pending') AS woken ON true";

/// Of the events just inserted ($1), delete those a tombstone says were
/// accepted before (a pruned event, by its dedup or its replay key), and
/// answer their ids. Run after the insert, in its transaction, so that it
/// sees the tombstone of a prune the insert waited for (store/tombstone.rs).
///
/// Each key's tombstone is looked up per event by the tombstones' whole
/// primary key (source, key hash): scalar subqueries, which PostgreSQL never
/// turns into a join, each of which finds one row or none. As `EXISTS`, the
/// check was free to become a join, and on a tombstones table autovacuum
/// had not analyzed yet (just after a big prune) the planner hashed the
/// tombstones by source and compared every event of the batch with every
/// tombstone of its source: 29 s for a batch of 256 with 50,000 tombstones.
/// Each subquery names the whole key, so it needs no `LIMIT` (with one, a
/// planner that guesses many matching rows may prefer a scan it expects to
/// stop early).
pub const TOMBSTONED_UNDO: &str = "
    DELETE FROM tickmark_events AS e
    WHERE e.id = ANY($1)
      AND ((SELECT true FROM tickmark_tombstones AS t
            WHERE t.source = e.source
              AND t.key_hash = tickmark_key_hash('dedup', e.dedup_key))
           OR (SELECT true FROM tickmark_tombstones AS t
               WHERE t.source = e.source
                 AND t.key_hash = tickmark_key_hash('replay', e.replay_key)))
    RETURNING e.id";

/// Accepts of one debounce key take turns (until the transaction ends).
pub const DEBOUNCE_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('tickmark.debounce:' || $1, 0))";

/// Insert a debounced event (scheduled by [`DEBOUNCE_SCHEDULE`] once the
/// burst is decided); answers its id and the transaction's time.
pub const DEBOUNCE_INSERT: &str = "
    INSERT INTO tickmark_events
        (source, dedup_key, kind, payload, plan, state, step_count, due_at, resource_key,
         resource_seq, replay_key, limit_key, limit_n, debounce_key, burst_started_at, tenant_key,
         head_start_ms, traceparent, tracestate, subjects)
    VALUES ($1, $2, $3, $4::json, $5::json, 'pending', $6, now(), $7, $8, $9, $10, $11, $12,
            now(), $13, $14, $15, $16, $17)
    ON CONFLICT DO NOTHING
    RETURNING id, now()";

/// The key's other events that have not started (a failed attempt, a lease
/// or a finished step would make them ineligible), locked: found through
/// the claim queue, which holds only unfinished events (migration 0017),
/// and checked on the event row.
pub const DEBOUNCE_WAITING: &str = "
    SELECT e.id, e.resource_seq, e.burst_started_at
    FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE q.debounce_key = $1 AND e.debounce_key = $1 AND e.state = 'pending'
      AND e.next_step = 0 AND e.attempt = 0 AND e.wait_until IS NULL AND e.id <> $2
    ORDER BY e.id
    FOR UPDATE OF e";

/// Coalesce: the burst's other events end `superseded`, pointing at the survivor.
pub const DEBOUNCE_SUPERSEDE: &str = "
    UPDATE tickmark_events
    SET state = 'superseded', superseded_by = $2, finished_at = now(), last_error = $3
    WHERE id = ANY($1) AND state = 'pending'";

/// The survivor runs when the burst has been quiet (or waited long enough);
/// idle workers re-read the next due time.
pub const DEBOUNCE_SCHEDULE: &str = "
    WITH scheduled AS (
        UPDATE tickmark_events SET due_at = $2, burst_started_at = $3
        WHERE id = $1 AND state = 'pending'
        RETURNING id
    )
    SELECT scheduled.id FROM scheduled CROSS JOIN LATERAL pg_notify($4, '') AS notified";

/// Lease due events in one statement: `tickmark_claim` (migrations 0003,
/// 0012, 0013, 0014, 0017, 0020), its rows chosen by `tickmark_claimable`
/// (migrations 0018, 0019). It walks the claim queue's `tickmark_queue_rank`
/// in its exact order (no sort of the backlog, whatever the table's
/// statistics say; the rank is the due time less a handler's head start),
/// and locks the
/// event rows with SKIP LOCKED, so
/// concurrent claimers take different rows instead of queueing. Running
/// rows whose lease expired are due too: that is how a dead worker's event
/// is taken over, with a new fencing token that fences the old worker out.
/// A batch claim takes an expired batch lease over once; a suspect (lost
/// again, or lost while held alone, and until its step is marked even if
/// given back meanwhile) waits for a claim alone (`$6`; `$7` false:
/// suspects only), and only a lease held alone is charged. An
/// ordered event waits while an earlier event of its resource is
/// unfinished; sources and kinds at this worker's limits are skipped.
///
/// The columns are named, not `*`: each connection keeps this statement
/// prepared, and a column that a later migration adds to the function's
/// result would otherwise change the statement's own, which the server
/// refuses for good ("cached plan must not change result type"), so a
/// worker of this release keeps claiming through the next upgrade
/// (migration 0013 says how the previous release's did not).
pub const EVENT_CLAIM_MANY: &str = "
    SELECT id, source, dedup_key, kind, payload, received_at, plan, next_step, attempt,
           lease_token, took_over, resource_key, resource_seq, interrupted, traceparent,
           tracestate
    FROM tickmark_claim($1, $2::int, $3, $4, $5, $6, $7)";

/// Extend every lease still held under its token; an expired lease is not
/// revived. The caller sorts by event, the lock order of the mark batches.
/// The claim queue rows follow (migration 0017).
pub const EVENT_HEARTBEAT_MANY: &str = "
    WITH extended AS (
        UPDATE tickmark_events AS e
        SET due_at = now() + make_interval(secs => $3),
            queued_due_at = now() + make_interval(secs => $3)
        FROM unnest($1::bigint[], $2::bigint[]) AS held (id, token)
        WHERE e.id = held.id AND e.lease_token = held.token
          AND e.state = 'running' AND e.due_at > now()
        RETURNING e.id
    ),
    requeued AS (
        UPDATE tickmark_queue AS q SET due_at = now() + make_interval(secs => $3)
        FROM extended AS x WHERE q.event_seq = x.id
    )
    SELECT id FROM extended";

/// Hand a leased event back, due in `$5` seconds (refunding the attempt when
/// `$4`; `$6` marks a snooze, `$7` says why), its claim queue row with it,
/// and wake the other workers.
pub const EVENT_RELEASE: &str = "
    WITH released AS (
        UPDATE tickmark_events
        SET state = 'pending', due_at = now() + make_interval(secs => $5),
            queued_due_at = now() + make_interval(secs => $5),
            attempt = CASE WHEN $4 THEN greatest(attempt - 1, 0) ELSE attempt END,
            snoozed = $6, last_error = coalesce($7, last_error), throttled_by = $8,
            progress = NULL, progress_message = NULL
        WHERE id = $1 AND lease_token = $2 AND state = 'running'
        RETURNING id
    ),
    requeued AS (
        UPDATE tickmark_queue AS q SET due_at = now() + make_interval(secs => $5)
        FROM released AS r WHERE q.event_seq = r.id
    )
    SELECT released.id FROM released CROSS JOIN LATERAL pg_notify($3, '') AS notified";

/// Take one token from a bucket (GCRA, docs/flow_control.md): the bucket's
/// theoretical arrival time moves on by one refill (`$2` µs) unless that
/// would put it more than the burst (`$3` tokens) ahead of now. The row lock
/// serialises takes of one bucket across the fleet. Returns a row only when
/// a token was taken.
pub const RATE_TAKE: &str = "
    WITH clock AS (SELECT (extract(epoch FROM now()) * 1000000)::bigint AS now_us)
    INSERT INTO tickmark_rate_buckets AS b (bucket, tat_us)
    SELECT $1, clock.now_us + $2 FROM clock
    ON CONFLICT (bucket) DO UPDATE
    SET tat_us = greatest(b.tat_us, (SELECT now_us FROM clock)) + $2
    WHERE greatest(b.tat_us, (SELECT now_us FROM clock)) + $2
          - (SELECT now_us FROM clock) <= $3 * $2
    RETURNING b.tat_us";

/// The bucket was empty: give the caller a place in the line of waiting
/// steps, one refill after the last one (or when the next token is due,
/// if later), and answer how many µs from now that is.
pub const RATE_WAIT: &str = "
    WITH clock AS (SELECT (extract(epoch FROM now()) * 1000000)::bigint AS now_us)
    UPDATE tickmark_rate_buckets AS b
    SET wait_us = greatest(b.wait_us + $2, b.tat_us - ($3 - 1) * $2)
    WHERE b.bucket = $1
    RETURNING b.wait_us - (SELECT now_us FROM clock)";

/// What the running step reports, under its live lease.
pub const EVENT_PROGRESS: &str = "
    UPDATE tickmark_events SET progress = $3, progress_message = $4
    WHERE id = $1 AND lease_token = $2 AND state = 'running' AND due_at > now()";

/// Make `$4` the last applied sequence of resource `$3` if it is newer (or
/// already this event's: a resumed run), in one statement. `applied` is 1 when
/// it is; `last_seq` is the value before.
pub const RESOURCE_APPLY: &str = "
    WITH applied AS (
        INSERT INTO tickmark_resources (resource_key, last_seq, event_seq)
        SELECT $2, $3, $1
        -- Only under the event's lease: a stale holder changes nothing.
        WHERE EXISTS (SELECT 1 FROM tickmark_events
                      WHERE id = $1 AND lease_token = $4 AND state = 'running')
        ON CONFLICT (resource_key) DO UPDATE
        SET last_seq = EXCLUDED.last_seq, event_seq = EXCLUDED.event_seq, applied_at = now()
        WHERE tickmark_resources.last_seq < EXCLUDED.last_seq
           OR (tickmark_resources.last_seq = EXCLUDED.last_seq
               AND tickmark_resources.event_seq = EXCLUDED.event_seq)
        RETURNING last_seq
    )
    SELECT (SELECT count(*) FROM applied) AS applied,
           (SELECT last_seq FROM tickmark_resources WHERE resource_key = $2) AS last_seq";

/// Record a leased event as stale: recorded, never applied.
pub const EVENT_MARK_STALE: &str = "
    UPDATE tickmark_events
    SET state = 'stale', finished_at = now(), last_error = $3, attempt = greatest(attempt - 1, 0)
    WHERE id = $1 AND lease_token = $2 AND state = 'running'";

/// Park a leased event whose plan this build cannot run.
pub const EVENT_PARK: &str = "
    UPDATE tickmark_events
    SET state = 'parked', last_error = $3, finished_at = now(), attempt = greatest(attempt - 1, 0)
    WHERE id = $1 AND lease_token = $2 AND state = 'running'";

/// Seconds the suspect a claim alone would take now has been due (no row:
/// none): `tickmark_claimable` (migrations 0014, 0017), the very query the
/// claim chooses its rows with, called as a claim alone of suspects by a
/// worker holding nothing (no source or kind skipped). So a suspect no claim alone
/// could take (its key at its limit, an earlier event of its resource
/// unfinished) is not reported. The row is locked for the statement (SKIP
/// LOCKED: one being claimed is not reported either).
pub const EVENT_SUSPECT_WAITS: &str = "
    SELECT extract(epoch FROM (now() - c.due_at))::float8
    FROM tickmark_claimable(1, true, false, '{}', '{}') AS c";

/// Seconds until the earliest unfinished event falls due. The claim queue's
/// index is in rank order (due time less head start, never after the due
/// time): the earliest due time is among the rows ranked no later than the
/// first row's due time (for events without head starts, the first row).
/// A range between two values, not only `<=` the second: PostgreSQL
/// guesses a third of the table for an open range of an unknown bound, and
/// read a 50,000-row queue whole, where the index reads the few rows.
pub const EVENT_NEXT_DUE: &str = "
    SELECT greatest(extract(epoch FROM (min(q.due_at) - now())), 0)::float8
    FROM tickmark_queue AS q
    WHERE q.rank_at BETWEEN (SELECT f.rank_at FROM tickmark_queue AS f
                             ORDER BY f.rank_at, f.event_seq LIMIT 1)
                        AND (SELECT f.due_at FROM tickmark_queue AS f
                             ORDER BY f.rank_at, f.event_seq LIMIT 1)
    HAVING count(*) > 0";

/// Running events, and pending ones except those waiting at a wait step whose
/// deadline has not come and that no match has woken.
pub const EVENT_COUNT_ACTIVE: &str = "
    SELECT count(*) FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE e.state = 'running'
       OR (e.state = 'pending' AND (e.wait_until IS NULL OR e.due_at <= now()))";

/// Events per state, and superseded events per (source, kind), in one scan.
pub const EVENT_COUNT_BY_STATE: &str = "
    SELECT state,
           CASE WHEN state = 'superseded' THEN source END AS source,
           CASE WHEN state = 'superseded' THEN kind END AS kind,
           count(*)
    FROM tickmark_events GROUP BY 1, 2, 3 ORDER BY 1, 2, 3";

/// Running events whose lease expired (their worker died or stalled).
pub const EVENT_COUNT_STUCK: &str = "
    SELECT count(*) FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE q.rank_at <= now() AND q.due_at <= now() AND e.state = 'running' AND e.due_at <= now()";

/// Events waiting at a wait step (for another event, or a time).
pub const EVENT_COUNT_WAITING: &str = "
    SELECT count(*) FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE e.state = 'pending' AND e.wait_until IS NOT NULL";

/// Seconds the oldest due pending event has waited.
pub const EVENT_OLDEST_PENDING_AGE: &str = "
    SELECT extract(epoch FROM (now() - min(e.due_at)))::float8
    FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE q.rank_at <= now() AND q.due_at <= now() AND e.state = 'pending'
      AND e.due_at <= now()";

/// One event by row number.
pub const EVENT_GET: &str = "
    SELECT id, source, dedup_key, kind, payload::text AS payload, received_at, state, step_count,
           next_step, attempt, due_at, lease_owner, lease_token, takeovers, interrupted, last_error, finished_at,
           traceparent, tracestate, erased_at
    FROM tickmark_events WHERE id = $1";

/// One event by dedup key.
pub const EVENT_FIND: &str = "
    SELECT id, source, dedup_key, kind, payload::text AS payload, received_at, state, step_count,
           next_step, attempt, due_at, lease_owner, lease_token, takeovers, interrupted, last_error, finished_at,
           traceparent, tracestate, erased_at
    FROM tickmark_events WHERE source = $1 AND dedup_key = $2";

/// One event by its replay key (unique per source, like the dedup key).
pub const EVENT_FIND_BY_REPLAY_KEY: &str = "
    SELECT id, source, dedup_key, kind, payload::text AS payload, received_at, state, step_count,
           next_step, attempt, due_at, lease_owner, lease_token, takeovers, interrupted, last_error, finished_at,
           traceparent, tracestate, erased_at
    FROM tickmark_events WHERE source = $1 AND replay_key = $2";

/// Outputs of the done steps, for resuming.
pub const STEP_OUTPUTS: &str = "
    SELECT position, output::text FROM tickmark_steps
    WHERE event_seq = $1 AND state IN ('done', 'skipped')
    ORDER BY position";

/// Mark step `$3` done (or, when `$9`, skipped: a branch not taken) under
/// lease (`$1`, `$2`) and advance the event; the last step's mark also
/// finishes the event, and takes it out of the claim queue. The event
/// update filters on state, token, position and an unexpired lease: if it
/// changes nothing, nothing is inserted either.
pub const STEP_MARK_DONE: &str = "
    WITH advanced AS (
        UPDATE tickmark_events
        SET next_step = next_step + 1,
            state = CASE WHEN next_step + 1 >= step_count THEN 'done' ELSE 'running' END,
            attempt = CASE WHEN next_step + 1 >= step_count THEN attempt ELSE 1 END,
            interrupted = CASE WHEN next_step + 1 >= step_count THEN interrupted ELSE 0 END,
            suspect = false,
            finished_at = CASE WHEN next_step + 1 >= step_count THEN now() END,
            queued_due_at = CASE WHEN next_step + 1 >= step_count THEN NULL ELSE queued_due_at END,
            step_started_at = now(),
            last_error = NULL,
            progress = NULL,
            progress_message = NULL
        WHERE id = $1 AND lease_token = $2 AND state = 'running' AND next_step = $3
          AND due_at > now()
        RETURNING id, state
    ),
    dequeued AS (
        DELETE FROM tickmark_queue AS q USING advanced AS a
        WHERE q.event_seq = a.id AND a.state = 'done'
    )
    INSERT INTO tickmark_steps
        (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output)
    SELECT id, $3, $4, CASE WHEN $9 THEN 'skipped' ELSE 'done' END, $5, $2, $6, $7, $8::json
    FROM advanced
    ON CONFLICT (event_seq, position) DO UPDATE
    SET state = EXCLUDED.state, attempts = EXCLUDED.attempts, lease_token = EXCLUDED.lease_token,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
        output = EXCLUDED.output, last_error = NULL";

/// Mark many steps done at once (group commit): one statement, one commit.
/// Each row still filters on its own event's state, fencing token, position
/// and unexpired lease; the answer lists the events whose mark was applied.
/// The statement is `tickmark_mark_done_many` (migration 0017), so that it
/// runs on one generic plan: a statement of its own was re-planned at
/// every mark of one step (concurrency 1), 0.17 ms a mark, since a custom
/// plan for one mark always looks cheaper than the generic one for ten.
pub const STEP_MARK_DONE_MANY: &str = "
    SELECT event_seq
    FROM tickmark_mark_done_many($1::bigint[], $2::bigint[], $3::int[], $4::text[], $5::int[],
                                 $6::timestamptz[], $7::timestamptz[], $8::text[]) AS event_seq";

/// Record a failed attempt under lease (`$1`, `$2`): schedule the retry in
/// `$10` seconds, or dead-letter the event when `$9` (its claim queue row
/// moved or deleted with it).
pub const STEP_MARK_FAILED: &str = "
    WITH failed AS (
        UPDATE tickmark_events
        SET state = CASE WHEN $9 THEN 'dead' ELSE 'pending' END,
            due_at = now() + make_interval(secs => $10),
            attempt = $5,
            suspect = false,
            last_error = $8,
            progress = NULL,
            progress_message = NULL,
            finished_at = CASE WHEN $9 THEN now() END,
            queued_due_at = CASE WHEN $9 THEN NULL ELSE now() + make_interval(secs => $10) END
        WHERE id = $1 AND lease_token = $2 AND state = 'running' AND next_step = $3
          AND due_at > now()
        RETURNING id
    ),
    requeued AS (
        UPDATE tickmark_queue AS q SET due_at = now() + make_interval(secs => $10)
        FROM failed AS f WHERE q.event_seq = f.id AND NOT $9
    ),
    dequeued AS (
        DELETE FROM tickmark_queue AS q USING failed AS f WHERE q.event_seq = f.id AND $9
    )
    INSERT INTO tickmark_steps
        (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, last_error)
    SELECT id, $3, $4, CASE WHEN $9 THEN 'dead' ELSE 'failed' END, $5, $2, $6, $7, $8 FROM failed
    ON CONFLICT (event_seq, position) DO UPDATE
    SET state = EXCLUDED.state, attempts = EXCLUDED.attempts, lease_token = EXCLUDED.lease_token,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
        last_error = EXCLUDED.last_error";

/// Whether a mark that changed nothing had in fact been applied under this
/// token (a commit whose answer was lost, then retried), which the event
/// still holds: a retried mark whose lease moved on since (a takeover, an
/// operator) is `LeaseLost`, so its worker stops (found by the simulator:
/// seed 100038).
pub const STEP_MARK_CONFIRM: &str = "
    SELECT 1 FROM tickmark_steps AS s
    JOIN tickmark_events AS e ON e.id = s.event_seq AND e.lease_token = s.lease_token
    WHERE s.event_seq = $1 AND s.position = $2 AND s.lease_token = $3 AND s.state = $4";

/// The step-status table of one event.
pub const STEP_STATUS: &str = "
    SELECT position, step, idempotency_key, state, attempts, started_at, finished_at, retry_at,
           lease_until, worker, last_error, output::text AS output, progress, progress_message
    FROM tickmark_step_status
    WHERE event_seq = $1
    ORDER BY position";

/// Distinct plans of events that may still run.
pub const PLANS_UNFINISHED: &str = "
    SELECT plan::text AS plan, count(*) AS events, min(id) AS example
    FROM tickmark_events
    WHERE state IN ('pending', 'running', 'dead', 'parked')
    GROUP BY plan::text
    ORDER BY min(id)";
