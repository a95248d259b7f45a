//! Handles to a connection and its streams, for the link's tasks: each call takes the shared
//! lock, asks quinn-proto, and either answers or leaves a waker for the driver to call.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use quinn_proto as proto;
use quinn_proto::{ConnectionError, ConnectionHandle, ConnectionStats, Dir, StreamId, VarInt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Shared;

/// A connection: clones share it, and it closes (code 0) when the last handle to it, its
/// streams' included, is dropped.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    handle: ConnectionHandle,
}

impl Connection {
    pub(super) fn new(shared: Arc<Shared>, handle: ConnectionHandle) -> Self {
        shared.lock().conn(handle).handles += 1;
        Connection { shared, handle }
    }

    /// Opens a bidirectional stream, once the worker allows one.
    pub(crate) async fn open_bi(&self) -> Result<(SendStream, RecvStream), ConnectionError> {
        let id = poll_fn(|cx| {
            let mut state = self.shared.lock();
            let conn = state.conn(self.handle);
            if let Some(e) = &conn.error {
                return Poll::Ready(Err(e.clone()));
            }
            match conn.proto.streams().open(Dir::Bi) {
                Some(id) => Poll::Ready(Ok(id)),
                None => {
                    conn.opening.push(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await?;
        let send = SendStream {
            conn: self.clone(),
            id,
        };
        let recv = RecvStream {
            conn: self.clone(),
            id,
            finished: false,
        };
        Ok((send, recv))
    }

    /// Closes the connection, telling the worker `code` and `reason`.
    pub(crate) fn close(&self, code: VarInt, reason: &[u8]) {
        let mut wakers = Vec::new();
        {
            let mut state = self.shared.lock();
            let conn = state.conn(self.handle);
            conn.proto.close(
                std::time::Instant::now(),
                code,
                Bytes::copy_from_slice(reason),
            );
            conn.ended(ConnectionError::LocallyClosed, &mut wakers);
        }
        self.wake_driver();
        wakers.into_iter().for_each(|w| w.wake());
    }

    /// Why the connection ended, once it has.
    pub(crate) fn close_reason(&self) -> Option<ConnectionError> {
        self.shared.lock().conn(self.handle).error.clone()
    }

    pub(crate) fn stats(&self) -> ConnectionStats {
        self.shared.lock().conn(self.handle).proto.stats()
    }

    /// Wakes the driver after a call that left quinn-proto something to send.
    fn wake_driver(&self) {
        self.shared.wake.notify_one();
    }
}

impl Clone for Connection {
    fn clone(&self) -> Self {
        Connection::new(self.shared.clone(), self.handle)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let conn = state.conn(self.handle);
        conn.handles -= 1;
        if conn.handles == 0 && conn.error.is_none() {
            conn.proto
                .close(std::time::Instant::now(), 0u32.into(), Bytes::new());
            conn.error = Some(ConnectionError::LocallyClosed);
        }
        drop(state);
        self.wake_driver();
    }
}

/// A connection being set up; it resolves once the handshake is done.
pub(crate) struct Connecting {
    conn: Option<Connection>,
}

impl Connecting {
    pub(super) fn new(conn: Connection) -> Self {
        Connecting { conn: Some(conn) }
    }
}

impl Future for Connecting {
    type Output = Result<Connection, ConnectionError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(c) = &self.conn else {
            return Poll::Ready(Err(ConnectionError::LocallyClosed));
        };
        {
            let mut state = c.shared.lock();
            let conn = state.conn(c.handle);
            if let Some(e) = &conn.error {
                return Poll::Ready(Err(e.clone()));
            }
            if !conn.connected {
                conn.connecting = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        match self.conn.take() {
            Some(c) => Poll::Ready(Ok(c)),
            None => Poll::Ready(Err(ConnectionError::LocallyClosed)),
        }
    }
}

/// The receiving half of a stream.
pub(crate) struct RecvStream {
    conn: Connection,
    id: StreamId,
    /// Its end was read (or it was reset).
    finished: bool,
}

impl RecvStream {
    /// The next chunk of at most `max` bytes as it arrived (a slice of a received packet, not
    /// copied); `None` at the stream's end.
    pub(crate) async fn read_chunk(&mut self, max: usize) -> io::Result<Option<proto::Chunk>> {
        poll_fn(|cx| self.poll_chunk(cx, max)).await
    }

    fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
    ) -> Poll<io::Result<Option<proto::Chunk>>> {
        if self.finished {
            return Poll::Ready(Ok(None));
        }
        let mut state = self.conn.shared.lock();
        let conn = state.conn(self.conn.handle);
        let mut stream = conn.proto.recv_stream(self.id);
        let mut chunks = match stream.read(true) {
            Ok(c) => c,
            Err(e) => return Poll::Ready(Err(io::Error::other(e))),
        };
        let read = chunks.next(max);
        let transmit = chunks.finalize().should_transmit();
        let answer = match read {
            Ok(Some(chunk)) => Poll::Ready(Ok(Some(chunk))),
            Ok(None) => {
                self.finished = true;
                Poll::Ready(Ok(None))
            }
            Err(proto::ReadError::Blocked) => match &conn.error {
                Some(e) => Poll::Ready(Err(lost(e))),
                None => {
                    conn.readers.insert(self.id, cx.waker().clone());
                    Poll::Pending
                }
            },
            Err(proto::ReadError::Reset(code)) => {
                self.finished = true;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("the worker reset the stream (code {code})"),
                )))
            }
        };
        drop(state);
        if transmit {
            self.conn.wake_driver();
        }
        answer
    }
}

impl AsyncRead for RecvStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.poll_chunk(cx, buf.remaining()) {
            Poll::Ready(Ok(Some(chunk))) => {
                buf.put_slice(&chunk.bytes);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(None)) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        let mut state = self.conn.shared.lock();
        let conn = state.conn(self.conn.handle);
        conn.readers.remove(&self.id);
        if !self.finished && conn.error.is_none() {
            // Already stopped or finished is fine.
            let _ = conn.proto.recv_stream(self.id).stop(0u32.into());
        }
    }
}

/// The sending half of a stream.
pub(crate) struct SendStream {
    conn: Connection,
    id: StreamId,
}

impl AsyncWrite for SendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.conn.shared.lock();
        let conn = state.conn(self.conn.handle);
        if let Some(e) = &conn.error {
            return Poll::Ready(Err(lost(e)));
        }
        let written = match conn.proto.send_stream(self.id).write(buf) {
            Ok(n) => n,
            Err(proto::WriteError::Blocked) => {
                conn.writers.insert(self.id, cx.waker().clone());
                return Poll::Pending;
            }
            Err(e) => return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, e))),
        };
        drop(state);
        self.conn.wake_driver();
        Poll::Ready(Ok(written))
    }

    /// Written bytes are quinn-proto's to send: the driver sends them as it can.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.conn.shared.lock();
        let conn = state.conn(self.conn.handle);
        if let Some(e) = &conn.error {
            return Poll::Ready(Err(lost(e)));
        }
        // Finished already is fine.
        let _ = conn.proto.send_stream(self.id).finish();
        drop(state);
        self.conn.wake_driver();
        Poll::Ready(Ok(()))
    }
}

impl Drop for SendStream {
    fn drop(&mut self) {
        let mut state = self.conn.shared.lock();
        let conn = state.conn(self.conn.handle);
        conn.writers.remove(&self.id);
        if conn.error.is_none() {
            // Finished or reset already is fine.
            let _ = conn.proto.send_stream(self.id).finish();
        }
    }
}

/// A lost connection as the I/O error a stream's reader or writer sees.
fn lost(e: &ConnectionError) -> io::Error {
    let kind = match e {
        ConnectionError::TimedOut => io::ErrorKind::TimedOut,
        ConnectionError::LocallyClosed => io::ErrorKind::NotConnected,
        _ => io::ErrorKind::ConnectionAborted,
    };
    io::Error::new(kind, e.clone())
}
