//! `leasefence fence-key new`: a fresh key for signed fences, and reading the
//! key file `serve --fence-key` names (see `leasefence_core::signing`).

use std::path::Path;

use clap::{Args, Subcommand};
use leasefence_core::signing::{FenceKey, SECRET_LEN};

use crate::out::outln;
use crate::{CmdResult, Failure};

#[derive(Subcommand, Debug)]
pub enum FenceKeyCommand {
    /// Print a new key line `<key id>:<64 hex digits>` for a key file: give
    /// the file to `serve --fence-key` and to every arbiter that verifies.
    New(NewArgs),
}

#[derive(Args, Debug)]
pub struct NewArgs {
    /// The key's id, carried in every signature (1..=32 of a-z, 0-9, `-`, `_`);
    /// name keys so that a rotation can tell them apart, e.g. `2026-12`.
    #[arg(long, default_value = "k1")]
    pub id: String,
}

pub fn run(c: FenceKeyCommand) -> CmdResult {
    match c {
        FenceKeyCommand::New(a) => {
            let mut secret = [0u8; SECRET_LEN];
            getrandom::fill(&mut secret)
                .map_err(|e| Failure::new(Failure::INTERNAL, anyhow::anyhow!("no randomness: {e}")))?;
            let key = FenceKey::new(&a.id, secret).map_err(Failure::invalid)?;
            outln!("{}", key.to_line())?;
            Ok(())
        }
    }
}

/// Reads a key file for `flag`, with an error naming the flag and the file.
pub fn read(flag: &str, path: &Path) -> Result<FenceKey, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::invalid(format!("{flag} {}: cannot read it: {e}", path.display())))?;
    FenceKey::parse(&text).map_err(|e| Failure::invalid(format!("{flag} {}: {e}", path.display())))
}
