//! `leasefence gateway`: the fenced object-store gateway of
//! `leasefence_arbiter::gateway`, with its flags checked at the edge.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use leasefence_arbiter::gateway::{Gateway, GatewayConfig, parse_size};
use leasefence_arbiter::{FenceKey, Verifier};

use crate::{CmdResult, Failure};

#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// Address of the HTTP API. Loopback only, unless --insecure: the
    /// gateway has no access control of its own.
    #[arg(long, default_value = GatewayConfig::DEFAULT_LISTEN, env = "LEASEFENCE_GATEWAY_LISTEN")]
    pub listen: SocketAddr,
    /// Directory of the objects and their fences (created if missing).
    #[arg(long, env = "LEASEFENCE_GATEWAY_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Largest object, in bytes with an optional unit B, KiB, MiB, GiB or TiB
    /// (1B..=1TiB); larger bodies get 413.
    #[arg(long, default_value = "64MiB", value_parser = object_size)]
    pub object_size_max: u64,
    /// Most open connections (1..=1000000); beyond it a new connection's
    /// request gets 429 `limit_exceeded` and the connection is closed. An
    /// upload holds a connection and a temp file: keep it below half of
    /// `ulimit -n`.
    #[arg(long, default_value_t = GatewayConfig::CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: usize,
    /// Listen beyond loopback anyway (put an authenticating proxy in front).
    #[arg(long)]
    pub insecure: bool,
    /// A key file (`<key id>:<64 hex digits>`, the coordinator's `--fence-key`)
    /// whose signatures writes must carry in `leasefence-signature`; give it
    /// twice (old and new key) during a rotation. Unsigned or forged fences get 403.
    #[arg(long = "fence-key", value_name = "FILE")]
    pub fence_keys: Vec<PathBuf>,
}

/// The verifier of `--fence-key` files (none: no signature is required).
pub(crate) fn fence_verifier(files: &[PathBuf], flag: &str) -> Result<Option<Verifier>, Failure> {
    if files.is_empty() {
        return Ok(None);
    }
    let mut keys = Vec::with_capacity(files.len());
    for f in files {
        keys.push(read_key_file(f, flag)?);
    }
    Verifier::new(keys)
        .map(Some)
        .map_err(|e| Failure::invalid(format!("{flag}: {}", e.message())))
}

/// One key file, its error naming the flag and the file (never the secret).
pub(crate) fn read_key_file(path: &std::path::Path, flag: &str) -> Result<FenceKey, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::invalid(format!("{flag} {}: cannot read it: {e}", path.display())))?;
    FenceKey::parse(&text).map_err(|e| Failure::invalid(format!("{flag} {}: {}", path.display(), e.message())))
}

fn object_size(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s).map_err(|e| e.message().to_string())?;
    if bytes == 0 || bytes > GatewayConfig::OBJECT_SIZE_MAX_LIMIT {
        return Err(format!("must be 1B..=1TiB, got {s:?}"));
    }
    Ok(bytes)
}

pub async fn run(a: GatewayArgs) -> CmdResult {
    if !a.listen.ip().is_loopback() && !a.insecure {
        return Err(Failure::invalid(format!(
            "--listen {} is not a loopback address, and the gateway has no access control: anyone who \
             reaches it can write with any fence. Listen on 127.0.0.1 or ::1, or pass --insecure behind \
             a proxy that authenticates",
            a.listen
        )));
    }
    let config = GatewayConfig::new(a.listen, a.data_dir.clone())
        .with_object_size_max(a.object_size_max)
        .map_err(|e| Failure::invalid(format!("--object-size-max: {}", e.message())))?
        .with_connections_max(a.connections_max)
        .map_err(|e| Failure::invalid(format!("--connections-max: {}", e.message())))?;
    let config = match fence_verifier(&a.fence_keys, "--fence-key")? {
        Some(keys) => config.with_fence_keys(keys),
        None => config,
    };
    let signed = config.fence_keys().map_or(0, |v| v.keys().len());
    let gateway = Gateway::bind(config).await?;
    crate::volatile::warn_if_volatile("gateway", &a.data_dir);
    let (temp_files, orphan_blobs) = gateway.swept();
    // Before the listening line: from then on SIGTERM stops it gracefully.
    let shutdown = crate::serve::shutdown_signal();
    // One line on stdout, so scripts (and tests) learn the port when --listen used port 0.
    crate::serve::announce(format_args!(
        "leasefence gateway listening on {} (data dir {}, objects up to {} bytes, {}, swept {temp_files} \
         temp files and {orphan_blobs} unreferenced blobs)",
        gateway.local_addr()?,
        a.data_dir.display(),
        a.object_size_max,
        if signed == 0 {
            "fences unsigned".to_string()
        } else {
            format!("fences signed with {signed} key(s)")
        }
    ));
    gateway.run(shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}
