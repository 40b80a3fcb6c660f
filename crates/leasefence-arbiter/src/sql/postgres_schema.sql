-- leasefence arbiter schema for PostgreSQL, version 5.
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
-- the message ids a queue consumer has applied. Version 5 adds signed fences:
-- leasefence_admit takes the signature as a fourth argument, and once
-- leasefence_fence_key_add has installed a key, every write of the fence table
-- must carry a valid one. It needs contrib's pgcrypto, which it creates.)
--
-- SQLSTATEs raised (class 'LF', leasefence):
--   LF001  stale fencing token. The calling transaction is aborted, so nothing of
--          the effect commits. MESSAGE: 'stale fencing token for R: presented N, current M'
--          DETAIL: 'presented=N current=M resource=R' (resource last: it may contain spaces).
--   LF002  invalid argument: token < 1, mode not 'strict'/'monotonic', resource
--          empty or longer than 512 bytes.
--   LF003  a newer schema version is installed; this script will not downgrade it.
--   LF004  bad fence signature (only once a fence key is installed): missing,
--          malformed, naming a key not installed, or not matching the resource
--          and token. The transaction is aborted; nothing is recorded.
--          MESSAGE: 'bad fence signature for R: <why>'
--          DETAIL: 'reason=<missing|malformed|unknown_key|mismatch> key=<id> resource=R'.

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
    IF v IS NOT NULL AND v > 5 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LF003',
            MESSAGE = format('leasefence arbiter schema version %s is installed; this installer is version 5 and will not downgrade it', v);
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

-- Version 5: the signature a writer presents, checked (and cleared) by the
-- trigger leasefence_fence_signature while fence keys are installed. Always
-- NULL at rest. Adding a nullable column without a default only touches the
-- catalog, but it takes the table's lock: only when it is missing.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = 'leasefence_fences'::regclass AND attname = 'signature'
                      AND NOT attisdropped) THEN
        ALTER TABLE leasefence_fences ADD COLUMN signature text;
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
-- Version 4 and older had a three-argument leasefence_admit; beside the new
-- one (whose fourth argument has a default) calls of three would be ambiguous.
DO $$
BEGIN
    IF to_regprocedure(format('%I.leasefence_admit(text, bigint, text)', current_schema())) IS NOT NULL THEN
        EXECUTE format('DROP FUNCTION %I.leasefence_admit(text, bigint, text)', current_schema());
    END IF;
END
$$;

