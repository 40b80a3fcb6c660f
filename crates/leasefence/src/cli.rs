//! Command-line arguments (clap) and dispatch to the commands.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use leasefence_client::{Client, ClientOptions, ClientTls};

use crate::{
    CmdResult, Failure, arbiter_cmd, auth_cmd, bench, client_cmds, demo, elect_cmd, fence_key_cmd, gateway_cmd,
    observe_cmd, run_cmd, serve, watch_cmd,
};

/// leasefence: leases with fencing tokens, and the arbiters that enforce them.
#[derive(Parser, Debug)]
#[command(name = "leasefence", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    pub fn default_log_level(&self) -> &'static str {
        match self.command {
            Command::Serve(_) | Command::Gateway(_) => "info",
            _ => "warn",
        }
    }

    /// How logs are written: `serve --log-format`, text for every other command.
    pub fn log_format(&self) -> LogFormat {
        match &self.command {
            Command::Serve(a) => a.log_format,
            _ => LogFormat::Text,
        }
    }
}

/// The shape of log lines on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event (coloured only on a terminal).
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields`, `target`.
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the coordinator on its embedded store.
    Serve(ServeArgs),
    /// Acquire a lease; prints its token and lease id.
    Acquire(AcquireArgs),
    /// Renew a lease (keeps its token).
    Renew(LeaseArgs),
    /// Release a lease.
    Release(LeaseArgs),
    /// Show who holds a resource and its last token.
    Status(StatusArgs),
    /// End a resource's lease whoever holds it (needs `admin`; audited).
    ForceRelease(auth_cmd::ForceReleaseArgs),
    /// Access control helpers: `auth hash-token`.
    #[command(subcommand)]
    Auth(auth_cmd::AuthCommand),
    /// Run a command while holding a lease; stop it if the lease is lost.
    Run(run_cmd::RunArgs),
    /// Campaign for leadership of a name, then run a command as its leader.
    Elect(elect_cmd::ElectArgs),
    /// Print each change of a name's leader as it happens.
    Observe(observe_cmd::ObserveArgs),
    /// Resource-side arbiters: install, check, put.
    #[command(subcommand)]
    Arbiter(arbiter_cmd::ArbiterCommand),
    /// The fenced object store: an HTTP gateway whose writes carry a fence,
    /// committed atomically with the object's bytes.
    Gateway(gateway_cmd::GatewayArgs),
    /// Print grants, releases and expiries of a resource (or prefix) as they happen.
    Watch(watch_cmd::WatchArgs),
    /// The paused-worker story, end to end, in one process.
    Demo,
    /// Measure acquire+release cycles through a coordinator, beside etcd, Redis or a no-op.
    Bench(bench::BenchArgs),
    /// Keys for signed fences: `fence-key new > key` for `serve --fence-key`.
    #[command(subcommand, name = "fence-key")]
    FenceKey(fence_key_cmd::FenceKeyCommand),
    /// Print a shell completion script, e.g. `leasefence completions bash >
    /// /etc/bash_completion.d/leasefence`.
    Completions(CompletionsArgs),
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 10s, 2m)"))
}

pub(crate) fn parse_commit_spin(s: &str) -> Result<Duration, String> {
    let spin = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 0, 200us, 1ms)"))?;
    let max = leasefence_store::IDLE_SPIN_MAX;
    if spin > max {
        return Err(format!(
            "must be at most {} (0 turns the spin off)",
            humantime::format_duration(max)
        ));
    }
    Ok(spin)
}

