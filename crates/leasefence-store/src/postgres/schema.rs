//! The PostgreSQL schema the store's tables live in, and every statement the
//! store sends, each naming that schema: a session's `search_path` never
//! decides which tables are used.

use crate::StoreError;

/// The schema version this build installs and reads.
pub(crate) const SCHEMA_VERSION: i32 = 1;

/// The install script (`@schema@` stands for the quoted schema name).
pub(crate) const SCHEMA_SQL: &str = include_str!("../sql/postgres_store_schema.sql");

/// PostgreSQL's limit on an identifier (`NAMEDATALEN - 1`).
const NAME_LEN_MAX: usize = 63;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Schema {
    name: String,
}

impl Schema {
    /// Letters, digits and `_`, not starting with a digit, 1..=63 bytes: a
    /// name that needs no escaping anywhere the install script puts it.
    pub(crate) fn new(name: &str) -> Result<Schema, StoreError> {
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !first_ok || !rest_ok || name.len() > NAME_LEN_MAX {
            return Err(StoreError::Io(format!(
                "invalid PostgreSQL store schema name {name:?}: use 1..={NAME_LEN_MAX} ASCII letters, digits \
                 and underscores, not starting with a digit"
            )));
        }
        Ok(Schema { name: name.to_owned() })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// `object` of this schema, qualified and quoted, ready for SQL.
    pub(crate) fn qualify(&self, object: &str) -> String {
        format!("\"{}\".{object}", self.name)
    }

    pub(crate) fn install_script(&self) -> String {
        SCHEMA_SQL.replace("@schema@", &format!("\"{}\"", self.name))
    }

    pub(crate) fn newer_message(&self, found: i32) -> String {
        format!(
            "leasefence store schema version {found} is installed in schema {:?}; this build reads version \
             {SCHEMA_VERSION} and will not downgrade it: run a newer leasefence",
            self.name
        )
    }

    pub(crate) fn statements(&self) -> Sql {
        let shards = self.qualify("leasefence_shards");
        let records = self.qualify("leasefence_records");
        // `$3` of campaign and renew: the TTL in microseconds. Every time is
        // the database's own clock (clock_timestamp(): the time of the
        // statement's evaluation, also after it waited for a lock).
        let until = "clock_timestamp() + $3 * interval '1 microsecond'";
        Sql {
            // One statement: a first term inserts the row; a later one takes
            // it only if its leadership has lapsed. A racer blocked on the row
            // re-checks the WHERE against the winner's committed row and
            // returns nothing.
            campaign: format!(
                "INSERT INTO {shards} AS s (shard, epoch, leader, expires_at) VALUES ($1, 1, $2, {until}) \
                 ON CONFLICT (shard) DO UPDATE SET epoch = s.epoch + 1, leader = excluded.leader, expires_at = {until} \
                 WHERE s.leader IS NULL OR s.expires_at <= clock_timestamp() \
                 RETURNING s.epoch"
            ),
            renew: format!(
                "UPDATE {shards} SET expires_at = {until} WHERE shard = $1 AND epoch = $2 AND leader IS NOT NULL"
            ),
            resign: format!(
                "UPDATE {shards} SET leader = NULL, expires_at = least(expires_at, clock_timestamp()) \
                 WHERE shard = $1 AND epoch = $2"
            ),
            leader: format!(
                "SELECT epoch, leader FROM {shards} \
                 WHERE shard = $1 AND leader IS NOT NULL AND expires_at > clock_timestamp()"
            ),
            current_epoch: format!("SELECT epoch FROM {shards} WHERE shard = $1"),
            // FOR UPDATE, not FOR KEY SHARE: a campaign's UPDATE must wait for
            // a batch in flight to commit, so that the new leader's load sees
            // it; and a batch that starts after a campaign committed reads the
            // new epoch (READ COMMITTED re-reads a locked row's newest version).
            lock_shard: format!("SELECT epoch FROM {shards} WHERE shard = $1 FOR UPDATE"),
            // Each record of a batch by itself, by the primary key (NULL:
            // absent). A plan PostgreSQL caches for a prepared statement may
            // have been made while the table was nearly empty: one that looks
            // up `resource = ANY($2)` or joins the names to the table may then
            // read the shard's every record, for as long as the plan is kept.
            // A scalar subquery on the whole key is an index probe per record
            // in every plan.
            read: format!(
                "SELECT u.resource, \
                   (SELECT r.record FROM {records} r WHERE r.shard = $1 AND r.resource = u.resource) \
                 FROM unnest($2::text[]) AS u(resource)"
            ),
            upsert: format!(
                "INSERT INTO {records} AS r (shard, resource, epoch, record) \
                 SELECT $1, t.resource, $2, t.record FROM unnest($3::text[], $4::bytea[]) AS t(resource, record) \
                 ON CONFLICT (shard, resource) DO UPDATE \
                 SET epoch = excluded.epoch, record = excluded.record, updated_at = now()"
            ),
            // A batch computed from the records the writer knows, sent with
            // BEGIN, lock_shard and COMMIT in one round trip: it writes only
            // if the epoch is `$2` and every record of the batch (`$5`) still
            // holds the bytes it was computed from (`$6`, NULL: absent), and
            // then writes every changed record (`$3`, `$4`); else nothing.
            // Separate from lock_shard so that its snapshot is taken after the
            // lock is held: every batch committed before it is seen. Each
            // record is looked up by the whole key, as in `read`.
            write_known: format!(
                "WITH fence AS MATERIALIZED ( \
                   SELECT EXISTS (SELECT 1 FROM {shards} WHERE shard = $1 AND epoch = $2) \
                   AND NOT EXISTS ( \
                     SELECT 1 FROM unnest($5::text[], $6::bytea[]) AS c(resource, expected) \
                     WHERE (SELECT k.record FROM {records} k WHERE k.shard = $1 AND k.resource = c.resource) \
                       IS DISTINCT FROM c.expected) AS ok), \
                 written AS ( \
                   INSERT INTO {records} AS r (shard, resource, epoch, record) \
                   SELECT $1, t.resource, $2, t.record \
                   FROM unnest($3::text[], $4::bytea[]) AS t(resource, record), fence WHERE fence.ok \
                   ON CONFLICT (shard, resource) DO UPDATE \
                   SET epoch = excluded.epoch, record = excluded.record, updated_at = now() \
                   RETURNING 1) \
                 SELECT fence.ok, (SELECT count(*) FROM written) FROM fence"
            ),
            load: format!("SELECT resource, record FROM {records} WHERE shard = $1"),
        }
    }
}

/// The text of every statement, before preparing.
pub(crate) struct Sql {
    pub campaign: String,
    pub renew: String,
    pub resign: String,
    pub leader: String,
    pub current_epoch: String,
    pub lock_shard: String,
    pub read: String,
    pub upsert: String,
    pub write_known: String,
    pub load: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_every_statement_names_the_schema() {
        for ok in ["leasefence", "_x", "App_2", &"s".repeat(63)] {
            assert_eq!(Schema::new(ok).expect(ok).name(), ok);
        }
        for bad in ["", "2x", "a-b", "a\"b", "a$b", "ä", &"s".repeat(64)] {
            let e = Schema::new(bad).expect_err(bad);
            assert!(e.to_string().contains("letters, digits"), "{bad:?}: {e}");
        }
        let s = Schema::new("App_2").expect("valid");
        assert!(!s.install_script().contains("@schema@"));
        let sql = s.statements();
        for text in [
            &sql.campaign,
            &sql.renew,
            &sql.resign,
            &sql.leader,
            &sql.current_epoch,
            &sql.lock_shard,
            &sql.read,
            &sql.upsert,
            &sql.write_known,
            &sql.load,
        ] {
            assert!(text.contains("\"App_2\".leasefence_"), "{text}");
        }
    }
}
