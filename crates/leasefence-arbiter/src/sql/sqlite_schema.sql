-- leasefence arbiter schema for SQLite, version 1. Idempotent; run in one
-- IMMEDIATE transaction (the Rust installer does).
CREATE TABLE IF NOT EXISTS leasefence_schema_version (
    component    TEXT PRIMARY KEY,
    version      INTEGER NOT NULL,
    installed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;

CREATE TABLE IF NOT EXISTS leasefence_fences (
    resource   TEXT PRIMARY KEY CHECK (length(CAST(resource AS BLOB)) BETWEEN 1 AND 512),
    last_token INTEGER NOT NULL CHECK (last_token >= 1),
    mode       TEXT NOT NULL CHECK (mode IN ('strict', 'monotonic')),
    updated_at TEXT NOT NULL
) STRICT;
