//! A connection's reader: frames off the stream go to the session, and what it lets through
//! is read (tensor and fields) and sent to the coordinator, on a task of its own (reading is
//! not cancel-safe mid-frame).

use std::sync::{Arc, Mutex};

use sluice_wire::io::{FrameReader, IoError};
use sluice_wire::{BufferPool, SampleHeader, SamplePayload};
use tokio::io::AsyncRead;
use tokio::sync::{mpsc, Notify};

use super::{lock, Event, Writer};
use crate::clock::now;
use crate::same_host::{Payload, SlotPool};
use crate::session::{Ended, Received, Session, TensorAt};

/// What the reader task needs.
pub(super) struct ReadTo {
    pub session: Arc<Mutex<Session>>,
    /// Told when the reader ended the session.
    pub wake: Arc<Notify>,
    pub link: usize,
    /// Same-host connections: the segment samples arrive in.
    pub pool: Option<Arc<SlotPool>>,
    /// Same-host connections with the batch arena: it, and this connection's writer there.
    pub arena: Option<Writer>,
    pub buffers: Arc<BufferPool>,
    pub events: mpsc::Sender<Event>,
}

/// How a transport's stream hands over a sample's tensor.
pub(super) trait TensorRead: AsyncRead + Unpin + Sized {
    /// The next `len` bytes of the frame's payload, as the sample's tensor.
    fn tensor<'a>(
        reader: &'a mut FrameReader<Self>,
        len: usize,
        buffers: &'a Arc<BufferPool>,
    ) -> impl std::future::Future<Output = Result<Payload, IoError>> + Send + 'a;
}

/// QUIC: the stream's own chunks (its decrypted packets), not copied into a buffer first;
/// the coordinator copies them once, into the batch.
impl TensorRead for crate::quic::RecvStream {
    async fn tensor(
        reader: &mut FrameReader<Self>,
        len: usize,
        _buffers: &Arc<BufferPool>,
    ) -> Result<Payload, IoError> {
        let stream = reader.take_payload(len as u64)?;
        let mut chunks = Vec::with_capacity(len / 1200 + 1);
        let mut left = len;
        while left > 0 {
            match stream.read_chunk(left).await {
                Ok(Some(chunk)) => {
                    left -= chunk.bytes.len().min(left);
                    chunks.push(chunk.bytes);
                }
                Ok(None) => return Err(IoError::Truncated),
                Err(e) => return Err(IoError::Io(e)),
            }
        }
        Ok(Payload::Chunks(chunks))
    }
}

/// The same-host socket carries tensors in slots; one in a frame (a protocol error the
/// session reports before asking) would be read into a reused buffer.
impl TensorRead for tokio::io::BufReader<sluice_wire::unix::ReadHalf> {
    async fn tensor(
        reader: &mut FrameReader<Self>,
        len: usize,
        buffers: &Arc<BufferPool>,
    ) -> Result<Payload, IoError> {
        let mut payload = crate::buffers::take(buffers, len);
        reader.payload_part_into(&mut payload).await?;
        Ok(Payload::Bytes(payload))
    }
}

pub(super) async fn read_frames<R: TensorRead>(mut reader: FrameReader<R>, to: ReadTo) {
    let ended = loop {
        let message = match reader.next().await {
            Ok(Some(m)) => m,
            Ok(None) => break Ended::Lost("the worker closed the stream".into()),
            Err(IoError::Wire(w)) => break to.protocol(w.to_string()),
            Err(e) => break Ended::Lost(e.to_string()),
        };
        let received = lock(&to.session).handle(message, now());
        let event = match to.carry_out(received, &mut reader).await {
            Ok(Some(event)) => event,
            Ok(None) if lock(&to.session).is_ended() => {
                to.wake.notify_one();
                return;
            }
            Ok(None) => continue,
            Err(e) => break e,
        };
        lock(&to.session).waiting(true, now());
        let sent = to.events.send(event).await;
        lock(&to.session).waiting(false, now());
        // The epoch is over. A connection sharing the batch arena keeps reading (the samples'
        // answers settle their places) until its worker releases the rest; the link ends it.
        if sent.is_err() && to.arena.is_none() {
            break Ended::Cancelled;
        }
    };
    lock(&to.session).fail(ended);
    to.wake.notify_one();
}

