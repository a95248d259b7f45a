//! A thin async shell over the codec, for any tokio byte stream (a QUIC stream, TCP, a Unix
//! socket). The reader hands out the header first and lets the caller read the payload
//! straight into its own buffer, so a tensor is never copied through an intermediate one.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::codec::{decode_header, decode_prefix, encode_header, Limits, WireError, PREFIX_LEN};
use crate::message::Message;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("stream: {0}")]
    Io(#[from] std::io::Error),
    #[error("the peer closed the stream in the middle of a frame")]
    Truncated,
    #[error("payload of {announced} bytes read as {requested}")]
    PayloadSize { announced: u64, requested: u64 },
}

/// Reads frames: [`FrameReader::next`] for a header, then exactly one of
/// [`FrameReader::payload_into`] or [`FrameReader::skip_payload`] when it announced a payload.
pub struct FrameReader<R> {
    inner: R,
    limits: Limits,
    header: Vec<u8>,
    pending_payload: u64,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, limits: Limits) -> Self {
        FrameReader {
            inner,
            limits,
            header: Vec::new(),
            pending_payload: 0,
        }
    }

    /// The next message; `Ok(None)` at a clean end of stream between frames. An unread
    /// payload of the previous frame is skipped first.
    pub async fn next(&mut self) -> Result<Option<Message>, IoError> {
        if self.pending_payload > 0 {
            self.skip_payload().await?;
        }
        let mut prefix = [0u8; PREFIX_LEN];
        let mut got = 0;
        while got < PREFIX_LEN {
            let n = self.inner.read(&mut prefix[got..]).await?;
            if n == 0 {
                return if got == 0 {
                    Ok(None)
                } else {
                    Err(IoError::Truncated)
                };
            }
            got += n;
        }
        let prefix = decode_prefix(&prefix, &self.limits)?;
        // Bounded by `limits.max_header` before this allocation.
        self.header.resize(prefix.header_len as usize, 0);
        self.read_exact_or_truncated(prefix.header_len as usize)
            .await?;
        let message = decode_header(&prefix, &self.header)?;
        self.pending_payload = u64::from(prefix.payload_len);
        Ok(Some(message))
    }

    async fn read_exact_or_truncated(&mut self, len: usize) -> Result<(), IoError> {
        match self.inner.read_exact(&mut self.header[..len]).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(IoError::Truncated),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the current frame's payload into `dst`, which must be exactly its length.
    pub async fn payload_into(&mut self, dst: &mut [u8]) -> Result<(), IoError> {
        if dst.len() as u64 != self.pending_payload {
            return Err(IoError::PayloadSize {
                announced: self.pending_payload,
                requested: dst.len() as u64,
            });
        }
        self.pending_payload = 0;
        match self.inner.read_exact(dst).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(IoError::Truncated),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the first `dst.len()` bytes of the current frame's payload into `dst`, leaving
    /// the rest for later calls: a sample's tensor into its buffer, then its fields into
    /// theirs, without a copy between.
    pub async fn payload_part_into(&mut self, dst: &mut [u8]) -> Result<(), IoError> {
        if dst.len() as u64 > self.pending_payload {
            return Err(IoError::PayloadSize {
                announced: self.pending_payload,
                requested: dst.len() as u64,
            });
        }
        self.pending_payload -= dst.len() as u64;
        match self.inner.read_exact(dst).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(IoError::Truncated),
            Err(e) => Err(e.into()),
        }
    }

    /// Payload bytes of the current frame not read yet (bounded by the frame limits).
    pub fn pending_payload(&self) -> u64 {
        self.pending_payload
    }

    /// The stream, for the caller to read the next `len` bytes of the frame's payload from
    /// it directly (a transport's own zero-copy read); they count as read.
    pub fn take_payload(&mut self, len: u64) -> Result<&mut R, IoError> {
        if len > self.pending_payload {
            return Err(IoError::PayloadSize {
                announced: self.pending_payload,
                requested: len,
            });
        }
        self.pending_payload -= len;
        Ok(&mut self.inner)
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The stream, between frames (an unread payload stays unread); the reader buffers
    /// nothing, so no byte read from the stream is lost.
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Discards the current frame's payload.
    pub async fn skip_payload(&mut self) -> Result<(), IoError> {
        let n = std::mem::take(&mut self.pending_payload);
        let copied =
            tokio::io::copy(&mut (&mut self.inner).take(n), &mut tokio::io::sink()).await?;
        if copied != n {
            return Err(IoError::Truncated);
        }
        Ok(())
    }
}

/// Writes frames; a payload is written from the caller's buffers, not copied.
pub struct FrameWriter<W> {
    inner: W,
    limits: Limits,
    buf: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(inner: W, limits: Limits) -> Self {
        FrameWriter {
            inner,
            limits,
            buf: Vec::with_capacity(256),
        }
    }

    /// Sends one frame whose payload is the concatenation of `payload`.
    pub async fn send(&mut self, message: &Message, payload: &[&[u8]]) -> Result<(), IoError> {
        let len = payload.iter().map(|p| p.len() as u64).sum();
        self.buf.clear();
        encode_header(message, len, &self.limits, &mut self.buf)?;
        self.inner.write_all(&self.buf).await?;
        for part in payload {
            self.inner.write_all(part).await?;
        }
        Ok(())
    }

    pub async fn flush(&mut self) -> Result<(), IoError> {
        self.inner.flush().await?;
        Ok(())
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}