/// `--connection-idle`: a duration from 1s to 24h.
pub(crate) fn parse_connection_idle(s: &str) -> Result<Duration, String> {
    let idle = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 5m, 1h)"))?;
    let (min, max) = (Duration::from_secs(1), Duration::from_secs(24 * 3600));
    if idle < min || idle > max {
        return Err("must be from 1s to 24h".to_string());
    }
    Ok(idle)
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address for gRPC and HTTP/JSON.
    #[arg(long, default_value = leasefence_server::ServerConfig::DEFAULT_LISTEN, env = "LEASEFENCE_LISTEN")]
    pub listen: SocketAddr,
    /// Also serve the frame protocol (`leasefence://`, a lean binary wire for
    /// acquire, renew, release and status; see docs/frames.md) on this
    /// address, with the same TLS, access control and protected mode.
    #[arg(long, env = "LEASEFENCE_FRAMES_LISTEN", value_name = "ADDR")]
    pub frames_listen: Option<SocketAddr>,
    /// Directory of the embedded store (created if missing).
    #[arg(long, default_value = leasefence_server::ServerConfig::DEFAULT_DATA_DIR, env = "LEASEFENCE_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Log lines as text or as one JSON object per line.
    #[arg(long, value_enum, default_value = "text", env = "LEASEFENCE_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Shortest TTL a client may ask for.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub ttl_min: Duration,
    /// Longest TTL a client may ask for. Leases granted before it was
    /// lowered keep their TTL (a warning at start counts them).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub ttl_max: Duration,
    /// Longest an acquire may wait for a busy resource.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub wait_max: Duration,
    /// Most acquires queued on one resource.
    #[arg(long, default_value_t = 1024)]
    pub waiters_max: usize,
    /// Longest lock-delay an acquire may ask for.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub lock_delay_max: Duration,
    /// How long the store's writer keeps looking for work after a commit of
    /// one or two mutations before it sleeps: a thread woken from sleep
    /// answers later, most of all on a virtual machine. A call waiting alone for a commit looks for it
    /// as long. Costs up to this much CPU per commit, none while idle; 0
    /// turns both off. At most 10ms.
    #[arg(long, default_value = "200us", value_parser = parse_commit_spin)]
    pub commit_spin: Duration,
    /// Keep the records in an engine several coordinators share, for high
    /// availability: postgres://… or etcd://HOST:PORT[,HOST:PORT…]. Without
    /// it, the embedded store under --data-dir.
    #[arg(long, env = "LEASEFENCE_STORE")]
    pub store: Option<String>,
    /// Where in the shared store: the etcd key prefix, or the PostgreSQL
    /// schema (default `/leasefence/` on etcd, `leasefence` on PostgreSQL).
    #[arg(long, env = "LEASEFENCE_STORE_PREFIX")]
    pub store_prefix: Option<String>,
    /// On a shared store: how long a dead active coordinator blocks a takeover.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub leader_ttl: Duration,
    /// On a shared store: the URL clients are sent to while this coordinator
    /// is active (default: http:// + --listen).
    #[arg(long, env = "LEASEFENCE_ADVERTISE")]
    pub advertise: Option<String>,
    /// Serve a non-loopback --listen address without access control (a
    /// warning at every start). Without it such an address is refused:
    /// anyone who reaches the port could take, release or watch any lease.
    #[arg(long)]
    pub insecure: bool,
    /// Sign every grant's fence with the key in FILE (one line from
    /// `leasefence fence-key new`); arbiters holding the key then refuse
    /// unsigned and forged fences. To rotate, give arbiters both keys first.
    #[arg(long, env = "LEASEFENCE_FENCE_KEY", value_name = "FILE")]
    pub fence_key: Option<PathBuf>,
    /// Access control: a TOML file of principals (bearer-token hashes or
    /// client-certificate names) and their rules; see docs/security.md.
    /// Deny by default; a non-loopback --listen needs no --insecure then.
    #[arg(long, env = "LEASEFENCE_AUTH", value_name = "FILE")]
    pub auth: Option<PathBuf>,
    /// With --auth: most leases one principal may hold.
    #[arg(long, default_value_t = leasefence_server::auth::Limits::default().leases_per_principal_max)]
    pub leases_per_principal_max: usize,
    /// With --auth: most acquires of one principal waiting at once.
    #[arg(long, default_value_t = leasefence_server::auth::Limits::default().waiters_per_principal_max)]
    pub waiters_per_principal_max: usize,
    /// Most open watch streams, all clients together.
    #[arg(long, default_value_t = leasefence_server::auth::Limits::default().watchers_max)]
    pub watchers_max: usize,
    /// With --auth: most open watch streams of one principal.
    #[arg(long, default_value_t = leasefence_server::auth::Limits::default().watchers_per_principal_max)]
    pub watchers_per_principal_max: usize,
    /// Most open connections, all clients together; a connection beyond it
    /// gets 429 / RESOURCE_EXHAUSTED on every request. Keep it below the
    /// process's file-descriptor limit (`ulimit -n`).
    #[arg(long, default_value_t = leasefence_server::auth::Limits::default().connections_max)]
    pub connections_max: usize,
    /// Close a connection that has had nothing in progress (no request
    /// being served, no keep-alive or watch stream open) for this long:
    /// HTTP/2 gets a GOAWAY, a frame connection a `Closing` notice, and a
    /// client opens a new connection for its next call. It frees the slots
    /// of idle clients under --connections-max. From 1s to 24h.
    #[arg(long, default_value = "5m", value_parser = parse_connection_idle)]
    pub connection_idle: Duration,
    /// Serve TLS with this certificate chain (PEM, leaf first); needs
    /// --tls-key. Plaintext clients are then refused with a message.
    #[arg(long, env = "LEASEFENCE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "LEASEFENCE_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Require every client to present a certificate issued by this CA
    /// (PEM; mutual TLS). Needs --tls-cert and --tls-key.
    #[arg(long, env = "LEASEFENCE_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// A TOML file with any of these flags (keys without the dashes, e.g.
    /// `listen = "127.0.0.1:7740"`, `ttl-max = "1h"`); flags and
    /// LEASEFENCE_* variables override it.
    #[arg(long, env = "LEASEFENCE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// One entry of `--server`: an `http(s)://` coordinator URL.
