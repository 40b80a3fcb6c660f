//! Access control, as pure rules: who a credential names (a [`Principal`])
//! and whether that principal may use a [`Verb`] on a resource.
//!
//! A principal is named by a bearer token — kept only as its SHA-256, in
//! lowercase hex ([`hash_token`]) — and/or by names of its client
//! certificate (subject alternative names). Its rules map a resource
//! *prefix* to verbs.
//!
//! Matching is **any match**: a principal may use a verb on a resource when
//! any one of its rules has a prefix of the resource's name and lists the
//! verb. Rules only grant, never take away, so the order of rules does not
//! matter and a longer prefix never narrows a shorter one. The empty prefix
//! matches every resource. With rules present, everything else is denied.
//!
//! Ownership: with access control on, the coordinator records a lease's
//! holder as `<principal>` or `<principal>/<holder the client gave>`
//! ([`holder_for`]); the principal part ([`owner_of`]) decides who may renew
//! or release it, so ownership survives a restart on every store without a
//! field of its own.

use std::collections::HashMap;
use std::fmt;

use sha2::{Digest, Sha256};

/// What a rule can allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    /// Acquire; renew and release of the principal's own leases.
    Acquire,
    /// Status, watch, observe, and any read-only page.
    Read,
    /// Force-release of anyone's lease.
    Admin,
}

impl Verb {
    pub const ALL: [Verb; 3] = [Verb::Acquire, Verb::Read, Verb::Admin];
    /// The verbs as a config file writes them, for error messages.
    pub const ALLOWED: &'static str = "\"acquire\", \"read\", \"admin\"";

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Acquire => "acquire",
            Verb::Read => "read",
            Verb::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.as_str() == s)
    }

    fn bit(self) -> u8 {
        match self {
            Verb::Acquire => 1,
            Verb::Read => 2,
            Verb::Admin => 4,
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest principal name, in bytes.
pub const PRINCIPAL_LEN_MAX: usize = 64;

/// A principal as a config file describes it, before validation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrincipalSpec {
    pub name: String,
    /// SHA-256 of the bearer token, 64 hex digits.
    pub token_sha256: Option<String>,
    /// Client-certificate names (SANs) that identify this principal.
    pub cert_names: Vec<String>,
    pub rules: Vec<RuleSpec>,
}

/// One rule as a config file describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleSpec {
    pub prefix: String,
    pub verbs: Vec<String>,
}

/// A config that cannot be used: `key` says where (`principal[2].rules[0].verbs`),
/// `message` what is wrong and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct PolicyError {
    pub key: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    prefix: String,
    verbs: u8,
}

/// A validated principal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    name: String,
    rules: Vec<Rule>,
}

impl Principal {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a rule allows `verb` on `resource` (any match).
    pub fn allows(&self, verb: Verb, resource: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.verbs & verb.bit() != 0 && resource.starts_with(&r.prefix))
    }

    /// Whether `verb` is allowed on every resource under `prefix` (a watch
    /// of a prefix): some rule's prefix is a prefix of it.
    pub fn allows_all_under(&self, verb: Verb, prefix: &str) -> bool {
        self.allows(verb, prefix)
    }

    /// The refusal when [`Principal::allows`] says no.
    pub fn denied(&self, verb: Verb, resource: &str, prefix: bool) -> Denied {
        let granted: Vec<String> = self
            .rules
            .iter()
            .filter(|r| r.verbs & verb.bit() != 0)
            .map(|r| format!("{:?}", r.prefix))
            .collect();
        Denied {
            principal: self.name.clone(),
            verb,
            resource: resource.to_string(),
            prefix,
            granted,
        }
    }
}

/// Why a principal may not do something: the verb and the resource (or
/// watched prefix) it lacks it on, and the prefixes it has it on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    pub principal: String,
    pub verb: Verb,
    pub resource: String,
    /// `resource` is a watched prefix, not one resource.
    pub prefix: bool,
    granted: Vec<String>,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.prefix { "the prefix" } else { "the resource" };
        write!(
            f,
            "principal {:?} lacks `{}` on {what} {:?}; ",
            self.principal, self.verb, self.resource
        )?;
        if self.granted.is_empty() {
            write!(f, "it has `{}` on no prefix", self.verb)
        } else {
            write!(f, "it has `{}` on prefixes {}", self.verb, self.granted.join(", "))
        }
    }
}

/// Every principal and how to find one from a credential.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    principals: Vec<Principal>,
    by_token: HashMap<[u8; 32], usize>,
    by_cert: HashMap<String, usize>,
}

