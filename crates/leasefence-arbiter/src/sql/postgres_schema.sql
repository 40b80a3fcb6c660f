-- leasefence arbiter schema for PostgreSQL, version 4.
--
-- Idempotent: safe to run any number of times, concurrently too. Run it in one
-- transaction (the Rust installer does; by hand: psql --single-transaction -f FILE).
-- Objects are created in the first schema of the installer's search_path (the Rust
-- installer sets it to the schema it installs into, `public` unless told otherwise),
-- and leasefence_admit names its table and leasefence_stale with that schema, so
-- callers' search_path does not matter; the Rust helpers name the schema too. (Version 1 pinned the function with `SET search_path`, which costs a
-- configuration save and restore on every call, and put CHECK constraints on the
-- fence table; version 2 drops both. Version 3 adds leasefence_stale, which lets a
-- client fold the fence into its own statement. Version 4 adds leasefence_consumed,
-- the message ids a queue consumer has applied.)
--
-- SQLSTATEs raised (class 'LF', leasefence):
--   LF001  stale fencing token. The calling transaction is aborted, so nothing of
--          the effect commits. MESSAGE: 'stale fencing token for R: presented N, current M'
--          DETAIL: 'presented=N current=M resource=R' (resource last: it may contain spaces).
--   LF002  invalid argument: token < 1, mode not 'strict'/'monotonic', resource
--          empty or longer than 512 bytes.
--   LF003  a newer schema version is installed; this script will not downgrade it.

-- Serializes concurrent installs (CREATE ... IF NOT EXISTS alone can race).
SELECT pg_advisory_xact_lock(7237098112370931713);

CREATE TABLE IF NOT EXISTS leasefence_schema_version (
    component    text PRIMARY KEY,
    version      integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);

DO $$
DECLARE
    v integer;
BEGIN
    SELECT version INTO v FROM leasefence_schema_version WHERE component = 'arbiter';
    IF v IS NOT NULL AND v > 4 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LF003',
            MESSAGE = format('leasefence arbiter schema version %s is installed; this installer is version 4 and will not downgrade it', v);
    END IF;
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'leasefence: the installer''s search_path names no existing schema to install into';
    END IF;
END
$$;

-- Written only by leasefence_admit (which validates its arguments) and by the
-- Rust PreparedAdmit (whose types do). No CHECK constraints: PostgreSQL sets
-- them up and evaluates them on every admit, which cost about 6 points of
-- fenced/plain throughput at 8 clients in the fenced_vs_plain bench (0.80 with
-- them, 0.86 without). Do not write this table by hand.
CREATE TABLE IF NOT EXISTS leasefence_fences (
    resource   text PRIMARY KEY,
    last_token bigint NOT NULL,
    mode       text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- Version 1 created them; drop them on upgrade. Only then: ALTER TABLE locks
-- the table exclusively, which would queue every admit behind the install.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_constraint
                WHERE conrelid = 'leasefence_fences'::regclass AND contype = 'c'
                  AND conname IN ('leasefence_fences_resource_check',
                                  'leasefence_fences_last_token_check',
                                  'leasefence_fences_mode_check')) THEN
        ALTER TABLE leasefence_fences
            DROP CONSTRAINT IF EXISTS leasefence_fences_resource_check,
            DROP CONSTRAINT IF EXISTS leasefence_fences_last_token_check,
            DROP CONSTRAINT IF EXISTS leasefence_fences_mode_check;
    END IF;
END
$$;

-- Raises LF001 for a presented token that the fence of `p_resource` (at
-- `p_current`) does not admit. leasefence_admit raises through it, and so does the
-- fence that a client folds into its own statement (the Rust
-- `postgres::FencedStatement`): a CASE calls it where the rule fails. Declared to
-- return bigint so that it fits there; it never returns.
CREATE OR REPLACE FUNCTION leasefence_stale(p_resource text, p_presented bigint, p_current bigint)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'LF001',
        MESSAGE = format('stale fencing token for %s: presented %s, current %s', p_resource, p_presented, p_current),
        DETAIL = format('presented=%s current=%s resource=%s', p_presented, p_current, p_resource),
        HINT = 'a newer lease holder has acted on this resource; re-read state instead of retrying';
