//! `leasefence serve`: the coordinator, on its embedded store or, with
//! `--store`, as one of several coordinators sharing PostgreSQL or etcd.
//!
//! Protected mode: without access control (`--auth FILE`) it binds loopback
//! only; any other `--listen` is refused unless `--insecure` says so (cf.
//! Redis's protected mode). etcd and ZooKeeper ship open; leasefence does not.
//!
//! TLS (`--tls-cert`, `--tls-key`, optionally `--tls-client-ca` for client
//! certificates) encrypts the port; it is not access control, so protected
//! mode applies with it as without it.

use std::net::SocketAddr;

use leasefence_server::tls::{Tls, TlsFiles};
use leasefence_server::{HaConfig, Server, ServerConfig, ServerError};

use crate::cli::ServeArgs;
use crate::store_url::StoreUrl;
use crate::{CmdResult, Failure};

/// Writes one start line to stdout, for scripts to learn the bound ports. A
/// reader that has gone (a closed pipe, a log shipper that died) is no
/// reason to stop serving: a failed write is logged, not a panic.
pub(crate) fn announce(line: std::fmt::Arguments<'_>) {
    if let Err(e) = crate::out::line(line) {
        tracing::warn!(error = %e, "could not write the start line to stdout");
    }
}

pub async fn run(a: ServeArgs) -> CmdResult {
    let policy = a.auth.as_deref().map(crate::auth_cmd::load_policy).transpose()?;
    protected_mode("--listen", a.listen, a.insecure, policy.is_some())?;
    if let Some(frames) = a.frames_listen {
        protected_mode("--frames-listen", frames, a.insecure, policy.is_some())?;
    }
    let lease = leasefence_core::Config::new(a.ttl_min, a.ttl_max, a.waiters_max)
        .map_err(Failure::invalid)?
        .with_lock_delay_max(a.lock_delay_max);
    let mut config = ServerConfig::new(a.listen, a.data_dir.clone());
    config.lease = lease;
    config.wait_max = a.wait_max;
    config.commit_spin = a.commit_spin;
    config.connection_idle = a.connection_idle;
    config.metrics = leasefence_server::metrics::install_prometheus();
    if let Some(path) = &a.fence_key {
        let key = crate::fence_key_cmd::read("--fence-key", path)?;
        tracing::info!(key_id = key.id(), "signing fences");
        config.fence_key = Some(key);
    }
    if let Some(p) = &policy {
        tracing::info!(principals = p.principals().len(), "access control on");
    }
    config.policy = policy;
    config.limits = leasefence_server::auth::Limits {
        leases_per_principal_max: a.leases_per_principal_max,
        waiters_per_principal_max: a.waiters_per_principal_max,
        watchers_max: a.watchers_max,
        watchers_per_principal_max: a.watchers_per_principal_max,
        connections_max: a.connections_max,
    };
    config.tls = tls(&a)?;
    config.frames_listen = a.frames_listen;
    let (server, at) = match &a.store {
        None => {
            if a.advertise.is_some() {
                return Err(Failure::invalid(
                    "--advertise (or LEASEFENCE_ADVERTISE, or `advertise` in --config) is for a shared store: \
                     it says where a standby sends clients, and without --store there is no standby; \
                     give --store postgres://… or etcd://…, or leave --advertise out",
                ));
            }
            let at = format!("data dir {}", config.data_dir.display());
            let server = Server::bind(config).await?;
            crate::volatile::warn_if_volatile("coordinator", &a.data_dir);
            (server, at)
        }
        Some(url) => {
            let store = StoreUrl::parse(url).map_err(Failure::invalid)?;
            let ha = ha_config(&a)?;
            let at = format!("store {store}, advertised as {}", ha.advertise);
            (bind_shared(config, &store, a.store_prefix.as_deref(), ha).await?, at)
        }
    };
    // Before the listening line: from then on SIGTERM stops it gracefully.
    let shutdown = shutdown_signal();
    // One line on stdout, so scripts (and tests) learn the bound port when --listen used port 0.
    let tls = if a.tls_cert.is_some() { ", TLS" } else { "" };
    announce(format_args!(
        "leasefence listening on {} ({at}{tls})",
        server.local_addr()?
    ));
    if let Some(frames) = server.frames_addr() {
        let scheme = if a.tls_cert.is_some() {
            "leasefences"
        } else {
            "leasefence"
        };
        announce(format_args!("leasefence frames on {scheme}://{}", frames?));
    }
    match server.run(shutdown).await {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(())
        }
        Err(e @ ServerError::Fatal(_)) => Err(Failure::new(Failure::FATAL, e)),
        Err(e) => Err(e.into()),
    }
}

