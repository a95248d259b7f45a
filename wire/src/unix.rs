//! A same-host connection's Unix stream once its handshake is done: registered with the
//! reactor for reading only, and read through a buffer.
//!
//! tokio registers a stream for both directions, edge-triggered. Each time one side reads a
//! frame off a Unix socket, the kernel frees the frame's buffer and signals room to write
//! (`unix_write_space`), and the other side's reactor, registered for writing, is woken with
//! nothing to write. At one frame a sample, that was a tenth of a client's CPU per sample
//! (`perf` on `bench/host_cost_outside.sh`), and as many needless wake-ups of the worker.
//! Here the stream is registered for reading only; a write that finds the socket full (rare:
//! credits bound what is in flight) registers a duplicate of the descriptor for writing until
//! it gets through.
//!
//! Reads go through a buffer: a frame's prefix and header come in one `recv`, and a burst of
//! frames too, rather than a `recv` for each part of each frame.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdStream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, BufReader, Interest, ReadBuf};

/// The read buffer: frames of a sample's fields are small, so many fit.
const READ_BUFFER: usize = 64 * 1024;

/// `stream` as a buffered reading half and a writing half that does not wake its reactor
/// when the peer reads. Call it between frames: nothing read is lost, nothing is buffered
/// yet.
pub fn split(stream: tokio::net::UnixStream) -> io::Result<(BufReader<ReadHalf>, WriteHalf)> {
    // Deregistered from the reactor; the socket stays non-blocking.
    let stream = stream.into_std()?;
    // SAFETY: the stream owns its descriptor, open until the AsyncFd drops it.
    let fd = Arc::new(unsafe { AsyncFd::register_with_interest(stream, Interest::READABLE) }?);
    Ok((
        BufReader::with_capacity(READ_BUFFER, ReadHalf(fd.clone())),
        WriteHalf { fd, waiting: None },
    ))
}

/// [`split`] for a stream whose handshake ran on tokio's owned halves (the frame reader and
/// writer each took one): they are put back together first.
pub fn split_halves(
    read: tokio::net::unix::OwnedReadHalf,
    write: tokio::net::unix::OwnedWriteHalf,
) -> io::Result<(BufReader<ReadHalf>, WriteHalf)> {
    split(read.reunite(write).map_err(io::Error::other)?)
}

/// The reading half of [`split`].
pub struct ReadHalf(Arc<AsyncFd<StdStream>>);

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let wanted = unfilled.len();
            match guard.try_io(|fd| Read::read(&mut fd.get_ref(), unfilled)) {
                Ok(Ok(n)) => {
                    // Fewer bytes than asked for: the socket is drained, so the next read
                    // waits for the next readiness rather than calling `recv` to hear
                    // EWOULDBLOCK. (Readiness that came in meanwhile is kept: tokio clears
                    // only the readiness this guard saw.)
                    if n > 0 && n < wanted {
                        guard.clear_ready();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Not readable after all: readiness is cleared, wait for the next.
                Err(_) => continue,
            }
        }
    }
}

/// The writing half of [`split`].
pub struct WriteHalf {
    fd: Arc<AsyncFd<StdStream>>,
    /// A duplicate of the descriptor, registered for writing while a write waits for room.
    waiting: Option<AsyncFd<OwnedFd>>,
}

impl WriteHalf {
    /// Runs `write` on the stream: at once, or once there is room when the socket is full.
    fn poll_with(
        &mut self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&StdStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            let Some(waiting) = &self.waiting else {
                match write(self.fd.get_ref()) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // Registered after the failed write: if room came in between, the
                        // registration reports it at once.
                        let dup = self.fd.get_ref().as_fd().try_clone_to_owned()?;
                        // SAFETY: the duplicate is owned, open until the AsyncFd drops it.
                        let registered =
                            unsafe { AsyncFd::register_with_interest(dup, Interest::WRITABLE) };
                        self.waiting = Some(registered?);
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    done => return Poll::Ready(done),
                }
            };
            let mut guard = ready!(waiting.poll_write_ready(cx))?;
            let fd = &self.fd;
            match guard.try_io(|_| write(fd.get_ref())) {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(done) => {
                    drop(guard);
                    // Through: stop listening for room (and the wake-ups it costs).
                    self.waiting = None;
                    return Poll::Ready(done);
                }
                // Still full: readiness is cleared, wait for the next.
                Err(_) => continue,
            }
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_with(cx, |mut s| Write::write(&mut s, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_with(cx, |mut s| Write::write_vectored(&mut s, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.fd.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Frames larger than the socket's buffer: the writer waits for room (registered for
    /// writing only then) and everything arrives in order.
    #[tokio::test]
    async fn a_full_socket_waits_for_room_and_loses_nothing() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (_, mut w) = split(a).unwrap();
        let (mut r, _keep) = split(b).unwrap();
        let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            for part in sent.chunks(100_000) {
                w.write_all(part).await.unwrap();
            }
            w.shutdown().await.unwrap();
            w
        });
        let mut got = Vec::new();
        // Slow at first, so the writer meets a full socket.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        r.read_to_end(&mut got).await.unwrap();
        let w = writer.await.unwrap();
        assert!(w.waiting.is_none(), "no longer registered for writing");
        assert!(
            got == data,
            "{} bytes of {} arrived, or out of order",
            got.len(),
            data.len()
        );
    }

    /// The peer's end of stream reads as 0 bytes, and its frames before it are all there.
    #[tokio::test]
    async fn reads_frames_then_the_end() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (mut r, _w) = split(a).unwrap();
        let (_, mut w) = split(b).unwrap();
        w.write_all(b"one").await.unwrap();
        let n = w
            .write_vectored(&[IoSlice::new(b"two"), IoSlice::new(b"three")])
            .await
            .unwrap();
        assert_eq!(n, 8, "both parts in one write");
        drop(w);
        let mut got = String::new();
        r.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "onetwothree");
    }
}
