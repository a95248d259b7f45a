//! The frame codec, sans-IO: bytes in, messages out, and back. No sockets, no runtime.
//!
//! A frame is a 12-byte prefix, a bincode header and a raw payload:
//!
//! ```text
//! "SLC" | version u8 | header length u32 LE | payload length u32 LE | header | payload
//! ```
//!
//! Both lengths are checked against [`Limits`] before anything is allocated, the header is
//! decoded with a byte limit equal to its announced length (and must use all of it), and a
//! sample header's field lengths must add up to the payload length. A frame that fails any
//! check is a [`WireError`]: the receiver closes that connection and nothing else.

use bincode::Options;

use crate::message::Message;

/// The protocol version this build speaks.
pub const VERSION: u8 = 9;
/// Bytes before the header.
pub const PREFIX_LEN: usize = 12;
const MAGIC: &[u8; 3] = b"SLC";

/// Upper bounds on what a peer may announce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_header: u32,
    pub max_payload: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header: 1 << 20,
            max_payload: 256 << 20,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("not a Sluice frame (starts with {0:02x?})")]
    Magic([u8; 3]),
    #[error("unsupported protocol version {found} (this build speaks {VERSION})")]
    Version { found: u8 },
    #[error("{what} length {len} exceeds the limit {limit}")]
    TooLarge {
        what: &'static str,
        len: u64,
        limit: u64,
    },
    #[error("malformed {len}-byte header: {detail}")]
    Header { len: u32, detail: String },
    #[error("{kind} header announces {announced} payload bytes but the frame has {actual}")]
    PayloadMismatch {
        kind: &'static str,
        announced: u64,
        actual: u64,
    },
    #[error("encoding a {kind} header: {detail}")]
    Encode { kind: &'static str, detail: String },
}

/// A decoded prefix: how long the header and payload that follow are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub header_len: u32,
    pub payload_len: u32,
}

impl Prefix {
    pub fn frame_len(&self) -> usize {
        PREFIX_LEN + self.header_len as usize + self.payload_len as usize
    }
}

fn options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(limit)
        .reject_trailing_bytes()
}

/// Appends a frame's prefix and header to `out`; the caller sends `payload_len` payload bytes
/// right after (straight from the tensor's buffer, never copied into `out`).
pub fn encode_header(
    message: &Message,
    payload_len: u64,
    limits: &Limits,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let announced = message.payload_len();
    if announced != payload_len {
        return Err(WireError::PayloadMismatch {
            kind: message.kind(),
            announced,
            actual: payload_len,
        });
    }
    check("payload", payload_len, limits.max_payload)?;
    let start = out.len();
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&[0; 8]);
    options(u64::from(limits.max_header))
        .serialize_into(&mut *out, message)
        .map_err(|e| {
            out.truncate(start);
            WireError::Encode {
                kind: message.kind(),
                detail: e.to_string(),
            }
        })?;
    let header_len = (out.len() - start - PREFIX_LEN) as u32;
    out[start + 4..start + 8].copy_from_slice(&header_len.to_le_bytes());
    out[start + 8..start + 12].copy_from_slice(&(payload_len as u32).to_le_bytes());
    Ok(())
}

/// Appends a whole frame (prefix, header, payload) to `out`.
pub fn encode_frame(
    message: &Message,
    payload: &[u8],
    limits: &Limits,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    encode_header(message, payload.len() as u64, limits, out)?;
    out.extend_from_slice(payload);
    Ok(())
}

/// Checks a frame's first [`PREFIX_LEN`] bytes.
pub fn decode_prefix(bytes: &[u8; PREFIX_LEN], limits: &Limits) -> Result<Prefix, WireError> {
    let magic = [bytes[0], bytes[1], bytes[2]];
    if &magic != MAGIC {
        return Err(WireError::Magic(magic));
    }
    if bytes[3] != VERSION {
        return Err(WireError::Version { found: bytes[3] });
    }
    let header_len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let payload_len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    check("header", u64::from(header_len), limits.max_header)?;
    check("payload", u64::from(payload_len), limits.max_payload)?;
    Ok(Prefix {
        header_len,
        payload_len,
    })
}

/// Decodes a header of the length its prefix announced, and checks that it agrees with the
/// payload length.
pub fn decode_header(prefix: &Prefix, header: &[u8]) -> Result<Message, WireError> {
    let malformed = |detail: String| WireError::Header {
        len: prefix.header_len,
        detail,
    };
    if header.len() != prefix.header_len as usize {
        return Err(malformed(format!("got {} bytes", header.len())));
    }
    let message: Message = options(u64::from(prefix.header_len))
        .deserialize(header)
        .map_err(|e| malformed(e.to_string()))?;
    let announced = message.payload_len();
    if announced != u64::from(prefix.payload_len) {
        return Err(WireError::PayloadMismatch {
            kind: message.kind(),
            announced,
            actual: u64::from(prefix.payload_len),
        });
    }
    Ok(message)
}

/// A whole frame decoded from a buffer.
#[derive(Debug, PartialEq)]
pub struct Frame<'a> {
    pub message: Message,
    pub payload: &'a [u8],
}

/// Decodes the first frame of `buf`: `Ok(None)` when more bytes are needed, else the frame
/// and how many bytes it used.
pub fn decode_frame<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(Frame<'a>, usize)>, WireError> {
    let Some(head) = buf.first_chunk::<PREFIX_LEN>() else {
        return Ok(None);
    };
    let prefix = decode_prefix(head, limits)?;
    if buf.len() < prefix.frame_len() {
        return Ok(None);
    }
    let header_end = PREFIX_LEN + prefix.header_len as usize;
    let message = decode_header(&prefix, &buf[PREFIX_LEN..header_end])?;
    let payload = &buf[header_end..prefix.frame_len()];
    Ok(Some((Frame { message, payload }, prefix.frame_len())))
}

fn check(what: &'static str, len: u64, limit: u32) -> Result<(), WireError> {
    if len > u64::from(limit) {
        return Err(WireError::TooLarge {
            what,
            len,
            limit: u64::from(limit),
        });
    }
    Ok(())
}
