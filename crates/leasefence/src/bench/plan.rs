//! The flags of `leasefence bench`, checked: each range and name, with a
//! message that says what is allowed.

use std::time::Duration;

use super::{BenchArgs, Target, Transport};

const CLIENTS_MAX: usize = 1024;
pub const ETCD_FEATURE: &str = "--compare etcd needs a leasefence built with the etcd client: \
                            cargo build --release -p leasefence --features etcd";

/// The validated flags.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub targets: Vec<Target>,
    pub clients: Vec<usize>,
    pub resources: usize,
    pub duration: Duration,
    pub rounds: u32,
    pub redis: String,
    /// host:port.
    pub etcd: String,
    /// `--idle`: the scale measurement's resource counts (empty: the comparison).
    pub idle: Vec<u64>,
    pub transport: Transport,
}

impl Plan {
    pub fn new(a: &BenchArgs) -> Result<Plan, String> {
        if a.clients.is_empty() || a.clients.iter().any(|&c| c == 0 || c > CLIENTS_MAX) {
            return Err(format!("--clients must be numbers in 1..={CLIENTS_MAX}, like 1,16,64"));
        }
        if let Some(c) = first_repeat(&a.clients) {
            return Err(format!("--clients names {c} twice"));
        }
        if a.duration < Duration::from_millis(100) || a.duration > Duration::from_secs(600) {
            return Err("--duration must be in 100ms..=10m".into());
        }
        if let Some(t) = first_repeat(&a.compare) {
            return Err(format!("--compare names {} twice", t.name()));
        }
        if a.compare.contains(&Target::Etcd) && !cfg!(feature = "etcd") {
            return Err(ETCD_FEATURE.into());
        }
        let wants = |t: Target, flag: &str, given: bool| {
            if given && !a.compare.contains(&t) {
                return Err(format!("{flag} is only used with --compare {}", t.name()));
            }
            Ok(())
        };
        wants(Target::Etcd, "--etcd", a.etcd.is_some())?;
        wants(Target::Redis, "--redis", a.redis.is_some())?;
        let etcd = etcd_endpoint(a.etcd.as_deref().unwrap_or("http://127.0.0.1:2379"))?;
        let redis = a.redis.clone().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
        if !(redis.starts_with("redis://") || redis.starts_with("rediss://")) {
            return Err(format!(
                "--redis {redis:?}: allowed: redis://HOST:PORT[/DB] or rediss://…"
            ));
        }
        if a.idle.iter().any(|&n| n == 0 || n > super::scale::IDLE_MAX) {
            return Err(format!(
                "--idle must be counts in 1..={}, like 1000,1000000",
                super::scale::IDLE_MAX
            ));
        }
        if let Some(n) = first_repeat(&a.idle) {
            return Err(format!("--idle names {n} twice"));
        }
        let transport = transport(a)?;
        let mut targets = vec![Target::Leasefence];
        targets.extend(&a.compare);
        Ok(Plan {
            targets,
            clients: a.clients.clone(),
            resources: usize::try_from(a.resources).map_err(|_| "--resources is too large")?,
            duration: a.duration,
            rounds: a.rounds,
            redis,
            etcd,
            idle: a.idle.clone(),
            transport,
        })
    }
}

/// `--transport`, or the one the `--server` URLs imply; they must agree.
fn transport(a: &BenchArgs) -> Result<Transport, String> {
    let servers = a.server.as_deref().unwrap_or_default();
    let frames = servers.iter().filter(|u| u.starts_with("leasefence")).count();
    let implied = match (frames, servers.len()) {
        (0, _) => None,
        (1, 1) => Some(Transport::Frames),
        _ => {
            return Err("--server: a frame port is measured alone: give one leasefence:// or \
                        leasefences:// URL, or http(s):// coordinator URLs"
                .into());
        }
    };
    match (a.transport, implied) {
        (Some(Transport::Frames), None) if !servers.is_empty() => {
            Err("--transport frames with --server needs the coordinator's frame port: \
             --server leasefence://HOST:PORT (its serve --frames-listen)"
                .into())
        }
        (Some(Transport::Grpc), Some(_)) => Err(
            "--transport grpc: --server names a frame port (leasefence://); give the coordinator's http(s):// URL"
                .into(),
        ),
        (Some(t), _) => Ok(t),
        (None, Some(t)) => Ok(t),
        (None, None) => Ok(Transport::Grpc),
    }
}

fn first_repeat<T: PartialEq + Copy>(v: &[T]) -> Option<T> {
    v.iter().enumerate().find(|(i, x)| v[..*i].contains(x)).map(|(_, x)| *x)
}

