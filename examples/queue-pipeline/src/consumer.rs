//! The consumer: reads the stream with `nats::consume` and applies each job
//! to the run's table through the PostgreSQL arbiter, the fence admitted and
//! the job id claimed in the same transaction as the insert
//! (`with_fence_once`). A stale job is rejected there, acknowledged once,
//! logged at `warn` and counted in `leasefence_stale_messages_total`.
//!
//! `--without-arbiter` swaps in the control: the same insert with no fence
//! check, as a consumer that ignores tokens would do it.

use std::sync::Arc;

use anyhow::Context;
use async_nats::jetstream::consumer::PullConsumer;
use leasefence_arbiter::postgres;
use leasefence_arbiter::queue::{self, HandleError, Handled, Message, QueueError, Settings, Tally};
use leasefence_arbiter::{ArbiterError, Fence, nats};
use tokio::sync::{Mutex, oneshot, watch};
use tokio::task::JoinHandle;

use crate::services::Names;

/// The `queue` label of the consumer's counters.
pub const QUEUE: &str = "queue-pipeline";

/// What the consumer has done so far, for the driver to wait on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Jobs handed to the handler.
    pub handled: u64,
    /// Jobs whose insert committed.
    pub applied: u64,
    /// Stale jobs rejected and acknowledged (from `on_stale`).
    pub stale: u64,
}

/// How the consumer applies a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Apply {
    /// Through the PostgreSQL arbiter: the fence and the job id commit
    /// with the insert, or nothing does.
    Fenced,
    /// The control: the insert alone.
    Unfenced,
}

/// A running consumer; dropped without [`Consumer::stop`] (a failed run),
/// its task is aborted.
pub struct Consumer {
    pub progress: watch::Receiver<Progress>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<Tally, QueueError>>,
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Consumer {
    /// Starts consuming `pull` into the run's table.
    pub fn start(pull: PullConsumer, pg: Arc<Mutex<tokio_postgres::Client>>, names: &Names, apply: Apply) -> Consumer {
        let (progress_tx, progress) = watch::channel(Progress::default());
        let progress_tx = Arc::new(progress_tx);
        let on_stale = progress_tx.clone();
        let settings = Settings::new(QUEUE).on_stale(move |_stale| on_stale.send_modify(|p| p.stale += 1));
        let job = Job {
            pg,
            table: names.table.clone(),
            consumer: names.consumer.clone(),
            apply,
            progress: progress_tx,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let handler = move |fence: Fence, message: Message| {
                let job = job.clone();
                async move { job.handle(fence, message).await }
            };
            let shutdown = async {
                let _ = stopped.await;
            };
            nats::consume(&pull, &settings, handler, shutdown).await
        });
        Consumer {
            progress,
            stop: Some(stop),
            task,
        }
    }

    /// Stops the consumer after the job it is handling, and returns its
    /// verdicts.
    pub async fn stop(mut self) -> anyhow::Result<Tally> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let tally = (&mut self.task).await.context("the consumer task failed")??;
        Ok(tally)
    }
}

/// What the handler needs to apply one job.
#[derive(Clone)]
struct Job {
    pg: Arc<Mutex<tokio_postgres::Client>>,
    table: String,
    consumer: String,
    apply: Apply,
    progress: Arc<watch::Sender<Progress>>,
}

impl Job {
    async fn handle(&self, fence: Fence, message: Message) -> Result<Handled, HandleError> {
        self.progress.send_modify(|p| p.handled += 1);
        let id = message
            .id
            .ok_or_else(|| HandleError::Poison("the job has no message id".into()))?;
        let (worker, job) = parse(&message.payload).map_err(HandleError::Poison)?;
        let handled = match self.apply {
            Apply::Fenced => self.apply_fenced(&fence, &id, worker, job).await?,
            Apply::Unfenced => self.apply_unfenced(&fence, &id, worker, job).await?,
        };
        if handled == Handled::Applied {
            self.progress.send_modify(|p| p.applied += 1);
        }
        Ok(handled)
    }

    fn insert_sql(&self) -> String {
        format!(
            "INSERT INTO {} (worker, job, token, message_id) VALUES ($1, $2, $3, $4)",
            self.table
        )
    }

    async fn apply_fenced(&self, fence: &Fence, id: &str, worker: String, job: i32) -> Result<Handled, ArbiterError> {
        let mut pg = self.pg.lock().await;
        let (insert, token, id_owned) = (self.insert_sql(), token_sql(fence)?, id.to_owned());
        let once = postgres::with_fence_once(&mut pg, &self.consumer, id, fence, queue::MODE, |tx| {
            Box::pin(async move {
                tx.execute(&insert, &[&worker, &job, &token, &id_owned]).await?;
                Ok::<_, ArbiterError>(())
            })
        })
        .await?;
        Ok(Handled::from(once))
    }

    async fn apply_unfenced(&self, fence: &Fence, id: &str, worker: String, job: i32) -> Result<Handled, ArbiterError> {
        let pg = self.pg.lock().await;
        pg.execute(&self.insert_sql(), &[&worker, &job, &token_sql(fence)?, &id])
            .await?;
        Ok(Handled::Applied)
    }
}

/// The token as PostgreSQL's `bigint`.
fn token_sql(fence: &Fence) -> Result<i64, ArbiterError> {
    i64::try_from(fence.token.get()).map_err(|_| {
        ArbiterError::Invalid(leasefence_core::Invalid::new(
            "token",
            "must fit PostgreSQL's bigint (at most 2^63 - 1)",
        ))
    })
}

/// A job's payload, `WORKER JOB` (see `worker::payload`).
fn parse(payload: &[u8]) -> Result<(String, i32), String> {
    let text = std::str::from_utf8(payload).map_err(|_| "the job's payload is not UTF-8".to_owned())?;
    let (worker, job) = text
        .split_once(' ')
        .ok_or_else(|| format!("the job's payload {text:?} is not `WORKER JOB`"))?;
    let job = job
        .parse()
        .map_err(|_| format!("the job number in {text:?} is not an integer"))?;
    Ok((worker.to_owned(), job))
}

/// What the table holds at the end, against the current token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableCheck {
    pub rows: u64,
    /// Rows written with a token below the current one.
    pub stale: u64,
    /// Rows of the current holder, written with the current token.
    pub current: u64,
}

/// Reads the table back and compares every row's token with `current`.
pub async fn check_table(
    pg: &tokio_postgres::Client,
    names: &Names,
    current: u64,
    current_holder: &str,
) -> anyhow::Result<TableCheck> {
    let current = i64::try_from(current).context("the current token does not fit a bigint")?;
    let sql = format!(
        "SELECT count(*), count(*) FILTER (WHERE token < $1), \
         count(*) FILTER (WHERE token = $1 AND worker = $2) FROM {}",
        names.table
    );
    let row = pg
        .query_one(&sql, &[&current, &current_holder])
        .await
        .with_context(|| format!("reading the table {}", names.table))?;
    let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
    Ok(TableCheck {
        rows: count(0),
        stale: count(1),
        current: count(2),
    })
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_payload_reads_as_worker_and_job_or_is_refused_with_why() {
        assert_eq!(parse(b"worker-b 3"), Ok(("worker-b".to_owned(), 3)));
        assert!(parse(b"worker-b").unwrap_err().contains("not `WORKER JOB`"));
        assert!(parse(b"worker-b three").unwrap_err().contains("not an integer"));
        assert!(parse(&[0xff, b' ', b'1']).unwrap_err().contains("UTF-8"));
    }
}
