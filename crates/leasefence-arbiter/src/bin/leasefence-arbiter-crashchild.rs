//! Test helper for the crash tests (`tests/crash.rs`), not a user tool: loops
//! fenced transactions until it is killed.
//!
//! ```text
//! leasefence-arbiter-crashchild BACKEND LOCATION RESOURCE TABLE START
//! ```
//!
//! BACKEND is `postgres` or `postgres-folded` (LOCATION a URL; the second
//! folds the fence into the effect's statement), `sqlite` or `embedded` (LOCATION a
//! file path; the arbiter must be installed and TABLE must exist for the SQL
//! backends). For i = START, START+1, … it runs one fenced transaction with
//! token i whose effect sets the business row `TABLE[RESOURCE] = i`, and after
//! each commit returns prints `i` on its own line and flushes. The parent
//! SIGKILLs it at a random moment and checks that the fence and the business
//! row agree, and that no printed (acknowledged) token was lost.

use std::io::Write;
use std::process::ExitCode;

use leasefence_arbiter::embedded::EmbeddedArbiter;
use leasefence_arbiter::{ArbiterError, Fence, FenceMode, ResourceId, Token};
use redb::TableDefinition;

struct Args {
    backend: String,
    location: String,
    resource: ResourceId,
    table: String,
    start: Token,
}

fn parse_args() -> Result<Args, String> {
    let v: Vec<String> = std::env::args().skip(1).collect();
    let [backend, location, resource, table, start] = v.as_slice() else {
        return Err("usage: leasefence-arbiter-crashchild BACKEND LOCATION RESOURCE TABLE START".into());
    };
    // The table name is spliced into SQL: allow identifiers only.
    if table.is_empty()
        || !table
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!("TABLE must match [a-z0-9_]+, got {table:?}"));
    }
    let start = start
        .parse::<u64>()
        .ok()
        .and_then(Token::new)
        .ok_or_else(|| format!("START must be a token (1..), got {start:?}"))?;
    Ok(Args {
        backend: backend.clone(),
        location: location.clone(),
        resource: ResourceId::new(resource).map_err(|e| e.to_string())?,
        table: table.clone(),
        start,
    })
}

/// Prints an acknowledged token; the parent reads it only after the commit returned.
fn ack(token: Token) -> Result<(), ArbiterError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{token}")
        .and_then(|()| out.flush())
        .map_err(|e| ArbiterError::Task(format!("stdout: {e}")))
}

fn next(token: Token) -> Result<Token, ArbiterError> {
    token
        .next()
        .ok_or_else(|| ArbiterError::Task("token space exhausted".into()))
}

fn run_sqlite(a: &Args) -> Result<(), ArbiterError> {
    let mut conn = rusqlite::Connection::open(&a.location)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    let sql = format!(
        "INSERT INTO {} (key, token) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET token = excluded.token",
        a.table
    );
    let mut token = a.start;
    loop {
        let fence = Fence::new(a.resource.clone(), token);
        let value = i64::try_from(token.get()).map_err(|_| ArbiterError::Task("token above i64::MAX".into()))?;
        leasefence_arbiter::sqlite::with_fence(&mut conn, &fence, FenceMode::Strict, |tx| {
            tx.execute(&sql, rusqlite::params![a.resource.as_str(), value])?;
            Ok::<_, ArbiterError>(())
        })?;
        ack(token)?;
        token = next(token)?;
    }
}

fn run_embedded(a: &Args) -> Result<(), ArbiterError> {
    let arbiter = EmbeddedArbiter::open(std::path::Path::new(&a.location))?;
    let business: TableDefinition<&str, u64> = TableDefinition::new(&a.table);
    let mut token = a.start;
    loop {
        let fence = Fence::new(a.resource.clone(), token);
        arbiter.write(&fence, FenceMode::Strict, |tx| {
            let mut t = tx.open_table(business).map_err(redb::Error::from)?;
            t.insert(a.resource.as_str(), token.get()).map_err(redb::Error::from)?;
            Ok::<_, ArbiterError>(())
        })?;
        ack(token)?;
        token = next(token)?;
    }
}

async fn run_postgres(a: &Args, folded: bool) -> Result<(), ArbiterError> {
    use leasefence_arbiter::postgres::{FencedStatement, connect, with_fence};
    let mut client = connect(&a.location).await?;
    let sql = format!(
        "INSERT INTO {} (key, token) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET token = excluded.token",
        a.table
    );
    let fenced = match folded {
        true => Some(FencedStatement::prepare(&client, &sql).await?),
        false => None,
    };
    let mut token = a.start;
    loop {
        let fence = Fence::new(a.resource.clone(), token);
        let value = i64::try_from(token.get()).map_err(|_| ArbiterError::Task("token above i64::MAX".into()))?;
        let key = a.resource.to_string();
        if let Some(fenced) = &fenced {
            // Inside a transaction of its own, so a kill can also land
            // between the statement and the COMMIT.
            let tx = client.transaction().await?;
            fenced.execute(&tx, &fence, FenceMode::Strict, &[&key, &value]).await?;
            tx.commit().await?;
        } else {
            // `with_fence` wants an effect that owns what it uses.
            let sql = sql.clone();
            with_fence(&mut client, &fence, FenceMode::Strict, |tx| {
                Box::pin(async move {
                    tx.execute(sql.as_str(), &[&key, &value]).await?;
                    Ok::<_, ArbiterError>(())
                })
            })
            .await?;
        }
        ack(token)?;
        token = next(token)?;
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let result = match args.backend.as_str() {
        "sqlite" => run_sqlite(&args),
        "embedded" => run_embedded(&args),
        pg @ ("postgres" | "postgres-folded") => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ArbiterError::Task(format!("tokio runtime: {e}")))
            .and_then(|rt| rt.block_on(run_postgres(&args, pg == "postgres-folded"))),
        other => {
            eprintln!("BACKEND must be postgres, postgres-folded, sqlite or embedded, got {other:?}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crash child failed: {e}");
            ExitCode::FAILURE
        }
    }
}
