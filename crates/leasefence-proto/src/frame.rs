//! The frame protocol (`leasefence://`): a lean binary wire for the calls of
//! a lease's cycle — acquire, renew, release, status — beside gRPC, for
//! clients that make many short cycles. The same engine, the same durable
//! answers and the same access control answer it; only the encoding differs
//! (see `docs/frames.md` for the whole specification).
//!
//! Every message is one frame: a 4-byte big-endian length `N`
//! (`1..=`[`FRAME_MAX`]), then `N` bytes: a 1-byte type and its fields in a
//! fixed order. Integers are big-endian; a string is a 2-byte length and
//! UTF-8; a lease id is its 16 raw bytes. A decoder refuses unknown types,
//! short or overlong bodies and invalid UTF-8 with a [`FrameError`] that says
//! which field was wrong; it never panics on any input (fuzzed).
//!
//! A connection starts with [`Request::Hello`] (the protocol version and, with
//! access control, a bearer token); the coordinator answers
//! [`Response::Welcome`] with the version both speak, or a [`Refusal`] and
//! closes. Then each request gets exactly one answer, in order; one call is
//! in flight per connection. From version 2 on, the coordinator may also
//! send [`Response::Closing`] between answers, once: it is about to close
//! the connection, which has been idle; the client sends nothing more on it.
//!
//! This module is pure: encoding and decoding only. [`read_frame`] is the
//! one I/O helper, shared by the coordinator and the client so that both
//! bound a frame the same way.

use std::time::Duration;

use leasefence_core::{BusyReason, Holder, Invalid, LeaseError, LeaseId, ResourceId, Token};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The newest protocol version this build speaks (the first field of
/// `Hello`). Version 2 adds [`Response::Closing`].
pub const VERSION: u8 = 2;
/// The oldest version this build still speaks.
pub const VERSION_MIN: u8 = 1;
/// The largest frame body either side sends or accepts, in bytes.
pub const FRAME_MAX: usize = 16 * 1024;
/// The longest string field (a bearer token, a refusal's message).
pub const STRING_MAX: usize = 8 * 1024;

const HELLO: u8 = 0x01;
const ACQUIRE: u8 = 0x02;
const RENEW: u8 = 0x03;
const RELEASE: u8 = 0x04;
const STATUS: u8 = 0x05;
const WELCOME: u8 = 0x81;
const LEASE: u8 = 0x82;
const RELEASED: u8 = 0x83;
const STATUS_ANSWER: u8 = 0x84;
const CLOSING: u8 = 0x85;
const REFUSED: u8 = 0xEE;

/// What a client sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The first frame of a connection. `token`: the bearer token, if any.
    Hello {
        version: u8,
        token: Option<String>,
    },
    Acquire {
        resource: String,
        /// Empty: anonymous (as the other edges).
        holder: String,
        ttl_ms: u64,
        wait_ms: u64,
        lock_delay_ms: u64,
    },
    Renew {
        resource: String,
        lease_id: LeaseId,
    },
    Release {
        resource: String,
        lease_id: LeaseId,
    },
    Status {
        resource: String,
    },
}

/// What a coordinator answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Welcome {
        version: u8,
    },
    /// A grant or a renewal. `signature`: empty when fences are unsigned.
    Lease {
        token: u64,
        lease_id: LeaseId,
        holder: String,
        ttl_ms: u64,
        expires_in_ms: u64,
        signature: String,
    },
    /// The token of the lease that ended.
    Released {
        token: u64,
    },
    /// `last_token` 0: never granted.
    Status {
        last_token: u64,
        held: Option<HeldBy>,
        waiters: u32,
    },
    Refused(Refusal),
    /// Not an answer: sent unasked, at most once, between answers, on a
    /// connection of version 2 or later that has been idle. The coordinator
    /// closes the connection once nothing has arrived on it for a grace
    /// period; a request the client sent before it read this is still
    /// answered (after this frame), but the client must send no other.
    Closing,
}

/// The holder of a held resource, as a status answer carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBy {
    pub holder: String,
    pub token: u64,
    pub expires_in_ms: u64,
}

