//! NATS JetStream and PostgreSQL: connecting with a clear error when one is
//! unreachable, and what one run creates there (a stream with its consumer,
//! a jobs table) and removes again, whatever the outcome.

use std::time::Duration;

use anyhow::{Context, anyhow};
use async_nats::jetstream::consumer::{self, AckPolicy, PullConsumer};
use async_nats::jetstream::{self, stream};
use leasefence_arbiter::postgres;

/// How long connecting to a service may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// How long the stream waits for an ack before it delivers a job again.
const ACK_WAIT: Duration = Duration::from_secs(10);

/// Deliveries of one job at most: a job that keeps failing is dropped by
/// the stream rather than retried forever.
const DELIVERIES_MAX: i64 = 5;

/// `url` with any password replaced by `***`, fit for messages.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let Some(at) = rest.find('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!("{}{}:***{}", &url[..scheme_end], &rest[..colon], &rest[at..]),
        None => url.to_owned(),
    }
}

/// A JetStream context on the NATS server at `url`.
pub async fn jetstream(url: &str) -> anyhow::Result<jetstream::Context> {
    let unreachable = || {
        format!(
            "cannot reach NATS at {} (a NATS server with JetStream is needed)",
            redact(url)
        )
    };
    let client = tokio::time::timeout(CONNECT_LIMIT, async_nats::connect(url))
        .await
        .map_err(|_| anyhow!("no answer within {} s", CONNECT_LIMIT.as_secs()))
        .with_context(unreachable)?
        .with_context(unreachable)?;
    Ok(jetstream::new(client))
}

/// A client of the PostgreSQL at `url`, with the arbiter's schema installed.
pub async fn postgres(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let unreachable = || {
        format!(
            "cannot reach PostgreSQL at {} (is it running and accepting connections?)",
            redact(url)
        )
    };
    let mut client = tokio::time::timeout(CONNECT_LIMIT, postgres::connect(url))
        .await
        .map_err(|_| anyhow!("no answer within {} s", CONNECT_LIMIT.as_secs()))
        .with_context(unreachable)?
        .with_context(unreachable)?;
    postgres::install(&mut client)
        .await
        .context("installing the arbiter's tables in PostgreSQL")?;
    Ok(client)
}

/// The names one run uses, all made unique by its id, so that runs never
/// meet (nor meet what an interrupted run left behind).
#[derive(Clone, Debug)]
pub struct Names {
    pub run_id: String,
    pub stream: String,
    pub subject: String,
    pub table: String,
    /// The consumer's name in `leasefence_consumed` (its applied job ids).
    pub consumer: String,
    /// The leased resource, and the fence's key in PostgreSQL.
    pub resource: String,
}

impl Names {
    pub fn fresh() -> anyhow::Result<Names> {
        let id = format!("{:012x}", getrandom::u64().context("no OS randomness")? >> 16);
        Ok(Names {
            stream: format!("QUEUE_PIPELINE_{id}"),
            subject: format!("queue-pipeline.{id}.jobs"),
            table: format!("queue_pipeline_jobs_{id}"),
            consumer: format!("queue-pipeline-{id}"),
            resource: format!("pipeline/report-{id}"),
            run_id: id,
        })
    }
}

/// Creates the run's stream and its pull consumer.
pub async fn create_stream(js: &jetstream::Context, names: &Names) -> anyhow::Result<PullConsumer> {
    let stream = js
        .create_stream(stream::Config {
            name: names.stream.clone(),
            subjects: vec![names.subject.clone()],
            ..Default::default()
        })
        .await
        .with_context(|| format!("creating the JetStream stream {} (is JetStream enabled?)", names.stream))?;
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("applier".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_deliver: DELIVERIES_MAX,
            ..Default::default()
        })
        .await
        .context("creating the stream's consumer")
}

/// Creates the run's jobs table: one row per applied job, with the worker
/// and the token that wrote it.
pub async fn create_table(pg: &tokio_postgres::Client, names: &Names) -> anyhow::Result<()> {
    pg.batch_execute(&format!(
        "CREATE TABLE {} (seq bigserial PRIMARY KEY, worker text NOT NULL, job integer NOT NULL, \
         token bigint NOT NULL, message_id text NOT NULL)",
        names.table
    ))
    .await
    .with_context(|| format!("creating the table {}", names.table))
}

/// Removes what the run created: its stream, its table, its consumer's
/// job ids and its resource's fence. Every step is tried; the first
/// failure is returned.
pub async fn cleanup(js: &jetstream::Context, pg: &tokio_postgres::Client, names: &Names) -> anyhow::Result<()> {
    let stream = js
        .delete_stream(&names.stream)
        .await
        .map(drop)
        .with_context(|| format!("deleting the stream {}", names.stream));
    let table = pg
        .batch_execute(&format!("DROP TABLE IF EXISTS {}", names.table))
        .await
        .with_context(|| format!("dropping the table {}", names.table));
    let claims = pg
        .execute(
            "DELETE FROM leasefence_consumed WHERE consumer = $1",
            &[&names.consumer],
        )
        .await
        .map(drop)
        .context("deleting the consumer's job ids");
    let fence = pg
        .execute("DELETE FROM leasefence_fences WHERE resource = $1", &[&names.resource])
        .await
        .map(drop)
        .context("deleting the resource's fence");
    stream.and(table).and(claims).and(fence)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_password_in_a_url_is_masked_and_nothing_else_changes() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/test"),
            "postgres://app:***@db:5432/test"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:5432/test"
        );
        assert_eq!(redact("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(redact("not a url"), "not a url");
    }
}