/// Refuses a non-loopback `--listen` (or `--frames-listen`, named by `flag`)
/// without access control unless `--insecure`; warns when it is.
fn protected_mode(flag: &str, listen: SocketAddr, insecure: bool, auth: bool) -> Result<(), Failure> {
    if listen.ip().is_loopback() || auth {
        return Ok(());
    }
    if insecure {
        tracing::warn!(
            %listen,
            "--insecure: serving a non-loopback address without access control; anyone who reaches \
             this port can take, release or watch any lease"
        );
        return Ok(());
    }
    Err(Failure::invalid(format!(
        "{flag} {listen} is not a loopback address, and this coordinator has no access control: \
         anyone who reaches the port could take, release or watch any lease. Give --auth FILE (access \
         control, see docs/security.md), listen on 127.0.0.1 or [::1] (the default is {}), or pass \
         --insecure to serve this address without access control",
        leasefence_server::ServerConfig::DEFAULT_LISTEN
    )))
}

/// `--leader-ttl` and `--advertise`, checked.
fn ha_config(a: &ServeArgs) -> Result<HaConfig, Failure> {
    if a.leader_ttl < HaConfig::LEADER_TTL_MIN || a.leader_ttl > HaConfig::LEADER_TTL_MAX {
        return Err(Failure::invalid(format!(
            "--leader-ttl {} is out of range; allowed: {}..={} (default 5s)",
            humantime::format_duration(a.leader_ttl),
            humantime::format_duration(HaConfig::LEADER_TTL_MIN),
            humantime::format_duration(HaConfig::LEADER_TTL_MAX),
        )));
    }
    let advertise = match &a.advertise {
        Some(url) => checked_advertise(url)?,
        None => default_advertise(a.listen, a.tls_cert.is_some())?,
    };
    Ok(HaConfig {
        leader_ttl: a.leader_ttl,
        advertise,
    })
}

/// `--tls-cert`, `--tls-key` and `--tls-client-ca`, loaded and checked.
fn tls(a: &ServeArgs) -> Result<Option<Tls>, Failure> {
    let (cert, key) = match (&a.tls_cert, &a.tls_key, &a.tls_client_ca) {
        (None, None, None) => return Ok(None),
        (Some(cert), Some(key), _) => (cert.clone(), key.clone()),
        (None, Some(_), _) | (None, None, Some(_)) => {
            return Err(Failure::invalid(
                "--tls-key and --tls-client-ca need --tls-cert FILE (the server's certificate chain, PEM)",
            ));
        }
        (Some(_), None, _) => {
            return Err(Failure::invalid(
                "--tls-cert needs --tls-key FILE (its private key, PEM)",
            ));
        }
    };
    let files = TlsFiles {
        cert,
        key,
        client_ca: a.tls_client_ca.clone(),
    };
    Tls::load(&files).map(Some).map_err(Failure::invalid)
}

/// `--advertise`, checked as clients check the leader hints they are sent
/// (a client drops a hint it cannot use, so a bad URL here would only show
/// later, as standbys that send nobody anywhere).
fn checked_advertise(url: &str) -> Result<String, Failure> {
    leasefence_client::check_coordinator_url(url).map_err(|e| {
        Failure::invalid(format!(
            "--advertise: {} (the URL a standby sends clients to while this coordinator is active)",
            e.message()
        ))
    })?;
    Ok(url.trim_end_matches('/').to_string())
}

