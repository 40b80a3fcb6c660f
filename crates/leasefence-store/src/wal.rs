//! The embedded store's commit log: what makes a batch durable with one small
//! write and one `fdatasync`, instead of a B-tree transaction.
//!
//! A redb commit with `Durability::Immediate` copies every page it touches
//! (here five or six, plus the header) and then syncs them: about 190 µs on
//! the disk of runs F–J (docs/performance-notes.md), where one 4 KiB
//! overwrite and its `fdatasync` take about 90 µs. So a batch is first
//! appended here, as the records it produces, and synced; the tree takes the
//! records later, many batches in one transaction ([`crate::EmbeddedStore`]
//! calls that a checkpoint), off the answer's path. Written by hand because
//! it is small and its rules are ours: the crates that offer a log bring
//! their own checkpoint model and file layout, and the recovery rule below is
//! the whole safety argument.
//!
//! The log is one file, zero-filled to [`LOG_BYTES`] when created so that a
//! sync overwrites blocks that exist (appending to a growing file also syncs
//! its metadata, about 50% dearer here). Each record is
//!
//! `len u32 | crc u32 | generation u64 | index u64 | payload[len]` (little-endian),
//!
//! where `crc` is CRC-32 over everything after it, and the payload is the
//! resulting records of one batch: `count u32`, then per resource
//! `key_len u16 | key | value_len u32 | value` (the value in [`crate::codec`]'s
//! encoding). A record is a whole batch, so a batch is in the log entirely or
//! not at all.
//!
//! **Recovery.** The tree stores the generation its next log is written
//! under. Every checkpoint moves the tree and that generation forward in one
//! transaction and then starts the log again at offset 0 under the new
//! generation, with index 0. So records of the current generation are exactly
//! the batches since the tree's last checkpoint, written front to back. To
//! recover, read from offset 0 while each record is whole (length in bounds,
//! checksum right), of the tree's generation, and numbered one past the last;
//! stop at the first that is not. What stops it is one of: zeros (never
//! written), an older generation's record (already in the tree), or a torn
//! record (its batch was never answered: a batch is answered only after its
//! sync, and the next one is written only after that).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::StoreError;

/// The size the log is created with (and zero-filled to).
pub const LOG_BYTES: u64 = 4 << 20;
/// The bytes before a record's payload.
const HEADER: usize = 24;

fn io(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

/// One resource's record after a batch: its key and encoded value.
pub type Entry = (String, Vec<u8>);

/// The log, open for appending under one generation.
pub struct Log {
    file: File,
    path: PathBuf,
    generation: u64,
    index: u64,
    offset: u64,
    buf: Vec<u8>,
}

impl Log {
    /// Opens the log at `path`, creating (and zero-filling) it when missing,
    /// and returns it with the batches it holds for `generation`, in order.
    /// The log appends nothing until [`Log::restart`] gives it a generation.
    pub fn open(path: &Path, generation: u64) -> Result<(Log, Vec<Vec<Entry>>), StoreError> {
        if !path.exists() {
            create_zeroed(path)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io("cannot open", path, e))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| io("cannot read", path, e))?;
        let batches = recover(&bytes, generation)?;
        let log = Log {
            file,
            path: path.to_path_buf(),
            generation,
            index: 0,
            offset: 0,
            buf: Vec::new(),
        };
        Ok((log, batches))
    }

    /// Starts the log again at offset 0 under `generation`: what it held is
    /// in the tree now (the caller committed that generation with it).
    pub fn restart(&mut self, generation: u64) {
        self.generation = generation;
        self.index = 0;
        self.offset = 0;
    }

    /// Where the next record goes: how much of the log this generation used.
    pub fn used(&self) -> u64 {
        self.offset
    }

    /// The bytes `entries` take as one record.
    pub fn record_len(entries: &[Entry]) -> u64 {
        let payload: usize = 4 + entries.iter().map(|(k, v)| 2 + k.len() + 4 + v.len()).sum::<usize>();
        (HEADER + payload) as u64
    }

    /// Appends `entries` as one record and syncs it: once this returns `Ok`
    /// the batch survives a crash.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), StoreError> {
        encode_record(&mut self.buf, self.generation, self.index, entries)?;
        self.file
            .write_all_at(&self.buf, self.offset)
            .map_err(|e| io("cannot write", &self.path, e))?;
        self.file.sync_data().map_err(|e| io("cannot sync", &self.path, e))?;
        self.offset += self.buf.len() as u64;
        self.index += 1;
        Ok(())
    }
}