/// Any answer but success. `kind` is the same stable name the other edges
/// send (`busy`, `lease_lost`, `invalid`, `unauthenticated`, `not_leader`,
/// …); `leader` is a standby's hint (the active coordinator's advertised
/// URL), else empty; `busy` is set for `busy` alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub kind: String,
    pub message: String,
    pub leader: String,
    pub busy: Option<Busy>,
}

/// A busy refusal's details (see [`LeaseError::Busy`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Busy {
    pub holder: String,
    pub token: u64,
    pub expires_in_ms: u64,
    /// 0: held; 1: in its lock-delay after an expiry.
    pub reason: u8,
    pub retry_in_ms: u64,
}

/// Why bytes are not a valid frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {0} is not in 1..={FRAME_MAX} bytes")]
    Length(usize),
    #[error("unknown frame type 0x{0:02x}")]
    Type(u8),
    #[error("frame ends inside field {0}")]
    Short(&'static str),
    #[error("field {field} is {len} bytes; at most {max} allowed")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("field {0} is not UTF-8")]
    Utf8(&'static str),
    #[error("{0} bytes after the last field")]
    Trailing(usize),
    #[error("field {field} has an unknown value {value}")]
    Value { field: &'static str, value: u64 },
}

impl FrameError {
    /// As the [`Invalid`] a refusal reports (field `frame`).
    pub fn invalid(&self) -> Invalid {
        Invalid::new("frame", self.to_string())
    }
}

/// The body length of a frame from its 4-byte header, checked.
pub fn body_len(header: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 || len > FRAME_MAX {
        return Err(FrameError::Length(len));
    }
    Ok(len)
}

/// Reads one frame body into `buf` (replacing its contents). `Ok(false)`:
/// the peer closed the connection cleanly before a new frame began.
/// A length out of bounds is `InvalidData` with the [`FrameError`] inside.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < header.len() {
        match r.read(&mut header[got..]).await? {
            0 if got == 0 => return Ok(false),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let len = body_len(header).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    buf.clear();
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(true)
}

/// Frame writer: the length is patched in once the body is complete.
struct Out<'a>(&'a mut Vec<u8>);

impl<'a> Out<'a> {
    fn start(buf: &'a mut Vec<u8>, kind: u8) -> Out<'a> {
        buf.clear();
        buf.extend_from_slice(&[0, 0, 0, 0, kind]);
        Out(buf)
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A string, cut at [`STRING_MAX`] bytes (on a character boundary).
    fn str(&mut self, s: &str) -> &mut Self {
        let mut end = s.len().min(STRING_MAX);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        // Fits: end <= STRING_MAX < u16::MAX.
        self.0.extend_from_slice(&(end as u16).to_be_bytes());
        self.0.extend_from_slice(&s.as_bytes()[..end]);
        self
    }
    fn id(&mut self, id: &LeaseId) -> &mut Self {
        self.0.extend_from_slice(id.as_bytes());
        self
    }
    fn finish(&mut self) {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_be_bytes());
    }
}

/// Encodes `r` as one whole frame (header included) into `buf`.
pub fn encode_request(r: &Request, buf: &mut Vec<u8>) {
    match r {
        Request::Hello { version, token } => {
            Out::start(buf, HELLO)
                .u8(*version)
                .str(token.as_deref().unwrap_or(""))
                .finish();
        }
        Request::Acquire {
            resource,
            holder,
            ttl_ms,
            wait_ms,
            lock_delay_ms,
        } => Out::start(buf, ACQUIRE)
            .str(resource)
            .str(holder)
            .u64(*ttl_ms)
            .u64(*wait_ms)
            .u64(*lock_delay_ms)
            .finish(),
        Request::Renew { resource, lease_id } => Out::start(buf, RENEW).str(resource).id(lease_id).finish(),
        Request::Release { resource, lease_id } => Out::start(buf, RELEASE).str(resource).id(lease_id).finish(),
        Request::Status { resource } => Out::start(buf, STATUS).str(resource).finish(),
    }
}

/// Encodes `r` as one whole frame (header included) into `buf`.
pub fn encode_response(r: &Response, buf: &mut Vec<u8>) {
    match r {
        Response::Welcome { version } => Out::start(buf, WELCOME).u8(*version).finish(),
        Response::Lease {
            token,
            lease_id,
            holder,
            ttl_ms,
            expires_in_ms,
            signature,
        } => Out::start(buf, LEASE)
            .u64(*token)
            .id(lease_id)
            .str(holder)
            .u64(*ttl_ms)
            .u64(*expires_in_ms)
            .str(signature)
            .finish(),
        Response::Released { token } => Out::start(buf, RELEASED).u64(*token).finish(),
        Response::Closing => Out::start(buf, CLOSING).finish(),
        Response::Status {
            last_token,
            held,
            waiters,
        } => {
            let mut out = Out::start(buf, STATUS_ANSWER);
            out.u64(*last_token);
            match held {
                None => out.u8(0),
                Some(h) => out.u8(1).str(&h.holder).u64(h.token).u64(h.expires_in_ms),
            };
            out.u32(*waiters).finish();
        }
        Response::Refused(r) => {
            let mut out = Out::start(buf, REFUSED);
            out.str(&r.kind).str(&r.message).str(&r.leader);
            match &r.busy {
                None => out.u8(0),
                Some(b) => out
                    .u8(1)
                    .str(&b.holder)
                    .u64(b.token)
                    .u64(b.expires_in_ms)
                    .u8(b.reason)
                    .u64(b.retry_in_ms),
            };
            out.finish();
        }
    }
}

/// Reads fields off a frame body in order.
struct In<'a>(&'a [u8]);

impl<'a> In<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], FrameError> {
        if self.0.len() < n {
            return Err(FrameError::Short(field));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, FrameError> {
        Ok(self.take(1, field)?[0])
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, FrameError> {
        let b = self.take(4, field)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, FrameError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, field)?);
        Ok(u64::from_be_bytes(a))
    }
    fn str(&mut self, field: &'static str) -> Result<String, FrameError> {
        let b = self.take(2, field)?;
        let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
        if len > STRING_MAX {
            return Err(FrameError::TooLong {
                field,
                len,
                max: STRING_MAX,
            });
        }
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| FrameError::Utf8(field))
    }
    fn id(&mut self, field: &'static str) -> Result<LeaseId, FrameError> {
        let mut a = [0u8; LeaseId::LEN];
        a.copy_from_slice(self.take(LeaseId::LEN, field)?);
        Ok(LeaseId::from_bytes(a))
    }
    fn flag(&mut self, field: &'static str) -> Result<bool, FrameError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(FrameError::Value {
                field,
                value: u64::from(v),
            }),
        }
    }
    fn end<T>(self, value: T) -> Result<T, FrameError> {
        match self.0.len() {
            0 => Ok(value),
            n => Err(FrameError::Trailing(n)),
        }
    }
}