/// `http(s)://` + `--listen`, when that names one reachable address and port.
fn default_advertise(listen: SocketAddr, tls: bool) -> Result<String, Failure> {
    if listen.ip().is_unspecified() || listen.port() == 0 {
        return Err(Failure::invalid(format!(
            "--listen {listen} does not say where clients reach this coordinator; give --advertise URL \
             (the URL a standby sends clients to while this one is active)"
        )));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{listen}"))
}

/// Opens the shared store (which may install its tables or keys) and binds.
async fn bind_shared(
    config: ServerConfig,
    store: &StoreUrl,
    prefix: Option<&str>,
    ha: HaConfig,
) -> Result<Server, Failure> {
    let prefix = prefix.map(str::to_string);
    match store {
        StoreUrl::Postgres(url) => {
            let url = url.clone();
            let opened = tokio::task::spawn_blocking(move || {
                let mut c = leasefence_store::PostgresConfig::new(&url)?;
                if let Some(schema) = &prefix {
                    c = c.with_schema(schema)?;
                }
                leasefence_store::PostgresShared::open(c)
            })
            .await
            .map_err(|e| Failure::new(Failure::INTERNAL, e))?;
            let shared = opened.map_err(|e| Failure::new(Failure::INTERNAL, anyhow::anyhow!("--store: {e}")))?;
            Ok(Server::bind_shared(config, shared, ha).await?)
        }
        StoreUrl::Etcd(url) => bind_etcd(config, url, prefix, ha).await,
    }
}

#[cfg(feature = "etcd")]
async fn bind_etcd(config: ServerConfig, url: &str, prefix: Option<String>, ha: HaConfig) -> Result<Server, Failure> {
    let mut c = leasefence_store::EtcdConfig::from_url(url).map_err(|e| Failure::invalid(format!("--store: {e}")))?;
    if let Some(p) = &prefix {
        c = c
            .with_prefix(p)
            .map_err(|e| Failure::invalid(format!("--store-prefix: {e}")))?;
    }
    let opened = tokio::task::spawn_blocking(move || leasefence_store::EtcdShared::connect(c))
        .await
        .map_err(|e| Failure::new(Failure::INTERNAL, e))?;
    let shared = opened.map_err(|e| Failure::new(Failure::INTERNAL, anyhow::anyhow!("--store: {e}")))?;
    Ok(Server::bind_shared(config, shared, ha).await?)
}

#[cfg(not(feature = "etcd"))]
async fn bind_etcd(_: ServerConfig, _: &str, _: Option<String>, _: HaConfig) -> Result<Server, Failure> {
    Err(Failure::invalid(
        "--store etcd://…: this leasefence was built without etcd; build it with `--features etcd` \
         (it needs protoc), or use postgres://…",
    ))
}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is
/// called, not when the future is first polled: the server's serve loop
/// polls it from a task of its own that may run only after the first
/// connections are served, and a SIGTERM that came before would take the
/// signal's default action (killed, nothing drained). Call it before the
/// listening line is printed.
pub(crate) fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::SignalKind;
    let term = handler(SignalKind::terminate(), "SIGTERM");
    let int = handler(SignalKind::interrupt(), "SIGINT");
    async move {
        tokio::select! {
            () = received(term) => {}
            () = received(int) => {}
        }
    }
}

/// The handler of one signal, installed now; `None` (said once) if it cannot be.
fn handler(kind: tokio::signal::unix::SignalKind, name: &str) -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(kind)
        .inspect_err(|e| tracing::warn!(error = %e, "cannot handle {name}: it will not stop the process gracefully"))
        .ok()
}

/// Completes when `signal` arrives; never without a handler.
async fn received(signal: Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(mut s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}