pub fn parse_server(s: &str) -> Result<String, String> {
    let url = s.trim();
    if url.is_empty() {
        return Err(
            "an empty entry; give one or more coordinator URLs separated by commas, like \
                    http://10.0.0.1:7740,http://10.0.0.2:7740"
                .to_string(),
        );
    }
    leasefence_client::check_coordinator_url(url).map_err(|e| e.message().to_string())?;
    Ok(url.to_string())
}

#[derive(Args, Debug)]
pub struct ServerArg {
    /// Coordinator URLs, comma-separated: the active one and its standbys,
    /// in any order. Calls follow a standby's leader hint and skip
    /// coordinators that cannot be reached.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7740",
        env = "LEASEFENCE_SERVER",
        value_delimiter = ',',
        value_parser = parse_server,
        value_name = "URL,..."
    )]
    pub server: Vec<String>,
    /// Deadline of each call to the coordinator (an acquire's --wait comes
    /// on top), retries on other coordinators included; streams are kept
    /// alive with HTTP/2 pings instead.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// Bearer token for a coordinator with access control (prefer the
    /// variable: a flag shows in the process list).
    #[arg(long, env = "LEASEFENCE_AUTH_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// A client's TLS files (every client command, `bench` too).
#[derive(Args, Debug)]
pub struct TlsArgs {
    /// For https:// coordinators: the CA certificate(s) (PEM) that issued
    /// theirs (default: the system's roots).
    #[arg(long, env = "LEASEFENCE_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// For https:// coordinators that require one: the client certificate
    /// (PEM) to present; with --key.
    #[arg(long, env = "LEASEFENCE_CERT", value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, env = "LEASEFENCE_KEY", value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
}

impl ServerArg {
    /// The client settings these flags ask for.
    pub fn options(&self) -> Result<ClientOptions, Failure> {
        if self.timeout.is_zero() {
            return Err(Failure::invalid("--timeout must be more than 0 (examples: 500ms, 10s)"));
        }
        let options = ClientOptions::default().with_call_timeout(self.timeout);
        let options = match &self.token {
            Some(t) => options.with_token(t.clone()),
            None => options,
        };
        Ok(match self.tls()? {
            Some(tls) => options.with_tls(tls),
            None => options,
        })
    }

    fn tls(&self) -> Result<Option<ClientTls>, Failure> {
        self.tls.read()
    }

