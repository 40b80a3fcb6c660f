//! `serve --config leasefence.toml`: every `serve` flag in a TOML file.
//!
//! Keys are the flag names without the dashes in front (`listen`,
//! `data-dir`, `ttl-max`, …), values as the flag takes them (durations as
//! strings like `"5s"`, `waiters-max` as a number, `insecure` as a boolean).
//! A flag or its `LEASEFENCE_*` variable overrides the file; the file
//! overrides the defaults. An unknown key, a value of the wrong type or one
//! the flag would refuse is an error naming the key, so a typo never passes
//! silently as a default.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::Deserialize;

use crate::Failure;
use crate::cli::{LogFormat, ServeArgs, parse_commit_spin, parse_connection_idle, parse_duration};

/// The file's keys: one per `serve` flag (but `--config`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ServeFile {
    listen: Option<String>,
    frames_listen: Option<String>,
    data_dir: Option<String>,
    log_format: Option<String>,
    ttl_min: Option<String>,
    ttl_max: Option<String>,
    wait_max: Option<String>,
    waiters_max: Option<usize>,
    lock_delay_max: Option<String>,
    commit_spin: Option<String>,
    store: Option<String>,
    store_prefix: Option<String>,
    leader_ttl: Option<String>,
    advertise: Option<String>,
    insecure: Option<bool>,
    fence_key: Option<String>,
    auth: Option<String>,
    leases_per_principal_max: Option<usize>,
    waiters_per_principal_max: Option<usize>,
    watchers_max: Option<usize>,
    watchers_per_principal_max: Option<usize>,
    connections_max: Option<usize>,
    connection_idle: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    tls_client_ca: Option<String>,
}

/// Fills in from `a.config` every argument that the command line and the
/// environment left at its default. `m` are the matches of `serve`.
pub fn apply(a: &mut ServeArgs, m: &ArgMatches) -> Result<(), Failure> {
    let Some(path) = a.config.clone() else { return Ok(()) };
    let file = read(&path)?;
    let unset = |id: &str| matches!(m.value_source(id), None | Some(ValueSource::DefaultValue));
    let bad = |key: &str, e: String| Failure::invalid(format!("--config {}: {key}: {e}", path.display()));
    let duration = |key: &str, v: &str| parse_duration(v).map_err(|e| bad(key, format!("{v:?}: {e}")));

    if let (Some(v), true) = (&file.listen, unset("listen")) {
        a.listen = v.parse().map_err(|_| {
            bad(
                "listen",
                format!("{v:?} is not an address:port like \"127.0.0.1:7740\""),
            )
        })?;
    }
    if let (Some(v), true) = (&file.frames_listen, unset("frames_listen")) {
        let addr = v.parse().map_err(|_| {
            bad(
                "frames-listen",
                format!("{v:?} is not an address:port like \"127.0.0.1:7742\""),
            )
        })?;
        a.frames_listen = Some(addr);
    }
    if let (Some(v), true) = (&file.data_dir, unset("data_dir")) {
        a.data_dir = v.into();
    }
    if let (Some(v), true) = (&file.log_format, unset("log_format")) {
        a.log_format = <LogFormat as clap::ValueEnum>::from_str(v, false)
            .map_err(|_| bad("log-format", format!("{v:?}: allowed: \"text\", \"json\"")))?;
    }
    let durations: [(&str, &str, &Option<String>, &mut Duration); 5] = [
        ("ttl-min", "ttl_min", &file.ttl_min, &mut a.ttl_min),
        ("ttl-max", "ttl_max", &file.ttl_max, &mut a.ttl_max),
        ("wait-max", "wait_max", &file.wait_max, &mut a.wait_max),
        (
            "lock-delay-max",
            "lock_delay_max",
            &file.lock_delay_max,
            &mut a.lock_delay_max,
        ),
        ("leader-ttl", "leader_ttl", &file.leader_ttl, &mut a.leader_ttl),
    ];
    for (key, id, value, slot) in durations {
        if let (Some(v), true) = (value, unset(id)) {
            *slot = duration(key, v)?;
        }
    }
    if let (Some(v), true) = (&file.commit_spin, unset("commit_spin")) {
        a.commit_spin = parse_commit_spin(v).map_err(|e| bad("commit-spin", format!("{v:?}: {e}")))?;
    }
    if let (Some(v), true) = (&file.connection_idle, unset("connection_idle")) {
        a.connection_idle = parse_connection_idle(v).map_err(|e| bad("connection-idle", format!("{v:?}: {e}")))?;
    }
    let counts: [(&str, Option<usize>, &mut usize); 6] = [
        ("waiters_max", file.waiters_max, &mut a.waiters_max),
        (
            "leases_per_principal_max",
            file.leases_per_principal_max,
            &mut a.leases_per_principal_max,
        ),
        (
            "waiters_per_principal_max",
            file.waiters_per_principal_max,
            &mut a.waiters_per_principal_max,
        ),
        ("watchers_max", file.watchers_max, &mut a.watchers_max),
        (
            "watchers_per_principal_max",
            file.watchers_per_principal_max,
            &mut a.watchers_per_principal_max,
        ),
        ("connections_max", file.connections_max, &mut a.connections_max),
    ];
    for (id, value, slot) in counts {
        if let (Some(v), true) = (value, unset(id)) {
            *slot = v;
        }
    }
    if let (Some(v), true) = (&file.auth, unset("auth")) {
        a.auth = Some(v.into());
    }
    let texts: [(&str, &Option<String>, &mut Option<String>); 3] = [
        ("store", &file.store, &mut a.store),
        ("store_prefix", &file.store_prefix, &mut a.store_prefix),
        ("advertise", &file.advertise, &mut a.advertise),
    ];
    for (id, value, slot) in texts {
        if let (Some(v), true) = (value, unset(id)) {
            *slot = Some(v.clone());
        }
    }
    let paths: [(&str, &Option<String>, &mut Option<PathBuf>); 3] = [
        ("tls_cert", &file.tls_cert, &mut a.tls_cert),
        ("tls_key", &file.tls_key, &mut a.tls_key),
        ("tls_client_ca", &file.tls_client_ca, &mut a.tls_client_ca),
    ];
    for (id, value, slot) in paths {
        if let (Some(v), true) = (value, unset(id)) {
            *slot = Some(v.into());
        }
    }
    if let (Some(v), true) = (file.insecure, unset("insecure")) {
        a.insecure = v;
    }
    if let (Some(v), true) = (&file.fence_key, unset("fence_key")) {
        a.fence_key = Some(v.into());
    }
    Ok(())
}

