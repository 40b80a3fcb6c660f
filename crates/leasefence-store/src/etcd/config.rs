//! Where the etcd store is and how it talks to it: the `etcd://host:port[,…]`
//! URL of `serve --store`, the key prefix, the shard, and the client's bounds.

use std::time::Duration;

/// Why an etcd store configuration was refused: says what was wrong and what
/// is allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EtcdConfigError(String);

/// The configuration of an [`crate::EtcdShared`]. Built from a URL
/// ([`EtcdConfig::from_url`]); the rest has defaults that the `with_` methods
/// change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `host:port` of each member; never empty.
    endpoints: Vec<String>,
    /// Ends with `/`; never empty.
    prefix: String,
    shard: u32,
    request_timeout: Duration,
    connect_timeout: Duration,
    txn_ops_max: usize,
}

const URL_FORM: &str = "etcd://host:port[,host:port…]";

impl EtcdConfig {
    /// The key prefix when none is given (`serve --store-prefix`).
    pub const PREFIX_DEFAULT: &'static str = "/leasefence/";
    /// How long one attempt of a call to etcd may take before it fails as
    /// unavailable. A member without quorum makes calls hang rather than fail:
    /// this bounds them. A call tries each member at most once, so it fails
    /// within (members × this) at worst.
    pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
    /// How long dialling one member may take.
    pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
    /// etcd's own default for `--max-txn-ops`: the most compares, and the most
    /// operations, one transaction may have.
    pub const TXN_OPS_MAX_DEFAULT: usize = 128;

    /// Parses `etcd://host:port[,host:port…]` (plain-text gRPC; a host is a
    /// name, an IPv4 address or a bracketed IPv6 address).
    pub fn from_url(url: &str) -> Result<EtcdConfig, EtcdConfigError> {
        let bad = |why: String| EtcdConfigError(format!("etcd store URL {url:?}: {why}; expected {URL_FORM}"));
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("the scheme must be etcd://".into()))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() {
            return Err(bad("no member address".into()));
        }
        let endpoints = rest
            .split(',')
            .map(|member| check_member(member).map_err(&bad))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EtcdConfig {
            endpoints,
            prefix: EtcdConfig::PREFIX_DEFAULT.to_string(),
            shard: crate::SHARD_DEFAULT,
            request_timeout: EtcdConfig::REQUEST_TIMEOUT_DEFAULT,
            connect_timeout: EtcdConfig::CONNECT_TIMEOUT_DEFAULT,
            txn_ops_max: EtcdConfig::TXN_OPS_MAX_DEFAULT,
        })
    }

    /// Every key of the store starts with `prefix` (a `/` is added when it
    /// does not end with one). Coordinators that share a prefix share a store.
    pub fn with_prefix(mut self, prefix: &str) -> Result<EtcdConfig, EtcdConfigError> {
        if prefix.is_empty() {
            return Err(EtcdConfigError(format!(
                "the etcd key prefix must not be empty (the default is {:?})",
                EtcdConfig::PREFIX_DEFAULT
            )));
        }
        self.prefix = if prefix.ends_with('/') {
            prefix.to_string()
        } else {
            format!("{prefix}/")
        };
        Ok(self)
    }

    /// The shard this store serves (only [`crate::SHARD_DEFAULT`] exists for now).
    pub fn with_shard(mut self, shard: u32) -> EtcdConfig {
        self.shard = shard;
        self
    }

    /// Bounds each call to etcd (and dialling a member); both must be above zero.
    pub fn with_timeouts(mut self, request: Duration, connect: Duration) -> Result<EtcdConfig, EtcdConfigError> {
        if request.is_zero() || connect.is_zero() {
            return Err(EtcdConfigError(format!(
                "etcd timeouts must be above zero (got request {request:?}, connect {connect:?})"
            )));
        }
        self.request_timeout = request;
        self.connect_timeout = connect;
        Ok(self)
    }

    /// The members' `--max-txn-ops`, when it is not etcd's default of 128. A
    /// batch then holds at most `n - 2` resources (two compares fence it).
    pub fn with_txn_ops_max(mut self, n: usize) -> Result<EtcdConfig, EtcdConfigError> {
        if n < 3 {
            return Err(EtcdConfigError(format!(
                "etcd's max-txn-ops must be at least 3 to fence a batch (got {n})"
            )));
        }
        self.txn_ops_max = n;
        Ok(self)
    }

    /// `host:port` of each member, as the URL gave them.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The most resources one batch may touch: every resource costs one compare
    /// and one put, and the epoch and the leader key take two compares.
    pub fn resources_per_batch_max(&self) -> usize {
        self.txn_ops_max - 2
    }
}

fn check_member(member: &str) -> Result<String, String> {
    let (host, port) = if let Some(v6) = member.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("member {member:?} opens '[' without closing it"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("member {member:?} has no :port"))?;
        (addr, port)
    } else {
        member
            .rsplit_once(':')
            .ok_or_else(|| format!("member {member:?} has no :port"))?
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !host_ok {
        return Err(format!(
            "member {member:?} has no valid host (a name, an IPv4 address or [an IPv6 address])"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(member.to_string()),
        _ => Err(format!("member {member:?} has port {port:?}; a port is 1 to 65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_one_or_several_members() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").expect("valid");
        assert_eq!(c.endpoints(), ["127.0.0.1:2379"]);
        assert_eq!(c.prefix(), "/leasefence/");
        let c = EtcdConfig::from_url("etcd://a.example:1,[::1]:2,b:3/").expect("valid");
        assert_eq!(c.endpoints(), ["a.example:1", "[::1]:2", "b:3"]);
        assert_eq!(c.resources_per_batch_max(), 126);
    }

    #[test]
    fn refuses_what_is_not_a_member_list_and_says_why() {
        for (url, why) in [
            ("http://127.0.0.1:2379", "scheme"),
            ("etcd://", "no member"),
            ("etcd://host", "no :port"),
            ("etcd://host:0", "port"),
            ("etcd://host:99999", "port"),
            ("etcd://a:1,,b:2", "no :port"),
            ("etcd://user@a:1", "valid host"),
            ("etcd://a:1/prefix", "port"),
            ("etcd://[::1:2379", "'['"),
            ("etcd://a b:1", "valid host"),
        ] {
            let err = EtcdConfig::from_url(url).expect_err(url).to_string();
            assert!(err.contains(why) && err.contains(URL_FORM), "{url}: {err}");
        }
    }

    #[test]
    fn prefix_gets_a_slash_and_bounds_are_checked() {
        let c = EtcdConfig::from_url("etcd://h:1").expect("valid");
        assert_eq!(c.clone().with_prefix("/x").expect("valid").prefix(), "/x/");
        assert!(c.clone().with_prefix("").is_err());
        assert!(c.clone().with_timeouts(Duration::ZERO, Duration::from_secs(1)).is_err());
        assert!(c.clone().with_txn_ops_max(2).is_err());
        assert_eq!(c.with_txn_ops_max(10).expect("valid").resources_per_batch_max(), 8);
    }
}