DO $install$
BEGIN
    EXECUTE replace($function$
CREATE OR REPLACE FUNCTION @schema@.leasefence_admit(p_resource text, p_token bigint, p_mode text DEFAULT 'strict',
                                                     p_signature text DEFAULT NULL)
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
           SET last_token = p_token, mode = p_mode, updated_at = now(), signature = p_signature
         WHERE f.resource = p_resource
           AND (f.last_token < p_token OR (p_mode = 'monotonic' AND f.last_token = p_token));
        IF FOUND THEN
            RETURN;
        END IF;
        INSERT INTO @schema@.leasefence_fences (resource, last_token, mode, updated_at, signature)
        VALUES (p_resource, p_token, p_mode, now(), p_signature)
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

-- Signed fences (version 5). The keys that verify the coordinator's
-- signatures (HMAC-SHA256, see leasefence-core's signing module): at most two,
-- the current one and the next, so keys rotate without a gap. Readable by
-- nobody but the installer: the trigger function below reads it as its owner
-- (SECURITY DEFINER), so a role that runs effects can check fences without
-- being able to sign them. Managed with leasefence_fence_key_add / _remove.
CREATE EXTENSION IF NOT EXISTS pgcrypto;

CREATE TABLE IF NOT EXISTS leasefence_fence_keys (
    key_id   text PRIMARY KEY,
    secret   bytea NOT NULL,
    added_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON leasefence_fence_keys FROM PUBLIC;

-- The trigger function and the key functions are created with the install
-- schema and pgcrypto's schema written into them (`@schema@`, `@crypto@`),
-- and run with a fixed search_path, so no caller's objects can stand in for
-- ours.
DO $install$
DECLARE
    crypto text;
    body   text;
BEGIN
    SELECT quote_ident(n.nspname) INTO crypto
      FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'pgcrypto';
    FOREACH body IN ARRAY ARRAY[$function$
CREATE OR REPLACE FUNCTION @schema@.leasefence_fence_signature()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    v_signature text := NEW.signature;
    v_key_id    text := '';
    v_secret    bytea;
    v_reason    text;
    v_why       text;
BEGIN
    -- Never kept: the column only carries the signature to this check.
    NEW.signature := NULL;
    IF v_signature IS NULL THEN
        v_reason := 'missing';
        v_why := 'the fence carries no signature, and this arbiter requires one';
    ELSIF v_signature !~ '^v1\.[a-z0-9_-]{1,32}\.[0-9a-f]{64}$' THEN
        v_reason := 'malformed';
        v_why := 'the signature must be v1.<key id>.<64 lowercase hex digits>';
    ELSE
        v_key_id := split_part(v_signature, '.', 2);
        SELECT k.secret INTO v_secret FROM @schema@.leasefence_fence_keys k WHERE k.key_id = v_key_id;
        IF NOT FOUND THEN
            v_reason := 'unknown_key';
            v_why := format('the signature names key %s, which this arbiter does not hold', v_key_id);
        -- Both MACs are hashed again under the secret before they are
        -- compared, so the comparison's time, which may stop at the first
        -- differing byte, tells nothing about the expected MAC.
        ELSIF @crypto@.hmac(@crypto@.hmac(convert_to(format(E'leasefence-fence-v1\n%s\n%s\n%s',
                                                           v_key_id, NEW.resource, NEW.last_token), 'UTF8'),
                                        v_secret, 'sha256'), v_secret, 'sha256')
              <> @crypto@.hmac(decode(split_part(v_signature, '.', 3), 'hex'), v_secret, 'sha256') THEN
            v_reason := 'mismatch';
            v_why := 'the signature does not match the fence (forged, or issued for another resource or token)';
        ELSE
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'LF004',
        MESSAGE = format('bad fence signature for %s: %s', NEW.resource, v_why),
        DETAIL = format('reason=%s key=%s resource=%s', v_reason, v_key_id, NEW.resource),
        HINT = 'present the fence with the signature the coordinator issued for it';
END
$body$
$function$, $function$
-- Installs (or replaces the secret of) a verifying key: `p_key_id` is 1..=32
-- of [a-z0-9_-], `p_secret` 32 bytes. At most two keys. From the first key on,
-- every write of the fence table must carry a valid signature.
CREATE OR REPLACE FUNCTION @schema@.leasefence_fence_key_add(p_key_id text, p_secret bytea)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $body$
BEGIN
    IF p_key_id IS NULL OR p_key_id !~ '^[a-z0-9_-]{1,32}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'LF002',
            MESSAGE = format('leasefence_fence_key_add: the key id must be 1..=32 of [a-z0-9_-], got %L', p_key_id);
    END IF;
    IF p_secret IS NULL OR octet_length(p_secret) <> 32 THEN
        RAISE EXCEPTION USING ERRCODE = 'LF002',
            MESSAGE = 'leasefence_fence_key_add: the secret must be 32 bytes';
    END IF;
    LOCK TABLE @schema@.leasefence_fence_keys IN EXCLUSIVE MODE;
    IF NOT EXISTS (SELECT 1 FROM @schema@.leasefence_fence_keys WHERE key_id = p_key_id)
       AND (SELECT count(*) FROM @schema@.leasefence_fence_keys) >= 2 THEN
        RAISE EXCEPTION USING ERRCODE = 'LF002',
            MESSAGE = format('leasefence_fence_key_add: two keys are installed (%s); remove one before adding %s',
                             (SELECT string_agg(key_id, ', ' ORDER BY key_id) FROM @schema@.leasefence_fence_keys), p_key_id);
    END IF;
    INSERT INTO @schema@.leasefence_fence_keys (key_id, secret) VALUES (p_key_id, p_secret)
    ON CONFLICT (key_id) DO UPDATE SET secret = excluded.secret, added_at = now();
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                    WHERE tgrelid = '@schema@.leasefence_fences'::regclass
                      AND tgname = 'leasefence_fence_signature') THEN
        CREATE TRIGGER leasefence_fence_signature
            BEFORE INSERT OR UPDATE ON @schema@.leasefence_fences
            FOR EACH ROW EXECUTE FUNCTION @schema@.leasefence_fence_signature();
    END IF;
END
$body$
$function$, $function$
-- Removes a key; true if it was installed. Without keys the trigger goes
-- too, and fences are no longer checked (nor slowed down).
CREATE OR REPLACE FUNCTION @schema@.leasefence_fence_key_remove(p_key_id text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    v_found boolean;
BEGIN
    LOCK TABLE @schema@.leasefence_fence_keys IN EXCLUSIVE MODE;
    DELETE FROM @schema@.leasefence_fence_keys WHERE key_id = p_key_id;
    v_found := FOUND;
    IF NOT EXISTS (SELECT 1 FROM @schema@.leasefence_fence_keys) THEN
        DROP TRIGGER IF EXISTS leasefence_fence_signature ON @schema@.leasefence_fences;
    END IF;
    RETURN v_found;
END
$body$
$function$] LOOP
        EXECUTE replace(replace(body, '@schema@', quote_ident(current_schema())), '@crypto@', crypto);
    END LOOP;
END
$install$;
REVOKE ALL ON FUNCTION leasefence_fence_key_add(text, bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION leasefence_fence_key_remove(text) FROM PUBLIC;

INSERT INTO leasefence_schema_version (component, version) VALUES ('arbiter', 5)
ON CONFLICT (component) DO UPDATE SET version = excluded.version, installed_at = now();