    /// A client of the `--server` coordinators with `--timeout` and
    /// keep-alive pings; each is connected when first used.
    pub async fn connect(&self) -> Result<Client, Failure> {
        Client::connect_any_with(&self.server, self.options()?)
            .await
            .map_err(client_cmds::failure)
    }

    /// `--ca`, `--cert` and `--key` as the variables that give them, for a
    /// child's own calls (paths, never the files' contents).
    pub fn tls_env(&self) -> Vec<(&'static str, &Path)> {
        [
            ("LEASEFENCE_CA", &self.tls.ca),
            ("LEASEFENCE_CERT", &self.tls.cert),
            ("LEASEFENCE_KEY", &self.tls.key),
        ]
        .into_iter()
        .filter_map(|(name, path)| path.as_deref().map(|p| (name, p)))
        .collect()
    }

    /// The list as `--server` and `$LEASEFENCE_SERVER` take it.
    pub fn joined(&self) -> String {
        self.server.join(",")
    }
}

#[derive(Args, Debug)]
pub struct AcquireArgs {
    pub resource: String,
    /// Lease time to live.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Duration,
    /// Holder name shown to others (default: HOST:PID).
    #[arg(long)]
    pub holder: Option<String>,
    /// Wait up to this long for a busy resource (default: fail at once).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub wait: Duration,
    /// If the lease expires (is not released), grant the resource to nobody for this long afterwards.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub lock_delay: Duration,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args, Debug)]
pub struct LeaseArgs {
    pub resource: String,
    /// The lease id printed by acquire.
    #[arg(long)]
    pub lease_id: String,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    pub resource: String,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

pub async fn run(cli: Cli) -> CmdResult {
    match cli.command {
        Command::Serve(a) => serve::run(a).await,
        Command::Acquire(a) => client_cmds::acquire(a).await,
        Command::Renew(a) => client_cmds::renew(a).await,
        Command::Release(a) => client_cmds::release(a).await,
        Command::Status(a) => client_cmds::status(a).await,
        Command::ForceRelease(a) => auth_cmd::force_release(a).await,
        Command::Auth(c) => auth_cmd::run(c),
        Command::Run(a) => run_cmd::run(a).await,
        Command::Elect(a) => elect_cmd::run(a).await,
        Command::Observe(a) => observe_cmd::run(a).await,
        Command::Arbiter(c) => arbiter_cmd::run(c).await,
        Command::Gateway(a) => gateway_cmd::run(a).await,
        Command::Watch(a) => watch_cmd::run(a).await,
        Command::Demo => demo::run().await,
        Command::Bench(a) => bench::run(a).await,
        Command::FenceKey(c) => fence_key_cmd::run(c),
        Command::Completions(a) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(a.shell, &mut command, "leasefence", &mut std::io::stdout());
            Ok(())
        }
    }
}

impl TlsArgs {
    /// The TLS settings these flags give (the files read and checked, each
    /// error naming its flag and file); `None` without any.
    pub fn read(&self) -> Result<Option<ClientTls>, Failure> {
        let (ca, cert, key) = (self.ca.as_deref(), self.cert.as_deref(), self.key.as_deref());
        if ca.is_none() && cert.is_none() {
            return Ok(None);
        }
        let read = |flag: &str, path: &Path| {
            std::fs::read(path).map_err(|e| Failure::invalid(format!("{flag} {}: cannot read it: {e}", path.display())))
        };
        let bad = |flag: &str, path: &Path, e: leasefence_core::Invalid| {
            Failure::invalid(format!("{flag} {}: {}", path.display(), e.message()))
        };
        let mut tls = ClientTls::new();
        if let Some(path) = ca {
            tls = tls.with_ca_pem(read("--ca", path)?).map_err(|e| bad("--ca", path, e))?;
        }
        if let (Some(cert), Some(key)) = (cert, key) {
            let (cert_pem, key_pem) = (read("--cert", cert)?, read("--key", key)?);
            tls = tls.with_identity_pem(cert_pem, key_pem).map_err(|e| match e.field() {
                "key" => bad("--key", key, e),
                _ => bad("--cert", cert, e),
            })?;
        }
        Ok(Some(tls))
    }
}