/// Writes a zero-filled log and makes both it and its name durable (a synced
/// record in a file whose directory entry was lost would be lost with it).
fn create_zeroed(path: &Path) -> Result<(), StoreError> {
    let tmp = path.with_extension("log-new");
    {
        let mut f = File::create(&tmp).map_err(|e| io("cannot create", &tmp, e))?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(LOG_BYTES >> 20) {
            f.write_all(&zeros).map_err(|e| io("cannot write", &tmp, e))?;
        }
        f.sync_all().map_err(|e| io("cannot sync", &tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| io("cannot rename to", path, e))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("cannot sync directory", dir, e))
}

/// Encodes one record into `out` (cleared first).
pub(crate) fn encode_record(
    out: &mut Vec<u8>,
    generation: u64,
    index: u64,
    entries: &[Entry],
) -> Result<(), StoreError> {
    out.clear();
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    let count = u32::try_from(entries.len()).map_err(|_| StoreError::Io("a batch of over 2^32 records".into()))?;
    out.extend_from_slice(&count.to_le_bytes());
    for (key, value) in entries {
        // Resource names are at most 512 bytes and records a few hundred.
        let klen = u16::try_from(key.len()).map_err(|_| StoreError::Io(format!("key of {} bytes", key.len())))?;
        let vlen = u32::try_from(value.len()).map_err(|_| StoreError::Io(format!("value of {} bytes", value.len())))?;
        out.extend_from_slice(&klen.to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&vlen.to_le_bytes());
        out.extend_from_slice(value);
    }
    let len = u32::try_from(out.len() - HEADER).map_err(|_| StoreError::Io("a record of over 4 GiB".into()))?;
    out[0..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The batches of `generation` in `bytes`, front to back, as the module doc
/// says. A record that is whole and of the generation but whose payload does
/// not parse is corruption, not a torn tail: it is an error.
pub(crate) fn recover(bytes: &[u8], generation: u64) -> Result<Vec<Vec<Entry>>, StoreError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let len = u32_at(header, 0) as usize;
        let Some(body) = bytes.get(at + 8..at + HEADER + len) else {
            break;
        };
        if crc32fast::hash(body) != u32_at(header, 4) {
            break;
        }
        if u64_at(header, 8) != generation || u64_at(header, 16) != out.len() as u64 {
            break;
        }
        let payload = &bytes[at + HEADER..at + HEADER + len];
        out.push(parse_payload(payload).map_err(|reason| StoreError::Corrupt {
            resource: format!("log record {} at offset {at}", out.len()),
            reason,
        })?);
        at += HEADER + len;
    }
    Ok(out)
}

fn parse_payload(p: &[u8]) -> Result<Vec<Entry>, String> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let s = p
            .get(at..at + n)
            .ok_or_else(|| format!("ends early at byte {at} of {}", p.len()))?;
        at += n;
        Ok(s)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().map_err(|_| "count")?);
    let mut entries = Vec::new();
    for _ in 0..count {
        let klen = u16::from_le_bytes(take(2)?.try_into().map_err(|_| "key length")?);
        let key = std::str::from_utf8(take(usize::from(klen))?).map_err(|_| "a key that is not UTF-8".to_string())?;
        let key = key.to_string();
        let vlen = u32::from_le_bytes(take(4)?.try_into().map_err(|_| "value length")?);
        let value = take(vlen as usize)?.to_vec();
        entries.push((key, value));
    }
    if at != p.len() {
        return Err(format!("{} bytes after the last entry", p.len() - at));
    }
    Ok(entries)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
#[path = "wal_tests.rs"]
mod tests;
