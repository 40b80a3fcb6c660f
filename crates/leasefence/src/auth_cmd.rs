//! Access control from the command line: `serve --auth FILE` (the policy
//! file: principals and their rules), `auth hash-token` (the SHA-256 a
//! policy file keeps instead of a token), and `force-release`.
//!
//! ```toml
//! [[principal]]
//! name = "worker"                      # recorded as the lease holder's prefix
//! token-sha256 = "9f86d0…"             # `leasefence auth hash-token`
//! cert-names = ["worker.example.com"]  # and/or client-certificate SANs
//! rules = [{ prefix = "jobs/", verbs = ["acquire", "read"] }]
//! ```

use std::io::Read;
use std::path::Path;

use clap::{Args, Subcommand};
use leasefence_core::ResourceId;
use leasefence_core::access::{Policy, PrincipalSpec, RuleSpec, hash_token};
use serde::Deserialize;
use serde_json::json;

use crate::cli::ServerArg;
use crate::client_cmds::failure;
use crate::out::outln;
use crate::{CmdResult, Failure};

#[derive(Subcommand, Debug)]
pub enum AuthCommand {
    /// Read a bearer token on stdin (one trailing newline is dropped) and
    /// print its SHA-256, the `token-sha256` of a principal in `--auth FILE`.
    HashToken,
}

#[derive(Args, Debug)]
pub struct ForceReleaseArgs {
    pub resource: String,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArg,
}

pub fn run(c: AuthCommand) -> CmdResult {
    match c {
        AuthCommand::HashToken => {
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .map_err(|e| Failure::invalid(format!("cannot read the token on stdin: {e}")))?;
            outln!("{}", hash_token(&token_of(&input)?))?;
            Ok(())
        }
    }
}

/// The token in what was read: without one trailing `\n` or `\r\n`.
fn token_of(input: &str) -> Result<String, Failure> {
    let token = input
        .strip_suffix("\r\n")
        .or_else(|| input.strip_suffix('\n'))
        .unwrap_or(input);
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Failure::invalid(
            "the token on stdin must be 1 or more visible ASCII characters (no spaces or control \
             characters), e.g. `head -c 32 /dev/urandom | base64 | tr -d '=+/\\n'`",
        ));
    }
    Ok(token.to_string())
}

pub async fn force_release(a: ForceReleaseArgs) -> CmdResult {
    let res = ResourceId::new(&a.resource).map_err(Failure::invalid)?;
    let client = a.server.connect().await?;
    let ended = client.force_release(&res).await.map_err(failure)?;
    if a.json {
        let v = json!({ "resource": res.as_str(), "token": ended.map(|t| t.get()), "released": ended.is_some() });
        outln!("{v}")?;
    } else {
        match ended {
            Some(t) => outln!("force-released {} token={t}", res.shown())?,
            None => outln!("{}: not held; nothing to release", res.shown())?,
        }
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    #[serde(default)]
    principal: Vec<PrincipalEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PrincipalEntry {
    name: String,
    token_sha256: Option<String>,
    #[serde(default)]
    cert_names: Vec<String>,
    #[serde(default)]
    rules: Vec<RuleEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleEntry {
    prefix: String,
    verbs: Vec<String>,
}

/// Reads and validates the policy file of `serve --auth`.
pub fn load_policy(path: &Path) -> Result<Policy, Failure> {
    let at = || format!("--auth {}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| Failure::invalid(format!("{}: cannot read it: {e}", at())))?;
    parse_policy(&text).map_err(|e| Failure::invalid(format!("{}: {e}", at())))
}

fn parse_policy(text: &str) -> Result<Policy, String> {
    let file: AuthFile = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.principal.is_empty() {
        return Err("no [[principal]]: every request would be refused; add at least one".into());
    }
    let specs: Vec<PrincipalSpec> = file
        .principal
        .into_iter()
        .map(|p| PrincipalSpec {
            name: p.name,
            token_sha256: p.token_sha256,
            cert_names: p.cert_names,
            rules: p
                .rules
                .into_iter()
                .map(|r| RuleSpec {
                    prefix: r.prefix,
                    verbs: r.verbs,
                })
                .collect(),
        })
        .collect();
    Policy::new(&specs).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use leasefence_core::access::Verb;

    use super::*;

    #[test]
    fn a_policy_file_parses_into_principals_with_rules() {
        let text = format!(
            "[[principal]]\nname = \"w\"\ntoken-sha256 = \"{}\"\nrules = [{{ prefix = \"jobs/\", verbs = [\"acquire\"] }}]\n\
             [[principal]]\nname = \"svc\"\ncert-names = [\"svc.example.com\"]\n",
            hash_token("t")
        );
        let p = parse_policy(&text).expect("valid");
        let w = p.by_token("t").expect("w");
        assert!(w.allows(Verb::Acquire, "jobs/1") && !w.allows(Verb::Read, "jobs/1"));
        assert_eq!(p.by_cert_names(&["svc.example.com"]).map(|p| p.name()), Some("svc"));
    }

    #[test]
    fn bad_policy_files_are_errors_naming_the_key() {
        let h = hash_token("t");
        for (text, says) in [
            (format!("[[principal]]\nname = \"w\"\ntoken = \"{h}\"\n"), "token"),
            (
                format!(
                    "[[principal]]\nname = \"w\"\ntoken-sha256 = \"{h}\"\nrules = [{{ prefix = \"\", verbs = [\"write\"] }}]\n"
                ),
                "principal[0] (\"w\").rules[0].verbs",
            ),
            (
                "[[principal]]\nname = \"w\"\ntoken-sha256 = \"\"\n".to_string(),
                "token-sha256: is empty",
            ),
            (String::new(), "no [[principal]]"),
            (
                format!(
                    "[[principal]]\nname = \"w\"\ntoken-sha256 = \"{h}\"\n[[principal]]\nname = \"w\"\ncert-names = [\"x\"]\n"
                ),
                "principal[1] (\"w\").name",
            ),
        ] {
            let e = parse_policy(&text).expect_err(&text);
            assert!(e.contains(says), "{text:?}: says {says}: {e}");
        }
    }

    #[test]
    fn the_token_read_loses_one_newline_and_nothing_else() {
        assert_eq!(token_of("abc\n").expect("ok"), "abc");
        assert_eq!(token_of("abc\r\n").expect("ok"), "abc");
        assert_eq!(token_of("abc").expect("ok"), "abc");
        for bad in ["", "\n", "a b\n", "abc\n\n"] {
            assert!(token_of(bad).is_err(), "{bad:?}");
        }
    }
}