END
$$;

-- Admits `p_token` for `p_resource` and records it, inside the caller's
-- transaction, or raises LF001 (stale). Call it before or after your effect in
-- the same transaction: the fence row stays locked until you commit, and a
-- rollback undoes both. Correct under READ COMMITTED (the upsert re-checks the
-- newest committed row) and under REPEATABLE READ / SERIALIZABLE (a concurrent
-- update surfaces as SQLSTATE 40001: retry the transaction).
--
-- The body is created with the install schema written into it (`@schema@` below
-- is replaced by the quoted schema name), so it finds its table whatever the
-- caller's search_path, at no per-call cost.
DO $install$
BEGIN
    EXECUTE replace($function$
CREATE OR REPLACE FUNCTION @schema@.leasefence_admit(p_resource text, p_token bigint, p_mode text DEFAULT 'strict')
RETURNS void
LANGUAGE plpgsql
VOLATILE
AS $body$
DECLARE
    v_current bigint;
BEGIN
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION USING ERRCODE = 'LF002',
            MESSAGE = 'leasefence_admit: resource must be 1..=512 bytes of text';
    END IF;
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'LF002',
            MESSAGE = format('leasefence_admit: token must be >= 1, got %s', coalesce(p_token::text, 'NULL'));
    END IF;
    IF p_mode IS NULL OR p_mode NOT IN ('strict', 'monotonic') THEN
        RAISE EXCEPTION USING ERRCODE = 'LF002',
            MESSAGE = format('leasefence_admit: mode must be ''strict'' or ''monotonic'', got %L', p_mode);
    END IF;

    -- The common case, a fence that exists, is one UPDATE: cheaper than an
    -- INSERT .. ON CONFLICT, which tries the insert first. Under READ
    -- COMMITTED an UPDATE blocked by a racer re-checks its WHERE against the
    -- racer's committed row, so the rule holds.
    LOOP
        UPDATE @schema@.leasefence_fences AS f
           SET last_token = p_token, mode = p_mode, updated_at = now()
         WHERE f.resource = p_resource
           AND (f.last_token < p_token OR (p_mode = 'monotonic' AND f.last_token = p_token));
        IF FOUND THEN
            RETURN;
        END IF;
        INSERT INTO @schema@.leasefence_fences (resource, last_token, mode, updated_at)
        VALUES (p_resource, p_token, p_mode, now())
        ON CONFLICT (resource) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        -- The row exists. If a racer created it with a lower token after our
        -- UPDATE looked, try the UPDATE again; otherwise we are stale.
        SELECT f.last_token INTO v_current FROM @schema@.leasefence_fences f WHERE f.resource = p_resource;
        EXIT WHEN v_current IS NULL
              OR NOT (v_current < p_token OR (p_mode = 'monotonic' AND v_current = p_token));
    END LOOP;

    PERFORM @schema@.leasefence_stale(p_resource, p_token, v_current);
END
$body$
$function$, '@schema@', quote_ident(current_schema()));
END
$install$;

-- The messages a queue consumer has applied: a consumer inserts (consumer,
-- message_id) in the transaction of the message's effect and its fence, so a
-- redelivered message finds its row and is not applied twice. Rows may be
-- deleted once the broker can no longer redeliver their message.
CREATE TABLE IF NOT EXISTS leasefence_consumed (
    consumer    text NOT NULL,
    message_id  text NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

INSERT INTO leasefence_schema_version (component, version) VALUES ('arbiter', 4)
ON CONFLICT (component) DO UPDATE SET version = excluded.version, installed_at = now();