/// Decodes a request frame's body (the bytes after its length).
pub fn decode_request(body: &[u8]) -> Result<Request, FrameError> {
    let (&kind, rest) = body.split_first().ok_or(FrameError::Length(0))?;
    let mut i = In(rest);
    let r = match kind {
        HELLO => {
            let version = i.u8("version")?;
            let token = Some(i.str("token")?).filter(|t| !t.is_empty());
            Request::Hello { version, token }
        }
        ACQUIRE => Request::Acquire {
            resource: i.str("resource")?,
            holder: i.str("holder")?,
            ttl_ms: i.u64("ttl_ms")?,
            wait_ms: i.u64("wait_ms")?,
            lock_delay_ms: i.u64("lock_delay_ms")?,
        },
        RENEW => Request::Renew {
            resource: i.str("resource")?,
            lease_id: i.id("lease_id")?,
        },
        RELEASE => Request::Release {
            resource: i.str("resource")?,
            lease_id: i.id("lease_id")?,
        },
        STATUS => Request::Status {
            resource: i.str("resource")?,
        },
        other => return Err(FrameError::Type(other)),
    };
    i.end(r)
}

/// Decodes a response frame's body (the bytes after its length).
pub fn decode_response(body: &[u8]) -> Result<Response, FrameError> {
    let (&kind, rest) = body.split_first().ok_or(FrameError::Length(0))?;
    let mut i = In(rest);
    let r = match kind {
        WELCOME => Response::Welcome {
            version: i.u8("version")?,
        },
        LEASE => Response::Lease {
            token: i.u64("token")?,
            lease_id: i.id("lease_id")?,
            holder: i.str("holder")?,
            ttl_ms: i.u64("ttl_ms")?,
            expires_in_ms: i.u64("expires_in_ms")?,
            signature: i.str("signature")?,
        },
        RELEASED => Response::Released { token: i.u64("token")? },
        CLOSING => Response::Closing,
        STATUS_ANSWER => {
            let last_token = i.u64("last_token")?;
            let held = match i.flag("held")? {
                false => None,
                true => Some(HeldBy {
                    holder: i.str("holder")?,
                    token: i.u64("token")?,
                    expires_in_ms: i.u64("expires_in_ms")?,
                }),
            };
            Response::Status {
                last_token,
                held,
                waiters: i.u32("waiters")?,
            }
        }
        REFUSED => {
            let kind = i.str("kind")?;
            let message = i.str("message")?;
            let leader = i.str("leader")?;
            let busy = match i.flag("busy")? {
                false => None,
                true => Some(Busy {
                    holder: i.str("busy.holder")?,
                    token: i.u64("busy.token")?,
                    expires_in_ms: i.u64("busy.expires_in_ms")?,
                    reason: i.u8("busy.reason")?,
                    retry_in_ms: i.u64("busy.retry_in_ms")?,
                }),
            };
            Response::Refused(Refusal {
                kind,
                message,
                leader,
                busy,
            })
        }
        other => return Err(FrameError::Type(other)),
    };
    i.end(r)
}