fn read(path: &Path) -> Result<ServeFile, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::invalid(format!("--config {}: cannot read it: {e}", path.display())))?;
    // The parser's message points at the line and names the key (and, for an
    // unknown one, every key allowed).
    toml::from_str(&text).map_err(|e| Failure::invalid(format!("--config {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::*;
    use crate::cli::{Cli, Command};

    /// `serve ARGS` with the file `toml`, applied: the args or the error.
    fn serve(toml: &str, args: &[&str]) -> Result<ServeArgs, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leasefence.toml");
        std::fs::write(&path, toml).expect("write");
        let mut argv = vec!["leasefence", "serve", "--config", path.to_str().expect("utf-8")];
        argv.extend_from_slice(args);
        let m = Cli::command().try_get_matches_from(argv).map_err(|e| e.to_string())?;
        let Command::Serve(mut a) = Cli::from_arg_matches(&m).map_err(|e| e.to_string())?.command else {
            panic!("not serve")
        };
        let sub = m.subcommand_matches("serve").expect("serve");
        apply(&mut a, sub).map_err(|f| f.error.to_string())?;
        Ok(a)
    }

    #[test]
    fn the_file_fills_what_the_command_line_left_at_its_default() {
        let a = serve(
            "listen = \"127.0.0.1:7999\"\ndata-dir = \"/var/lib/lf\"\nttl-max = \"2s\"\nwaiters-max = 7\n\
             log-format = \"json\"\nstore = \"postgres://db/lf\"\nleader-ttl = \"3s\"\ninsecure = true\n\
             frames-listen = \"127.0.0.1:7998\"\n",
            &[],
        )
        .expect("valid");
        assert_eq!(a.listen.to_string(), "127.0.0.1:7999");
        assert_eq!(
            a.frames_listen.map(|f| f.to_string()).as_deref(),
            Some("127.0.0.1:7998")
        );
        assert_eq!(a.data_dir.to_str(), Some("/var/lib/lf"));
        assert_eq!(a.ttl_max, Duration::from_secs(2));
        assert_eq!(a.waiters_max, 7);
        assert_eq!(a.log_format, LogFormat::Json);
        assert_eq!(a.store.as_deref(), Some("postgres://db/lf"));
        assert_eq!(a.leader_ttl, Duration::from_secs(3));
        assert!(a.insecure);
        assert_eq!(a.ttl_min, Duration::from_millis(100), "absent keys keep the default");
    }

    #[test]
    fn access_control_and_limits_come_from_the_file_too() {
        let a = serve(
            "auth = \"/etc/leasefence/auth.toml\"\nleases-per-principal-max = 5\nwaiters-per-principal-max = 6\n\
             watchers-max = 7\nwatchers-per-principal-max = 8\n",
            &["--watchers-max", "70"],
        )
        .expect("valid");
        assert_eq!(
            a.auth.as_deref().and_then(|p| p.to_str()),
            Some("/etc/leasefence/auth.toml")
        );
        assert_eq!(
            (
                a.leases_per_principal_max,
                a.waiters_per_principal_max,
                a.watchers_max,
                a.watchers_per_principal_max
            ),
            (5, 6, 70, 8),
            "the flag wins over the file"
        );
        let e = serve("watchers-max = \"many\"\n", &[]).expect_err("a string");
        assert!(e.contains("watchers-max"), "{e}");
    }

    #[test]
    fn the_tls_files_come_from_the_file_unless_a_flag_names_them() {
        let a = serve(
            "tls-cert = \"/etc/lf/cert.pem\"\ntls-key = \"/etc/lf/key.pem\"\ntls-client-ca = \"/etc/lf/ca.pem\"\n",
            &["--tls-key", "/run/key.pem"],
        )
        .expect("valid");
        assert_eq!(a.tls_cert.as_deref(), Some(Path::new("/etc/lf/cert.pem")));
        assert_eq!(a.tls_key.as_deref(), Some(Path::new("/run/key.pem")));
        assert_eq!(a.tls_client_ca.as_deref(), Some(Path::new("/etc/lf/ca.pem")));
        let e = serve("tls-cert = 1\n", &[]).expect_err("a number");
        assert!(e.contains("tls-cert"), "{e}");
    }

    #[test]
    fn a_flag_overrides_the_file() {
        let a = serve("ttl-max = \"2s\"\nlisten = \"127.0.0.1:7999\"\n", &["--ttl-max", "9s"]).expect("valid");
        assert_eq!(a.ttl_max, Duration::from_secs(9));
        assert_eq!(a.listen.to_string(), "127.0.0.1:7999");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors_naming_the_key() {
        for (toml, says) in [
            ("ttl_max = \"2s\"\n", "ttl_max"),
            ("listn = \"127.0.0.1:1\"\n", "listn"),
            ("ttl-max = \"soon\"\n", "ttl-max"),
            ("ttl-max = 5\n", "ttl-max"),
            ("listen = \"localhost\"\n", "listen"),
            ("frames-listen = \"localhost\"\n", "frames-listen"),
            ("log-format = \"xml\"\n", "log-format"),
            ("waiters-max = -1\n", "waiters-max"),
            ("insecure = \"yes\"\n", "insecure"),
            ("[serve]\nlisten = 1\n", "serve"),
            ("listen = \n", "--config"),
        ] {
            let e = serve(toml, &[]).expect_err(toml);
            assert!(e.contains(says), "{toml:?}: the error names {says}: {e}");
        }
    }

    #[test]
    fn the_connection_idle_timeout_is_from_1s_to_24h_from_a_flag_or_the_file() {
        assert_eq!(serve("", &[]).expect("valid").connection_idle, Duration::from_secs(300));
        let a = serve("connection-idle = \"1h\"\n", &[]).expect("valid");
        assert_eq!(a.connection_idle, Duration::from_secs(3600));
        let a = serve("connection-idle = \"1h\"\n", &["--connection-idle", "30s"]).expect("valid");
        assert_eq!(
            a.connection_idle,
            Duration::from_secs(30),
            "the flag wins over the file"
        );
        for bad in ["500ms", "25h", "0"] {
            let e = serve("", &["--connection-idle", bad]).expect_err(bad);
            assert!(
                e.contains("--connection-idle") && e.contains("from 1s to 24h"),
                "{bad}: {e}"
            );
        }
        let e = serve("connection-idle = \"2d\"\n", &[]).expect_err("too long");
        assert!(e.contains("connection-idle") && e.contains("from 1s to 24h"), "{e}");
        let e = serve("connection-idle = \"soon\"\n", &[]).expect_err("not a duration");
        assert!(e.contains("connection-idle") && e.contains("5m"), "{e}");
    }

    #[test]
    fn the_commit_spin_is_at_most_10ms_from_a_flag_or_the_file() {
        assert_eq!(serve("", &[]).expect("valid").commit_spin, Duration::from_micros(200));
        assert_eq!(
            serve("commit-spin = \"0\"\n", &[]).expect("off").commit_spin,
            Duration::ZERO
        );
        let a = serve("commit-spin = \"1ms\"\n", &["--commit-spin", "50us"]).expect("valid");
        assert_eq!(a.commit_spin, Duration::from_micros(50), "the flag wins over the file");
        let e = serve("", &["--commit-spin", "1s"]).expect_err("too long");
        assert!(e.contains("--commit-spin") && e.contains("at most 10ms"), "{e}");
        let e = serve("commit-spin = \"20ms\"\n", &[]).expect_err("too long");
        assert!(e.contains("commit-spin") && e.contains("at most 10ms"), "{e}");
        let e = serve("commit-spin = \"soon\"\n", &[]).expect_err("not a duration");
        assert!(e.contains("commit-spin") && e.contains("200us"), "{e}");
    }

    #[test]
    fn a_missing_file_says_so() {
        let m = Cli::command()
            .try_get_matches_from(["leasefence", "serve", "--config", "/nonexistent/leasefence.toml"])
            .expect("parses");
        let Command::Serve(mut a) = Cli::from_arg_matches(&m).expect("args").command else {
            panic!()
        };
        let e = apply(&mut a, m.subcommand_matches("serve").expect("serve")).expect_err("missing");
        assert!(e.error.to_string().contains("cannot read it"), "{}", e.error);
    }
}
