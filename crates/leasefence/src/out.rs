//! The commands' output on stdout. `println!` panics when stdout cannot be
//! written to (a pipe whose reader has gone, as in `watch … | head -1`, or a
//! full disk); here that is an error the command handles: a stream ends
//! quietly once its reader has gone, a one-shot command reports it.

use std::io::{self, Write};

use crate::Failure;

/// Writes one line to stdout. Stdout is line-buffered, so a reader that has
/// gone is seen here, at this line, as `BrokenPipe`.
pub fn line(args: std::fmt::Arguments<'_>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// What a command returns when its output could not be written.
pub fn failure(e: io::Error) -> Failure {
    Failure::new(Failure::INTERNAL, anyhow::anyhow!("cannot write to stdout: {e}"))
}

/// For a command that streams until interrupted: `Ok(true)` if the line was
/// written, `Ok(false)` if the reader has gone and the stream should end.
pub fn streamed(written: io::Result<()>) -> Result<bool, Failure> {
    match written {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(failure(e)),
    }
}

/// `println!` for a command's output: `outln!(…)?` returns [`failure`] from
/// the command when stdout cannot be written to.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*)).map_err($crate::out::failure)
    };
}
pub(crate) use outln;
