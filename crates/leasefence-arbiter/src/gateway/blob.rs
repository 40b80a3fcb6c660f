//! Object bytes on disk: a body is streamed into `tmp/<id>`, hashed and
//! counted on the way, fsynced, then moved to `blobs/<id>` (both directories
//! fsynced) before the store points a key at it. A blob never changes after
//! that, so a reader holding it open reads one whole object.
//!
//! [`Pending`] removes its file when dropped unless the commit kept it: a
//! refused, aborted or failed write leaves nothing behind, and what a crash
//! leaves behind is swept at the next start ([`super::store`]).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::precondition::Etag;

pub(crate) const TMP_DIR: &str = "tmp";
pub(crate) const BLOBS_DIR: &str = "blobs";
/// Bytes buffered before a write reaches the file.
const WRITE_BUFFER: usize = 1 << 20;

/// A blob's name: 128 random bits, in hex on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BlobId(pub(crate) u128);

impl BlobId {
    fn random() -> io::Result<BlobId> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(|e| io::Error::other(format!("no randomness for a blob id: {e}")))?;
        Ok(BlobId(u128::from_be_bytes(b)))
    }

    pub(crate) fn file_name(self) -> String {
        format!("{:032x}", self.0)
    }

    /// The id a blob file is named by; `None` for any other name.
    pub(crate) fn parse(name: &str) -> Option<BlobId> {
        if name.len() != 32 || !name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        u128::from_str_radix(name, 16).ok().map(BlobId)
    }
}

/// How a body failed to become a blob.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// More than `limit` bytes arrived.
    TooLarge {
        limit: u64,
    },
    /// The client's body stream failed (connection lost, malformed chunking).
    Body(String),
    Io(io::Error),
}

impl From<io::Error> for BodyError {
    fn from(e: io::Error) -> BodyError {
        BodyError::Io(e)
    }
}

/// A blob file not yet referenced by the store; removed on drop unless kept.
pub(crate) struct Pending {
    path: PathBuf,
    keep: bool,
    pub(crate) id: BlobId,
    pub(crate) size: u64,
    pub(crate) etag: Etag,
}

impl Pending {
    /// The store now points at this blob: keep the file.
    pub(crate) fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Streams `body` into a new temp file under `data_dir`, refusing more than
/// `limit` bytes. The file is neither fsynced nor moved yet: [`finish`] does that.
pub(crate) async fn receive<S, E>(data_dir: &Path, limit: u64, mut body: S) -> Result<(Pending, File), BodyError>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let id = BlobId::random()?;
    let path = data_dir.join(TMP_DIR).join(id.file_name());
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .await?;
    let mut pending = Pending {
        path,
        keep: false,
        id,
        size: 0,
        etag: Etag::from_digest([0; 32]),
    };
    let mut out = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, file);
    let mut hash = Sha256::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| BodyError::Body(e.to_string()))?;
        pending.size += chunk.len() as u64;
        if pending.size > limit {
            return Err(BodyError::TooLarge { limit });
        }
        hash.update(&chunk);
        out.write_all(&chunk).await?;
    }
    out.flush().await?;
    pending.etag = Etag::from_digest(hash.finalize().into());
    let file = out.into_inner().into_std().await;
    Ok((pending, file))
}

/// Makes the received bytes durable and moves them among the blobs
/// (blocking: run it off the async threads). After this a crash leaves a
/// complete blob that nothing references yet, swept at the next start.
pub(crate) fn finish(data_dir: &Path, pending: &mut Pending, file: File) -> io::Result<()> {
    file.sync_all()?;
    drop(file);
    let blob = blob_path(data_dir, pending.id);
    std::fs::rename(&pending.path, &blob)?;
    pending.path = blob;
    sync_dir(&data_dir.join(BLOBS_DIR))?;
    sync_dir(&data_dir.join(TMP_DIR))
}

pub(crate) fn blob_path(data_dir: &Path, id: BlobId) -> PathBuf {
    data_dir.join(BLOBS_DIR).join(id.file_name())
}

/// fsync of a directory, so the names created or removed in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_names_round_trip_and_nothing_else_parses() {
        let id = BlobId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(BlobId::parse(&id.file_name()), Some(id));
        assert_eq!(BlobId(1).file_name().len(), 32);
        for other in [
            "",
            "gateway.redb",
            "0123456789ABCDEF0123456789abcdef",
            "+123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(BlobId::parse(other), None, "{other}");
        }
    }
}