/// `etcd://HOST:PORT` or `http://HOST:PORT` → `HOST:PORT`.
fn etcd_endpoint(url: &str) -> Result<String, String> {
    let bad = || format!("--etcd {url:?}: allowed: etcd://HOST:PORT or http://HOST:PORT (one member)");
    let rest = url
        .strip_prefix("etcd://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(bad)?
        .trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains([',', '/', '@']) || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(rest.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let t = T::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map_err(|e| e.to_string())?;
        Plan::new(&t.a)
    }

    #[test]
    fn defaults_measure_leasefence_alone() {
        let p = plan(&[]).unwrap();
        assert_eq!(p.targets, [Target::Leasefence]);
        assert_eq!((p.clients, p.resources, p.rounds), (vec![1, 16, 64], 0, 3));
        assert_eq!(p.duration, Duration::from_secs(5));
    }

    #[test]
    fn peers_follow_leasefence_in_the_order_given() {
        let p = plan(&["--compare", "noop,redis", "--redis", "redis://127.0.0.1:7000"]).unwrap();
        assert_eq!(p.targets, [Target::Leasefence, Target::Noop, Target::Redis]);
        assert_eq!(p.redis, "redis://127.0.0.1:7000");
    }

    #[test]
    fn etcd_urls_take_either_scheme_and_need_the_feature() {
        let r = plan(&["--compare", "etcd", "--etcd", "etcd://127.0.0.1:2400"]);
        if cfg!(feature = "etcd") {
            assert_eq!(r.unwrap().etcd, "127.0.0.1:2400");
            assert_eq!(etcd_endpoint("http://h:1/").unwrap(), "h:1");
        } else {
            assert!(r.unwrap_err().contains("--features etcd"));
        }
        for bad in [
            "h:1",
            "https://h:1",
            "etcd://h",
            "etcd://:1",
            "etcd://h:0",
            "etcd://h:1,g:2",
            "etcd://h:x",
        ] {
            let e = etcd_endpoint(bad).unwrap_err();
            assert!(e.contains("allowed: etcd://HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_transport_is_the_flags_or_the_one_the_server_url_implies() {
        assert_eq!(plan(&[]).unwrap().transport, Transport::Grpc);
        assert_eq!(plan(&["--transport", "frames"]).unwrap().transport, Transport::Frames);
        let frames = plan(&["--server", "leasefence://127.0.0.1:7741"]).unwrap();
        assert_eq!(frames.transport, Transport::Frames);
        let grpc = plan(&["--server", "http://127.0.0.1:7740", "--transport", "grpc"]).unwrap();
        assert_eq!(grpc.transport, Transport::Grpc);
        let cases: &[(&[&str], &str)] = &[
            (
                &["--server", "http://127.0.0.1:7740", "--transport", "frames"],
                "--server leasefence://",
            ),
            (
                &["--server", "leasefence://127.0.0.1:7741", "--transport", "grpc"],
                "names a frame port",
            ),
            (
                &["--server", "leasefence://127.0.0.1:7741,http://127.0.0.1:7740"],
                "a frame port is measured alone",
            ),
            (&["--transport", "quic"], "possible values: grpc, frames"),
        ];
        for (args, want) in cases {
            let e = plan(args).expect_err(&format!("{args:?}"));
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    #[test]
    fn bad_flags_say_what_is_allowed() {
        let cases: &[(&[&str], &str)] = &[
            (&["--clients", "0"], "1..=1024"),
            (&["--clients", "1025"], "1..=1024"),
            (&["--clients", "1,x"], "invalid digit"),
            (&["--clients", "4,4"], "names 4 twice"),
            (&["--duration", "50ms"], "100ms..=10m"),
            (&["--duration", "11m"], "100ms..=10m"),
            (&["--duration", "fast"], "examples: 500ms"),
            (&["--rounds", "0"], "1..=100"),
            (&["--resources", "1000001"], "0..=1000000"),
            (&["--compare", "zookeeper"], "possible values: etcd, redis, noop"),
            (&["--compare", "leasefence"], "possible values: etcd, redis, noop"),
            (&["--compare", "noop,noop"], "names noop twice"),
            (&["--redis", "redis://h:1"], "only used with --compare redis"),
            (&["--etcd", "etcd://h:1"], "only used with --compare etcd"),
            (&["--compare", "redis", "--redis", "http://h:1"], "allowed: redis://"),
            (&["--idle", "0"], "1..=10000000"),
            (&["--idle", "5,5"], "names 5 twice"),
            (&["--idle", "5", "--compare", "noop"], "cannot be used with"),
        ];
        for (args, want) in cases {
            let e = plan(args).expect_err(&format!("{args:?}"));
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
