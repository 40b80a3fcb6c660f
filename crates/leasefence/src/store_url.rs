//! `serve --store URL`: which engine the coordinator keeps its records in.
//!
//! No `--store`: the embedded store under `--data-dir` (one coordinator).
//! `postgres://…` / `postgresql://…`: a PostgreSQL database several
//! coordinators share. `etcd://host:port[,host:port…]`: an etcd cluster
//! several coordinators share (needs the `etcd` feature). The kind is told
//! here, the rest by the backend's configuration, each with a message that
//! says what is allowed; a password never shows in either.

use std::fmt;

/// The kind of a `--store` value; the backend's own configuration checks the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    Postgres(String),
    Etcd(String),
}

impl StoreUrl {
    pub fn parse(s: &str) -> Result<StoreUrl, String> {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(StoreUrl::Postgres(s.to_string()))
        } else if s.starts_with("etcd://") {
            Ok(StoreUrl::Etcd(s.to_string()))
        } else {
            Err(format!(
                "--store {:?}: unknown kind of store; allowed: postgres://USER@HOST:PORT/DB or \
                 etcd://HOST:PORT[,HOST:PORT…] (no --store: the embedded store under --data-dir)",
                redact(s)
            ))
        }
    }
}

/// The URL with any password replaced, for logs and messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (auth, host) = match rest.split_once('@') {
        Some(parts) => parts,
        None => return url.to_string(),
    };
    match auth.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Postgres(url) | StoreUrl::Etcd(url) => f.write_str(&redact(url)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_is_allowed_and_says_so_otherwise() {
        assert_eq!(
            StoreUrl::parse("postgres://u@h:5432/db"),
            Ok(StoreUrl::Postgres("postgres://u@h:5432/db".into()))
        );
        assert_eq!(
            StoreUrl::parse("etcd://127.0.0.1:2379,h2:2380"),
            Ok(StoreUrl::Etcd("etcd://127.0.0.1:2379,h2:2380".into()))
        );
        for bad in ["mysql://h/db", "redis://h", "", "/tmp/x"] {
            let e = StoreUrl::parse(bad).expect_err(bad);
            assert!(e.contains("allowed:"), "{bad}: {e}");
        }
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        let e = StoreUrl::parse("mysql://u:secret@h/db").expect_err("unknown");
        assert!(!e.contains("secret"), "{e}");
    }
}