impl Policy {
    /// Validates `specs`: names 1..=64 bytes without `/`, spaces or control
    /// characters, each once; a token hash or a certificate name (or both)
    /// per principal, each naming one principal only; known verbs.
    pub fn new(specs: &[PrincipalSpec]) -> Result<Policy, PolicyError> {
        let mut policy = Policy::default();
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, spec) in specs.iter().enumerate() {
            let at = |field: &str| format!("principal[{i}] ({:?}).{field}", spec.name);
            let err = |field: &str, message: String| PolicyError {
                key: at(field),
                message,
            };
            check_name(&spec.name).map_err(|m| PolicyError {
                key: format!("principal[{i}].name"),
                message: m,
            })?;
            if let Some(first) = names.insert(&spec.name, i) {
                return Err(err(
                    "name",
                    format!("{:?} is also principal[{first}]; names must be unique", spec.name),
                ));
            }
            if spec.token_sha256.is_none() && spec.cert_names.is_empty() {
                return Err(err(
                    "token-sha256",
                    "missing: give token-sha256 (from `leasefence auth hash-token`) or cert-names, or both".into(),
                ));
            }
            if let Some(hex) = &spec.token_sha256 {
                let digest = parse_digest(hex).map_err(|m| err("token-sha256", m))?;
                if let Some(other) = policy.by_token.insert(digest, i) {
                    return Err(err(
                        "token-sha256",
                        format!("the same hash as principal[{other}]; each token names one principal"),
                    ));
                }
            }
            for (j, cert) in spec.cert_names.iter().enumerate() {
                if cert.is_empty() || cert.chars().any(char::is_control) {
                    return Err(err(
                        &format!("cert-names[{j}]"),
                        "must be a non-empty name without control characters".into(),
                    ));
                }
                if let Some(other) = policy.by_cert.insert(cert.clone(), i) {
                    return Err(err(
                        &format!("cert-names[{j}]"),
                        format!("{cert:?} also names principal[{other}]"),
                    ));
                }
            }
            let mut rules = Vec::with_capacity(spec.rules.len());
            for (j, r) in spec.rules.iter().enumerate() {
                rules.push(rule(r).map_err(|(field, m)| err(&format!("rules[{j}].{field}"), m))?);
            }
            policy.principals.push(Principal {
                name: spec.name.clone(),
                rules,
            });
        }
        Ok(policy)
    }

    pub fn principals(&self) -> &[Principal] {
        &self.principals
    }

    /// The principal whose token is `token`, if any.
    pub fn by_token(&self, token: &str) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_token.get(&digest).map(|&i| &self.principals[i])
    }

    /// The principal of the first of `names` that one is configured for.
    pub fn by_cert_names<S: AsRef<str>>(&self, names: &[S]) -> Option<&Principal> {
        names
            .iter()
            .find_map(|n| self.by_cert.get(n.as_ref()))
            .map(|&i| &self.principals[i])
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > PRINCIPAL_LEN_MAX {
        return Err(format!("must be 1..={PRINCIPAL_LEN_MAX} bytes, got {}", name.len()));
    }
    if let Some(c) = name.chars().find(|c| *c == '/' || c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{name:?} contains {c:?}; a principal name has no `/`, spaces or control characters \
             (`/` separates it from the holder name in a lease)"
        ));
    }
    Ok(())
}

fn parse_digest(hex: &str) -> Result<[u8; 32], String> {
    const SHAPE: &str = "must be the 64 hex digits of the token's SHA-256 (`leasefence auth hash-token` prints it)";
    if hex.is_empty() {
        return Err(format!("is empty; {SHAPE}"));
    }
    if let Some(i) = hex.chars().position(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("is not hex at character {}; {SHAPE}", i + 1));
    }
    // All ASCII from here: bytes are characters.
    if hex.len() != 64 {
        return Err(format!("has {} characters; {SHAPE}", hex.len()));
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks_exact(2).enumerate() {
        // Checked above: every byte is a hex digit.
        let digit = |b: u8| (b as char).to_digit(16).unwrap_or(0);
        out[i] = (digit(pair[0]) * 16 + digit(pair[1])) as u8;
    }
    Ok(out)
}

fn rule(r: &RuleSpec) -> Result<Rule, (&'static str, String)> {
    if r.prefix.chars().any(char::is_control) {
        return Err((
            "prefix",
            "must not contain control characters (\"\" matches every resource)".into(),
        ));
    }
    if r.verbs.is_empty() {
        return Err(("verbs", format!("is empty; list one or more of {}", Verb::ALLOWED)));
    }
    let mut verbs = 0;
    for v in &r.verbs {
        let verb =
            Verb::parse(v).ok_or_else(|| ("verbs", format!("{v:?} is not a verb; allowed: {}", Verb::ALLOWED)))?;
        verbs |= verb.bit();
    }
    Ok(Rule {
        prefix: r.prefix.clone(),
        verbs,
    })
}

/// The SHA-256 of `token` in lowercase hex, as `token-sha256` takes it.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The holder recorded for a lease `principal` takes: `<principal>`, or
/// `<principal>/<holder>` when the client named one.
pub fn holder_for(principal: &str, holder: Option<&str>) -> String {
    match holder {
        Some(h) if !h.is_empty() => format!("{principal}/{h}"),
        _ => principal.to_string(),
    }
}

/// The principal part of a recorded holder: everything before the first `/`.
pub fn owner_of(holder: &str) -> &str {
    holder.split_once('/').map_or(holder, |(p, _)| p)
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
