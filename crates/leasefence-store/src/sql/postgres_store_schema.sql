-- leasefence shared store schema for PostgreSQL, version 1.
--
-- The tables of `serve --store postgres://…`: one row per shard holding its
-- leadership and epoch, and one row per (shard, resource) holding the record.
--
-- Idempotent: safe to run any number of times, concurrently too. Run it in one
-- transaction (the coordinator does, on its first connection to a database where
-- it is not installed yet). `@schema@` stands for the quoted schema name
-- (`"leasefence"` unless configured): every object is named with it, so a
-- session's search_path never decides which tables are used. By hand:
--   sed 's/@schema@/"leasefence"/g' FILE | psql --single-transaction -f -
--
-- SQLSTATEs raised (class 'LF', leasefence):
--   LF003  a newer schema version is installed; this script will not downgrade it.

-- Serializes concurrent installs (CREATE ... IF NOT EXISTS alone can race).
-- Not the arbiter's key: the two install independently.
SELECT pg_advisory_xact_lock(7237098112370931714);

CREATE SCHEMA IF NOT EXISTS @schema@;

-- The same table as the arbiter's (one row per component), so both can live in
-- one schema.
CREATE TABLE IF NOT EXISTS @schema@.leasefence_schema_version (
    component    text PRIMARY KEY,
    version      integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);

DO $$
DECLARE
    v integer;
BEGIN
    SELECT version INTO v FROM @schema@.leasefence_schema_version WHERE component = 'store';
    IF v IS NOT NULL AND v > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LF003',
            MESSAGE = format('leasefence store schema version %s is installed in schema %s; this build is version 1 and will not downgrade it: run a newer leasefence', v, '@schema@');
    END IF;
END
$$;

-- One row per shard, written by the coordinators' campaign, renew and resign,
-- and locked (FOR UPDATE) by every batch the leader writes. `expires_at` is set
-- and compared with the database's clock only (clock_timestamp()), never with a
-- coordinator's. `leader` is the advertised URL, NULL after a resignation.
-- `epoch` only ever grows: a new term is `epoch + 1`.
CREATE TABLE IF NOT EXISTS @schema@.leasefence_shards (
    shard      bigint PRIMARY KEY,
    epoch      bigint NOT NULL,
    leader     text,
    expires_at timestamptz NOT NULL
);

-- One row per resource ever granted in a shard. `record` is the store's record
-- codec (the bytes the embedded store keeps: version, last token, lease,
-- lock-delay); `epoch` is the term whose leader wrote the row last.
CREATE TABLE IF NOT EXISTS @schema@.leasefence_records (
    shard      bigint NOT NULL,
    resource   text NOT NULL,
    epoch      bigint NOT NULL,
    record     bytea NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard, resource)
);

INSERT INTO @schema@.leasefence_schema_version (component, version) VALUES ('store', 1)
ON CONFLICT (component) DO UPDATE SET version = excluded.version, installed_at = now();
