-- GENERATED FILE, NOT APPLIED: tickmark's PostgreSQL schema as
-- migrations/postgres/*.sql leave it. The migrations are the source; this
-- is their result, read back from a freshly migrated database's catalogs
-- by tests/tests/it/schema_snapshot.rs, which fails when the two differ.
-- Regenerate it after changing a migration, and commit it with the migration:
--   TICKMARK_BLESS_SCHEMA=1 cargo test -p tickmark-tests --test it schema_snapshot::
-- What it holds and why not a dump: docs/schema.md.
-- The schema's name is written <schema>: tickmark's objects live in the
-- connection's search_path schema. Owners and privileges are left out.
-- tickmark_migrations is the migration history, created by tickmark's
-- migrator rather than by a migration: its shape is listed, its rows are not.

-- Tables

CREATE TABLE tickmark_audit (
    id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
    event_seq bigint NOT NULL,
    at timestamp with time zone NOT NULL DEFAULT now(),
    actor text NOT NULL,
    action text NOT NULL,
    step text,
    reason text,
    detail text,
    CONSTRAINT tickmark_audit_event_id_fkey FOREIGN KEY (event_seq) REFERENCES tickmark_events(id) ON DELETE CASCADE,
    CONSTRAINT tickmark_audit_pkey PRIMARY KEY (id)
);

CREATE TABLE tickmark_events (
    id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
    source text NOT NULL,
    dedup_key text NOT NULL,
    kind text NOT NULL,
    payload json NOT NULL,
    plan json NOT NULL,
    state text NOT NULL,
    step_count integer NOT NULL,
    next_step integer NOT NULL DEFAULT 0,
    attempt integer NOT NULL DEFAULT 0,
    due_at timestamp with time zone NOT NULL DEFAULT now(),
    lease_owner text,
    lease_token bigint NOT NULL DEFAULT 0,
    takeovers integer NOT NULL DEFAULT 0,
    last_error text,
    received_at timestamp with time zone NOT NULL DEFAULT now(),
    step_started_at timestamp with time zone,
    finished_at timestamp with time zone,
    progress real,
    progress_message text,
    snoozed boolean NOT NULL DEFAULT false,
    resource_key text,
    resource_seq bigint,
    replay_key text,
    throttled_by text,
    limit_key text,
    limit_n integer,
    debounce_key text,
    burst_started_at timestamp with time zone,
    superseded_by bigint,
    wait_key text,
    wait_since timestamp with time zone,
    wait_until timestamp with time zone,
    claimed_alone boolean NOT NULL DEFAULT false,
    interrupted integer NOT NULL DEFAULT 0,
    suspect boolean NOT NULL DEFAULT false,
    queued_due_at timestamp with time zone,
    tenant_key text,
    head_start_ms integer NOT NULL DEFAULT 0,
    traceparent text,
    tracestate text,
    subjects text,
    erased_at timestamp with time zone,
    CONSTRAINT tickmark_events_dedup UNIQUE (source, dedup_key),
    CONSTRAINT tickmark_events_head_start_ms_check CHECK ((head_start_ms >= 0)),
    CONSTRAINT tickmark_events_pkey PRIMARY KEY (id),
    CONSTRAINT tickmark_events_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'running'::text, 'done'::text, 'dead'::text, 'parked'::text, 'ignored'::text, 'cancelled'::text, 'stale'::text, 'superseded'::text]))),
    CONSTRAINT tickmark_events_subjects_check CHECK ((subjects ~ '^[0-9a-f]{64}( [0-9a-f]{64})*$'::text)),
    CONSTRAINT tickmark_events_traceparent_check CHECK ((length(traceparent) = 55)),
    CONSTRAINT tickmark_events_tracestate_check CHECK ((length(tracestate) <= 512))
) WITH (fillfactor=50);

CREATE TABLE tickmark_fair_clock (
    only_row boolean NOT NULL DEFAULT true,
    virtual_time double precision NOT NULL DEFAULT 0,
    CONSTRAINT tickmark_fair_clock_only_row_check CHECK (only_row),
    CONSTRAINT tickmark_fair_clock_pkey PRIMARY KEY (only_row)
);

CREATE TABLE tickmark_keys (
    key_id text NOT NULL,
    key_check text NOT NULL,
    registered_at timestamp with time zone NOT NULL DEFAULT now(),
    CONSTRAINT tickmark_keys_key_check_check CHECK ((key_check ~ '^[0-9a-f]{32}$'::text)),
    CONSTRAINT tickmark_keys_key_id_check CHECK ((key_id ~ '^[A-Za-z0-9_-]{1,32}$'::text)),
    CONSTRAINT tickmark_keys_pkey PRIMARY KEY (key_id)
);

CREATE TABLE tickmark_match_keys (
    match_key text NOT NULL,
    event_seq bigint NOT NULL,
    received_at timestamp with time zone NOT NULL DEFAULT now(),
    CONSTRAINT tickmark_match_keys_pkey PRIMARY KEY (match_key, event_seq)
);

CREATE TABLE tickmark_migrations (
    version bigint NOT NULL,
    description text NOT NULL,
    installed_on timestamp with time zone NOT NULL DEFAULT now(),
    success boolean NOT NULL,
    checksum bytea NOT NULL,
    execution_time bigint NOT NULL,
    CONSTRAINT tickmark_migrations_pkey PRIMARY KEY (version)
);

CREATE TABLE tickmark_queue (
    event_seq bigint NOT NULL,
    due_at timestamp with time zone NOT NULL,
    resource_key text,
    limit_key text,
    debounce_key text,
    tenant_key text,
    head_start_ms integer NOT NULL DEFAULT 0,
    rank_at timestamp with time zone GENERATED ALWAYS AS (tickmark_rank(due_at, head_start_ms)) STORED,
    CONSTRAINT tickmark_queue_pkey PRIMARY KEY (event_seq)
) WITH (fillfactor=50);

CREATE TABLE tickmark_rate_buckets (
    bucket text NOT NULL,
    tat_us bigint NOT NULL,
    wait_us bigint NOT NULL DEFAULT 0,
    CONSTRAINT tickmark_rate_buckets_pkey PRIMARY KEY (bucket)
);

CREATE TABLE tickmark_reconcile_cursors (
    source text NOT NULL,
    cursor text,
    cursor_at timestamp with time zone,
    lease_owner text,
    lease_until timestamp with time zone,
    fence bigint NOT NULL DEFAULT 0,
    last_run_started_at timestamp with time zone,
    last_run_finished_at timestamp with time zone,
    last_summary text,
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    CONSTRAINT tickmark_reconcile_cursors_pkey PRIMARY KEY (source)
);

CREATE TABLE tickmark_resources (
    resource_key text NOT NULL,
    last_seq bigint NOT NULL,
    event_seq bigint NOT NULL,
    applied_at timestamp with time zone NOT NULL DEFAULT now(),
    CONSTRAINT tickmark_resources_pkey PRIMARY KEY (resource_key)
);

CREATE TABLE tickmark_steps (
    event_seq bigint NOT NULL,
    position integer NOT NULL,
    name text NOT NULL,
    state text NOT NULL,
    attempts integer NOT NULL,
    lease_token bigint NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone NOT NULL,
    output json,
    last_error text,
    CONSTRAINT tickmark_steps_pkey PRIMARY KEY (event_seq, "position"),
    CONSTRAINT tickmark_steps_state_check CHECK ((state = ANY (ARRAY['done'::text, 'failed'::text, 'dead'::text, 'skipped'::text])))
);

CREATE TABLE tickmark_tenants (
    tenant_key text NOT NULL,
    weight double precision NOT NULL DEFAULT 1,
    pass double precision NOT NULL DEFAULT 0,
    weight_set_at timestamp with time zone,
    CONSTRAINT tickmark_tenants_pkey PRIMARY KEY (tenant_key),
    CONSTRAINT tickmark_tenants_weight_check CHECK (((weight > (0)::double precision) AND (weight <= (1000000)::double precision)))
);

CREATE TABLE tickmark_tombstones (
    source text NOT NULL,
    key_hash bytea NOT NULL,
    accepted_at timestamp with time zone NOT NULL,
    CONSTRAINT tickmark_tombstones_pkey PRIMARY KEY (source, key_hash)
);

-- Indexes (with those behind the constraints above)

CREATE INDEX tickmark_audit_event ON tickmark_audit USING btree (event_seq, id);
CREATE UNIQUE INDEX tickmark_audit_pkey ON tickmark_audit USING btree (id);
CREATE UNIQUE INDEX tickmark_events_dedup ON tickmark_events USING btree (source, dedup_key);
CREATE UNIQUE INDEX tickmark_events_pkey ON tickmark_events USING btree (id);
CREATE UNIQUE INDEX tickmark_events_replay ON tickmark_events USING btree (source, replay_key) WHERE (replay_key IS NOT NULL);
CREATE INDEX tickmark_events_subjects ON tickmark_events USING gin (string_to_array(subjects, ' '::text)) WHERE (subjects IS NOT NULL);
CREATE INDEX tickmark_events_waiting ON tickmark_events USING btree (wait_key) WHERE (wait_key IS NOT NULL);
CREATE UNIQUE INDEX tickmark_fair_clock_pkey ON tickmark_fair_clock USING btree (only_row);
CREATE UNIQUE INDEX tickmark_keys_pkey ON tickmark_keys USING btree (key_id);
CREATE INDEX tickmark_match_keys_event ON tickmark_match_keys USING btree (event_seq);
CREATE UNIQUE INDEX tickmark_match_keys_pkey ON tickmark_match_keys USING btree (match_key, event_seq);
CREATE UNIQUE INDEX tickmark_migrations_pkey ON tickmark_migrations USING btree (version);
CREATE INDEX tickmark_queue_debounce ON tickmark_queue USING btree (debounce_key) WHERE (debounce_key IS NOT NULL);
CREATE INDEX tickmark_queue_limit ON tickmark_queue USING btree (limit_key, due_at) WHERE (limit_key IS NOT NULL);
CREATE UNIQUE INDEX tickmark_queue_pkey ON tickmark_queue USING btree (event_seq);
CREATE INDEX tickmark_queue_rank ON tickmark_queue USING btree (rank_at, event_seq);
CREATE INDEX tickmark_queue_serial ON tickmark_queue USING btree (resource_key, event_seq) WHERE (resource_key IS NOT NULL);
CREATE INDEX tickmark_queue_tenant ON tickmark_queue USING btree (tenant_key, rank_at, event_seq) WHERE (tenant_key IS NOT NULL);
CREATE UNIQUE INDEX tickmark_rate_buckets_pkey ON tickmark_rate_buckets USING btree (bucket);
CREATE UNIQUE INDEX tickmark_reconcile_cursors_pkey ON tickmark_reconcile_cursors USING btree (source);
CREATE UNIQUE INDEX tickmark_resources_pkey ON tickmark_resources USING btree (resource_key);
CREATE UNIQUE INDEX tickmark_steps_pkey ON tickmark_steps USING btree (event_seq, "position");
CREATE UNIQUE INDEX tickmark_tenants_pkey ON tickmark_tenants USING btree (tenant_key);
CREATE INDEX tickmark_tombstones_accepted ON tickmark_tombstones USING brin (accepted_at);
CREATE UNIQUE INDEX tickmark_tombstones_pkey ON tickmark_tombstones USING btree (source, key_hash);

-- Sequences

CREATE SEQUENCE tickmark_audit_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1 OWNED BY tickmark_audit.id;
CREATE SEQUENCE tickmark_events_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1 OWNED BY tickmark_events.id;

-- Views

CREATE VIEW tickmark_step_status AS
 SELECT e.id AS event_seq,
    e.source,
    e.dedup_key AS event_id,
    e.kind,
    (p.ordinality - 1)::integer AS "position",
    p.entry ->> 'name'::text AS step,
    (((e.source || ':'::text) || e.dedup_key) || ':'::text) || (p.entry ->> 'name'::text) AS idempotency_key,
        CASE
            WHEN s.state = ANY (ARRAY['done'::text, 'skipped'::text]) THEN s.state
            WHEN (p.ordinality - 1) > e.next_step THEN
            CASE
                WHEN e.state = ANY (ARRAY['pending'::text, 'running'::text]) THEN 'pending'::text
                ELSE 'not_run'::text
            END
            WHEN e.state = 'running'::text THEN
            CASE
                WHEN e.due_at > now() THEN 'running'::text
                ELSE 'interrupted'::text
            END
            WHEN e.state = 'pending'::text THEN
            CASE
                WHEN e.wait_until IS NOT NULL THEN 'waiting'::text
                WHEN e.snoozed AND e.throttled_by IS NOT NULL THEN 'throttled'::text
                WHEN e.snoozed THEN 'snoozed'::text
                WHEN s.state = 'failed'::text THEN 'retrying'::text
                ELSE 'pending'::text
            END
            ELSE e.state
        END AS state,
        CASE
            WHEN (p.ordinality - 1) = e.next_step THEN e.attempt
            ELSE COALESCE(s.attempts, 0)
        END AS attempts,
        CASE
            WHEN (p.ordinality - 1) = e.next_step AND e.state = 'running'::text THEN e.step_started_at
            ELSE s.started_at
        END AS started_at,
        CASE
            WHEN s.state = ANY (ARRAY['done'::text, 'skipped'::text]) THEN s.finished_at
            ELSE NULL::timestamp with time zone
        END AS finished_at,
        CASE
            WHEN (p.ordinality - 1) = e.next_step AND e.state = 'pending'::text THEN e.due_at
            ELSE NULL::timestamp with time zone
        END AS retry_at,
        CASE
            WHEN (p.ordinality - 1) = e.next_step AND e.state = 'running'::text THEN e.due_at
            ELSE NULL::timestamp with time zone
        END AS lease_until,
        CASE
            WHEN (p.ordinality - 1) = e.next_step AND e.state = 'running'::text THEN e.lease_owner
            ELSE NULL::text
        END AS worker,
        CASE
            WHEN (p.ordinality - 1) = e.next_step THEN COALESCE(e.last_error, s.last_error)
            ELSE s.last_error
        END AS last_error,
    s.output,
        CASE
            WHEN (p.ordinality - 1) = e.next_step AND e.state = 'running'::text THEN e.progress
            ELSE NULL::real
        END AS progress,
        CASE
            WHEN (p.ordinality - 1) = e.next_step AND e.state = 'running'::text THEN e.progress_message
            ELSE NULL::text
        END AS progress_message
   FROM tickmark_events e
     CROSS JOIN LATERAL json_array_elements(e.plan -> 'steps'::text) WITH ORDINALITY p(entry, ordinality)
     LEFT JOIN tickmark_steps s ON s.event_seq = e.id AND s."position" = (p.ordinality - 1);

-- Functions

CREATE OR REPLACE FUNCTION tickmark_claim(worker text, batch integer, lease_secs double precision, skip_sources text[], skip_kinds text[])
 RETURNS TABLE(id bigint, source text, dedup_key text, kind text, payload text, received_at timestamp with time zone, plan text, next_step integer, attempt integer, lease_token bigint, took_over boolean, resource_key text, resource_seq bigint)
 LANGUAGE sql
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$
    SELECT c.id, c.source, c.dedup_key, c.kind, c.payload, c.received_at,
           c.plan, c.next_step, c.attempt, c.lease_token, c.took_over,
           c.resource_key, c.resource_seq
    FROM tickmark_claim(worker, batch, lease_secs, skip_sources, skip_kinds, false, true) AS c
$function$;

CREATE OR REPLACE FUNCTION tickmark_claim(worker text, batch integer, lease_secs double precision, skip_sources text[], skip_kinds text[], alone boolean, pending boolean)
 RETURNS TABLE(id bigint, source text, dedup_key text, kind text, payload text, received_at timestamp with time zone, plan text, next_step integer, attempt integer, lease_token bigint, took_over boolean, resource_key text, resource_seq bigint, interrupted integer, traceparent text, tracestate text)
 LANGUAGE plpgsql
 SET enable_sort TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    ids        BIGINT[];
    was_states TEXT[];
    keys       TEXT[];
    ns         INT[];
    limited    TEXT;
    held       BIGINT;
    room       BIGINT;
    i          INT;
BEGIN
    SELECT coalesce(array_agg(d.id ORDER BY d.ord), '{}'),
           coalesce(array_agg(d.state ORDER BY d.ord), '{}'),
           coalesce(array_agg(d.limit_key ORDER BY d.ord), '{}'),
           coalesce(array_agg(d.limit_n ORDER BY d.ord), '{}')
    INTO ids, was_states, keys, ns
    FROM (
        SELECT c.id, c.state, c.limit_key, c.limit_n, row_number() OVER () AS ord
        FROM tickmark_claimable(batch, alone, pending, skip_sources, skip_kinds) AS c
    ) AS d;

    IF cardinality(array_remove(keys, NULL)) > 0 THEN
        -- Keys in sorted order: two claims never wait for each other in a circle.
        FOR limited IN SELECT DISTINCT k FROM unnest(array_remove(keys, NULL)) AS k ORDER BY k LOOP
            PERFORM pg_advisory_xact_lock(hashtextextended('tickmark.limit:' || limited, 0));
            held := tickmark_limit_held(limited);
            FOR i IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
                IF keys[i] = limited THEN
                    room := ns[i] - held;
                    IF room > 0 THEN
                        held := held + 1;
                    ELSE
                        ids[i] := NULL; -- the key is full: not claimed (stays as it was)
                    END IF;
                END IF;
            END LOOP;
        END LOOP;
    END IF;

    RETURN QUERY
    WITH due AS (
        SELECT u.id, u.was_state
        FROM unnest(ids, was_states) AS u (id, was_state)
        WHERE u.id IS NOT NULL
    ),
    claimed AS (
    UPDATE tickmark_events AS e
    SET state = 'running',
        lease_owner = worker,
        lease_token = e.lease_token + 1,
        due_at = now() + make_interval(secs => lease_secs),
        -- The queue row follows, below: in step, no trigger.
        queued_due_at = now() + make_interval(secs => lease_secs),
        -- Every claim counts a run; a run lost beside others is refunded:
        -- its crash is not known to be its own.
        attempt = e.attempt + 1,
        interrupted = e.interrupted + CASE WHEN due.was_state = 'running' AND NOT e.claimed_alone
                                           THEN 1 ELSE 0 END,
        claimed_alone = alone,
        -- A suspect taken (only a claim alone takes one) stays one until
        -- its step is marked, whatever gives it back before.
        suspect = e.suspect OR (due.was_state = 'running'
                                AND (e.claimed_alone OR e.interrupted > 0)),
        step_started_at = now(),
        progress = NULL,
        progress_message = NULL,
        snoozed = false,
        throttled_by = NULL,
        takeovers = e.takeovers + CASE WHEN due.was_state = 'running' THEN 1 ELSE 0 END,
        last_error = CASE WHEN due.was_state = 'running'
            THEN 'interrupted: the lease of ' || coalesce(e.lease_owner, 'a worker')
                 || ' expired before step ' || e.next_step
                 || ' was marked; re-running it with the same idempotency key'
            ELSE e.last_error END
    FROM due
    WHERE e.id = due.id
    RETURNING e.id, e.source, e.dedup_key, e.kind, e.payload::text, e.received_at,
              e.plan::text, e.next_step, e.attempt, e.lease_token,
              (due.was_state = 'running'), e.resource_key, e.resource_seq, e.interrupted,
              e.traceparent, e.tracestate
    ),
    requeued AS (
        UPDATE tickmark_queue AS q
        SET due_at = now() + make_interval(secs => lease_secs)
        FROM claimed AS c
        WHERE q.event_seq = c.id
    )
    SELECT * FROM claimed;
END
$function$;

CREATE OR REPLACE FUNCTION tickmark_claimable(batch integer, alone boolean, pending boolean, skip_sources text[], skip_kinds text[])
 RETURNS TABLE(id bigint, state text, limit_key text, limit_n integer, due_at timestamp with time zone)
 LANGUAGE plpgsql
 SET enable_sort TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET enable_material TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    IF NOT alone AND EXISTS (SELECT 1 FROM tickmark_queue AS t WHERE t.tenant_key IS NOT NULL) THEN
        RETURN QUERY SELECT * FROM tickmark_claimable_fair(batch, pending, skip_sources, skip_kinds);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.id, e.state, e.limit_key, e.limit_n, e.due_at
    FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE q.rank_at <= now() AND q.due_at <= now()
      -- The event row decides (the queue row read may be a moment old):
      -- checked again on the locked row.
      AND e.state IN ('pending', 'running') AND e.due_at <= now()
      AND CASE WHEN e.suspect OR (e.state = 'running' AND (e.claimed_alone OR e.interrupted > 0))
                    THEN alone
               WHEN e.state = 'pending' THEN pending
               ELSE pending OR NOT alone END
      AND NOT (e.source = ANY(skip_sources))
      AND NOT ((e.source || chr(31) || e.kind) = ANY(skip_kinds))
      -- An ordered event waits while an earlier one of its resource is unfinished.
      AND NOT EXISTS (
          SELECT 1 FROM tickmark_queue AS earlier
          WHERE earlier.resource_key = q.resource_key AND earlier.event_seq < q.event_seq)
      -- A limited event waits while its key is full (the claim checks again
      -- under the key's lock: this only saves the lock).
      AND (q.limit_key IS NULL OR tickmark_limit_held(q.limit_key) < e.limit_n)
    ORDER BY q.rank_at, q.event_seq
    LIMIT CASE WHEN alone THEN least(batch, 1) ELSE batch END
    FOR UPDATE OF e SKIP LOCKED;
END
$function$;

CREATE OR REPLACE FUNCTION tickmark_claimable_fair(batch integer, pending boolean, skip_sources text[], skip_kinds text[])
 RETURNS TABLE(id bigint, state text, limit_key text, limit_n integer, due_at timestamp with time zone)
 LANGUAGE plpgsql
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET enable_material TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    clock             FLOAT8;
    candidate_ids     BIGINT[];
    candidate_tenants TEXT[];
    ids               BIGINT[];
    was_states        TEXT[];
    keys              TEXT[];
    ns                INT[];
    dues              TIMESTAMPTZ[];
    tenants           TEXT[];
    served            RECORD;
    last_start        FLOAT8;
    top_start         FLOAT8;
BEGIN
    SELECT c.virtual_time INTO clock FROM tickmark_fair_clock AS c FOR UPDATE;

    -- The candidates, best first: no lock yet, only the queue and the
    -- tenants read.
    SELECT coalesce(array_agg(c.event_seq ORDER BY c.finish, c.rank_at, c.event_seq), '{}'),
           coalesce(array_agg(c.tenant ORDER BY c.finish, c.rank_at, c.event_seq), '{}')
    INTO candidate_ids, candidate_tenants
    FROM (
        WITH RECURSIVE due_tenants (key) AS (
            (SELECT q.tenant_key FROM tickmark_queue AS q
             WHERE q.tenant_key IS NOT NULL AND q.rank_at <= now() AND q.due_at <= now()
             ORDER BY q.tenant_key LIMIT 1)
            UNION ALL
            SELECT (SELECT q.tenant_key FROM tickmark_queue AS q
                    WHERE q.tenant_key > t.key AND q.rank_at <= now() AND q.due_at <= now()
                    ORDER BY q.tenant_key LIMIT 1)
            FROM due_tenants AS t
            WHERE t.key IS NOT NULL
        ),
        weighed AS (
            SELECT t.key, coalesce(w.weight, 1) AS weight,
                   greatest(coalesce(w.pass, 0), clock) AS start,
                   ceil(batch * coalesce(w.weight, 1)
                        / sum(coalesce(w.weight, 1)) OVER ())::int AS share
            FROM due_tenants AS t
            LEFT JOIN tickmark_tenants AS w ON w.tenant_key = t.key
            WHERE t.key IS NOT NULL
        ),
        -- How many of its share each tenant has due: the share a tenant
        -- leaves unused (two events due, a share of twenty) goes to the
        -- tenants that fill theirs, by weight, so a batch is full whenever
        -- that many events are due.
        counted AS (
            SELECT g.*, (SELECT count(*) FROM (
                             SELECT 1 FROM tickmark_queue AS q
                             WHERE q.tenant_key = g.key AND q.rank_at <= now() AND q.due_at <= now()
                             LIMIT g.share) AS x) AS have
            FROM weighed AS g
        ),
        shares AS (
            SELECT c.key, c.weight, c.start,
                   CASE WHEN c.have < c.share THEN c.have::int
                        ELSE c.share + ceil(greatest(batch - sum(least(c.have, c.share)) OVER (), 0)
                                            * c.weight
                                            / sum(CASE WHEN c.have >= c.share THEN c.weight END)
                                                  OVER ())::int
                   END AS share
            FROM counted AS c
        )
        SELECT s.key AS tenant, d.event_seq, d.rank_at,
               s.start + (row_number() OVER (PARTITION BY s.key
                                             ORDER BY d.rank_at, d.event_seq)) / s.weight
                   AS finish
        FROM shares AS s
        CROSS JOIN LATERAL (
            SELECT q.event_seq, q.rank_at FROM tickmark_queue AS q
            WHERE q.tenant_key = s.key AND q.rank_at <= now() AND q.due_at <= now()
            ORDER BY q.rank_at, q.event_seq
            LIMIT s.share
        ) AS d
        UNION ALL
        SELECT NULL, u.event_seq, u.rank_at,
               clock + (row_number() OVER (ORDER BY u.rank_at, u.event_seq))::float8
        FROM (
            SELECT q.event_seq, q.rank_at, q.tenant_key FROM tickmark_queue AS q
            WHERE q.rank_at <= now() AND q.due_at <= now()
            ORDER BY q.rank_at, q.event_seq
            LIMIT batch
        ) AS u
        WHERE u.tenant_key IS NULL
    ) AS c;

    -- Each candidate's event row, in that order, checked and locked as
    -- `tickmark_claimable` does a batch's (never alone here). The lateral
    -- lookup keeps the candidates outside: a plan made while the event
    -- table was small, free to join, walked every event instead.
    SELECT coalesce(array_agg(f.id ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.state ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.limit_key ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.limit_n ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.due_at ORDER BY f.ord), '{}'),
           coalesce(array_agg(f.tenant ORDER BY f.ord), '{}')
    INTO ids, was_states, keys, ns, dues, tenants
    FROM (
        SELECT e.id, e.state, e.limit_key, e.limit_n, e.due_at, c.tenant, c.ord
        FROM unnest(candidate_ids, candidate_tenants) WITH ORDINALITY AS c (event_seq, tenant, ord)
        CROSS JOIN LATERAL (
            SELECT e.id, e.state, e.limit_key, e.limit_n, e.due_at
            FROM tickmark_events AS e
            WHERE e.id = c.event_seq
              AND e.state IN ('pending', 'running') AND e.due_at <= now()
              AND CASE WHEN e.suspect OR (e.state = 'running'
                                          AND (e.claimed_alone OR e.interrupted > 0))
                            THEN false
                       WHEN e.state = 'pending' THEN pending
                       ELSE true END
              AND NOT (e.source = ANY(skip_sources))
              AND NOT ((e.source || chr(31) || e.kind) = ANY(skip_kinds))
              AND NOT EXISTS (
                  SELECT 1 FROM tickmark_queue AS earlier
                  WHERE earlier.resource_key = e.resource_key AND earlier.event_seq < e.id)
              AND (e.limit_key IS NULL OR tickmark_limit_held(e.limit_key) < e.limit_n)
            FOR UPDATE SKIP LOCKED
        ) AS e
        LIMIT batch
    ) AS f;

    -- Tenants in key order: two claims never wait for each other in a circle.
    FOR served IN
        SELECT t AS key, count(*) AS n FROM unnest(tenants) AS t
        WHERE t IS NOT NULL GROUP BY t ORDER BY t
    LOOP
        UPDATE tickmark_tenants AS w
        SET pass = greatest(w.pass, clock) + served.n / w.weight
        WHERE w.tenant_key = served.key
        RETURNING w.pass - 1 / w.weight INTO last_start;
        IF NOT FOUND THEN
            INSERT INTO tickmark_tenants AS w (tenant_key, pass)
            VALUES (served.key, clock + served.n)
            ON CONFLICT (tenant_key) DO UPDATE
            SET pass = greatest(w.pass, clock) + served.n / w.weight
            RETURNING w.pass - 1 / w.weight INTO last_start;
        END IF;
        top_start := greatest(top_start, last_start);
    END LOOP;
    -- The clock moves to the start of the last event served: a tenant that
    -- comes back from idle starts there, level with the tenants served.
    IF top_start > clock THEN
        UPDATE tickmark_fair_clock SET virtual_time = top_start;
    END IF;

    RETURN QUERY
    SELECT u.id, u.state, u.limit_key, u.limit_n, u.due_at
    FROM unnest(ids, was_states, keys, ns, dues) WITH ORDINALITY
        AS u (id, state, limit_key, limit_n, due_at, ord)
    ORDER BY u.ord;
END
$function$;

CREATE OR REPLACE FUNCTION tickmark_key_hash(kind text, key text)
 RETURNS bytea
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$ SELECT substring(sha256(convert_to(kind || ':' || key, 'UTF8')) FROM 1 FOR 16) $function$;

CREATE OR REPLACE FUNCTION tickmark_limit_held(key text)
 RETURNS bigint
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$
    SELECT count(*) FROM tickmark_queue AS q
    JOIN tickmark_events AS e ON e.id = q.event_seq
    WHERE q.limit_key = key AND q.due_at > now() AND e.state = 'running' AND e.due_at > now()
$function$;

CREATE OR REPLACE FUNCTION tickmark_mark_done_many(mark_events bigint[], mark_tokens bigint[], mark_positions integer[], mark_names text[], mark_attempts integer[], mark_started timestamp with time zone[], mark_finished timestamp with time zone[], mark_outputs text[])
 RETURNS SETOF bigint
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$
BEGIN
    RETURN QUERY
    WITH marks AS (
        SELECT * FROM unnest(mark_events, mark_tokens, mark_positions, mark_names, mark_attempts,
                             mark_started, mark_finished, mark_outputs)
            AS m (event_seq, token, position, name, attempts, started_at, finished_at, output)
    ),
    advanced AS (
        UPDATE tickmark_events AS e
        SET next_step = e.next_step + 1,
            state = CASE WHEN e.next_step + 1 >= e.step_count THEN 'done' ELSE 'running' END,
            attempt = CASE WHEN e.next_step + 1 >= e.step_count THEN e.attempt ELSE 1 END,
            interrupted = CASE WHEN e.next_step + 1 >= e.step_count THEN e.interrupted ELSE 0 END,
            suspect = false,
            finished_at = CASE WHEN e.next_step + 1 >= e.step_count THEN now() END,
            queued_due_at = CASE WHEN e.next_step + 1 >= e.step_count THEN NULL
                                 ELSE e.queued_due_at END,
            step_started_at = now(),
            last_error = NULL,
            progress = NULL,
            progress_message = NULL
        FROM marks AS m
        WHERE e.id = m.event_seq AND e.lease_token = m.token AND e.state = 'running'
          AND e.next_step = m.position AND e.due_at > now()
        -- The mark's own fields too: the step rows below need no join.
        RETURNING e.id, e.state, m.position, m.name, m.attempts, m.token, m.started_at,
                  m.finished_at, m.output
    ),
    dequeued AS (
        DELETE FROM tickmark_queue AS q USING advanced AS a
        WHERE q.event_seq = a.id AND a.state = 'done'
    )
    INSERT INTO tickmark_steps
        (event_seq, position, name, state, attempts, lease_token, started_at, finished_at, output)
    SELECT a.id, a.position, a.name, 'done', a.attempts, a.token, a.started_at,
           a.finished_at, a.output::json
    FROM advanced AS a
    ON CONFLICT (event_seq, position) DO UPDATE
    SET state = 'done', attempts = EXCLUDED.attempts, lease_token = EXCLUDED.lease_token,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
        output = EXCLUDED.output, last_error = NULL
    RETURNING tickmark_steps.event_seq;
END
$function$;

CREATE OR REPLACE FUNCTION tickmark_queue_mend()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$
DECLARE
    queued TIMESTAMPTZ;
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM tickmark_queue WHERE event_seq = OLD.id;
        RETURN NULL;
    END IF;
    IF NEW.state IN ('pending', 'running') THEN
        INSERT INTO tickmark_queue
            (event_seq, due_at, resource_key, limit_key, debounce_key, tenant_key, head_start_ms)
        VALUES (NEW.id, NEW.due_at, NEW.resource_key, NEW.limit_key, NEW.debounce_key,
                NEW.tenant_key, NEW.head_start_ms)
        ON CONFLICT (event_seq) DO UPDATE
        SET due_at = EXCLUDED.due_at, resource_key = EXCLUDED.resource_key,
            limit_key = EXCLUDED.limit_key, debounce_key = EXCLUDED.debounce_key,
            tenant_key = EXCLUDED.tenant_key, head_start_ms = EXCLUDED.head_start_ms;
        queued := NEW.due_at;
    ELSE
        DELETE FROM tickmark_queue WHERE event_seq = NEW.id;
    END IF;
    -- The row says so, with an update that is in step (no trigger again).
    UPDATE tickmark_events SET queued_due_at = queued WHERE id = NEW.id;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION tickmark_queue_truncated()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', '<schema>', 'pg_temp'
AS $function$
BEGIN
    TRUNCATE tickmark_queue;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION tickmark_rank(due_at timestamp with time zone, head_start_ms integer)
 RETURNS timestamp with time zone
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT due_at OPERATOR(pg_catalog.-)
           (head_start_ms::pg_catalog.float8 OPERATOR(pg_catalog.*)
            '1 millisecond'::pg_catalog.interval)
$function$;

-- Triggers

CREATE TRIGGER tickmark_queue_delete AFTER DELETE ON tickmark_events FOR EACH ROW WHEN (old.queued_due_at IS NOT NULL) EXECUTE FUNCTION tickmark_queue_mend();
CREATE TRIGGER tickmark_queue_insert AFTER INSERT ON tickmark_events FOR EACH ROW WHEN ((new.state = ANY (ARRAY['pending'::text, 'running'::text])) IS DISTINCT FROM (new.queued_due_at IS NOT NULL) OR (new.state = ANY (ARRAY['pending'::text, 'running'::text])) AND new.due_at IS DISTINCT FROM new.queued_due_at) EXECUTE FUNCTION tickmark_queue_mend();
CREATE TRIGGER tickmark_queue_truncate AFTER TRUNCATE ON tickmark_events FOR EACH STATEMENT EXECUTE FUNCTION tickmark_queue_truncated();
CREATE TRIGGER tickmark_queue_update AFTER UPDATE ON tickmark_events FOR EACH ROW WHEN ((new.state = ANY (ARRAY['pending'::text, 'running'::text])) IS DISTINCT FROM (new.queued_due_at IS NOT NULL) OR (new.state = ANY (ARRAY['pending'::text, 'running'::text])) AND new.due_at IS DISTINCT FROM new.queued_due_at OR new.resource_key IS DISTINCT FROM old.resource_key OR new.limit_key IS DISTINCT FROM old.limit_key OR new.debounce_key IS DISTINCT FROM old.debounce_key OR new.tenant_key IS DISTINCT FROM old.tenant_key OR new.head_start_ms IS DISTINCT FROM old.head_start_ms) EXECUTE FUNCTION tickmark_queue_mend();

-- Types

-- (none)