impl ReadTo {
    fn protocol(&self, detail: String) -> Ended {
        let worker = lock(&self.session).worker().to_string();
        Ended::Fatal(crate::error::ClientError::Protocol { worker, detail })
    }

    /// Carries out what the session made of a frame: the event for the coordinator, if any.
    /// Each sample or skip answers its unit in the slot pool and its place in the arena.
    async fn carry_out<R: TensorRead>(
        &self,
        received: Received,
        reader: &mut FrameReader<R>,
    ) -> Result<Option<Event>, Ended> {
        let (pool, arena) = (self.pool.as_ref(), self.arena.as_ref());
        let event = match received {
            Received::Sample { header, at } => return self.sample(reader, header, at).await,
            Received::SkipPayload => {
                reader
                    .skip_payload()
                    .await
                    .map_err(|e| Ended::Lost(e.to_string()))?;
                return Ok(None);
            }
            Received::Skipped(skipped) => {
                if let Some(p) = pool {
                    p.answered(skipped.unit, skipped.attempt);
                }
                if let Some((a, w)) = arena {
                    a.answered(*w, (skipped.unit, skipped.attempt, skipped.index));
                }
                Event::Skipped { skipped }
            }
            Received::UnitDone(done) => {
                self.unit_ended(done.unit, done.attempt);
                Event::UnitDone {
                    link: self.link,
                    done,
                }
            }
            Received::UnitFailed(failed) => {
                self.unit_ended(failed.unit, failed.attempt);
                Event::UnitFailed {
                    link: self.link,
                    failed,
                }
            }
            // The job is cancelled: its places in the batch arena are this process's again.
            Received::Released => {
                if let Some((a, w)) = arena {
                    a.released(*w);
                }
                return Ok(None);
            }
            Received::Nothing | Received::Ready { .. } | Received::Attach(_) => return Ok(None),
        };
        Ok(Some(event))
    }

    fn unit_ended(&self, unit: u64, attempt: u32) {
        if let Some(p) = &self.pool {
            p.unit_ended(unit, attempt);
        }
        if let Some((a, w)) = &self.arena {
            a.unit_ended(*w, unit, attempt);
        }
    }

    /// A sample where the session found its tensor: the rest of its frame's payload, its
    /// fields, is read into a buffer of their own, the header's list of (name, length) moved
    /// into them. The lengths are checked against what the frame still holds (bounded by the
    /// frame limits) before anything is allocated.
    async fn sample<R: TensorRead>(
        &self,
        reader: &mut FrameReader<R>,
        mut header: SampleHeader,
        at: TensorAt,
    ) -> Result<Option<Event>, Ended> {
        let key = (header.unit, header.attempt, header.index);
        let payload = match (at, &self.pool, &self.arena) {
            (TensorAt::Stream, _, _) => {
                // Bounded by the frame limits before this allocation.
                let len = header.tensor_bytes as usize;
                R::tensor(reader, len, &self.buffers)
                    .await
                    .map_err(|e| Ended::Lost(e.to_string()))?
            }
            (TensorAt::Slot(slot), Some(pool), arena) => {
                let slot = pool.filled(slot).map_err(|e| self.protocol(e))?;
                pool.answered(header.unit, header.attempt);
                if let Some((a, w)) = arena {
                    a.answered(*w, key);
                }
                Payload::Slot(slot)
            }
            (TensorAt::Placed { place }, Some(pool), Some((arena, writer))) => {
                pool.answered(header.unit, header.attempt);
                arena
                    .placed(*writer, place, key)
                    .map_err(|e| self.protocol(e))?;
                Payload::Placed {
                    arena: arena.clone(),
                    place,
                }
            }
            _ => return Err(self.protocol("a same-host sample with no segment".into())),
        };
        Session::check_fields(&header, reader.pending_payload())?;
        let len = header.fields_len();
        let mut bytes = vec![0u8; len as usize];
        if len > 0 {
            reader
                .payload_into(&mut bytes)
                .await
                .map_err(|e| Ended::Lost(e.to_string()))?;
        }
        let fields = SamplePayload::fields(&mut header, bytes).map_err(Ended::Lost)?;
        Ok(Some(Event::Sample {
            link: self.link,
            header,
            payload,
            fields,
        }))
    }
}