impl Refusal {
    /// A refusal of another kind than a lease outcome (`unauthenticated`,
    /// `not_leader`, `unavailable`, …).
    pub fn new(kind: &str, message: impl Into<String>) -> Refusal {
        Refusal {
            kind: kind.to_string(),
            message: message.into(),
            leader: String::new(),
            busy: None,
        }
    }

    /// The refusal that carries `e` (kinds as [`crate::error_kind`]).
    pub fn from_lease(e: &LeaseError) -> Refusal {
        let mut r = Refusal::new(crate::error_kind(e), e.to_string());
        if let LeaseError::Busy {
            holder,
            token,
            expires_in,
            reason,
            ..
        } = e
        {
            r.busy = Some(Busy {
                holder: holder.to_string(),
                token: token.get(),
                expires_in_ms: crate::millis(*expires_in),
                reason: match reason {
                    BusyReason::Held => 0,
                    BusyReason::LockDelay { .. } => 1,
                },
                retry_in_ms: crate::millis(e.retry_in().unwrap_or(*expires_in)),
            });
        }
        r
    }

    /// The lease outcome this refusal carries, if it is one (the inverse of
    /// [`Refusal::from_lease`]); `None` for every other kind.
    pub fn to_lease(&self, resource: &ResourceId) -> Option<LeaseError> {
        let resource = resource.clone();
        match self.kind.as_str() {
            "busy" => {
                let b = self.busy.as_ref()?;
                Some(LeaseError::Busy {
                    resource,
                    holder: Holder::new(&b.holder).or_else(|_| Holder::new("unknown")).ok()?,
                    token: Token::new(b.token)?,
                    expires_in: Duration::from_millis(b.expires_in_ms),
                    reason: match b.reason {
                        1 => BusyReason::LockDelay {
                            retry_in: Duration::from_millis(b.retry_in_ms),
                        },
                        _ => BusyReason::Held,
                    },
                })
            }
            "lease_lost" => Some(LeaseError::LeaseLost { resource }),
            "too_many_waiters" => Some(LeaseError::TooManyWaiters { resource, max: 0 }),
            "tokens_exhausted" => Some(LeaseError::TokensExhausted { resource }),
            "invalid" => Some(LeaseError::Invalid(crate::invalid_from_message(&self.message))),
            _ => None,
        }
    }
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
