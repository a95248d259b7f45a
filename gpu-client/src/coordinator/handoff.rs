//! The link between an epoch and the next one started early (`prefetch_next_epoch`).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::batch::Ring;

/// The link between an epoch and the next one, started early (`prefetch_next_epoch`): the
/// next epoch assigns its first units only once this one has handed out all of its own, so
/// it never takes a worker's unit slot from this one, and fills its first batch only once
/// this one has taken the buffer of its last, in this one's ring: the two epochs share the
/// ring's buffers, and the ring buffers this epoch still needs are never taken from it.
/// Made by [`handoff`]; the earlier epoch's coordinator holds the [`Successor`] half.
pub(crate) struct Successor {
    dispatched: CancellationToken,
    ended: CancellationToken,
    ring: Option<tokio::sync::oneshot::Sender<Arc<Ring>>>,
}

/// The later epoch's half of [`handoff`].
pub(crate) struct Predecessor {
    pub(super) dispatched: CancellationToken,
    ended: CancellationToken,
    pub(super) ring: Option<tokio::sync::oneshot::Receiver<Arc<Ring>>>,
}

pub(crate) fn handoff() -> (Successor, Predecessor) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let dispatched = CancellationToken::new();
    let ended = CancellationToken::new();
    (
        Successor {
            dispatched: dispatched.clone(),
            ended: ended.clone(),
            ring: Some(tx),
        },
        Predecessor {
            dispatched,
            ended,
            ring: Some(rx),
        },
    )
}

impl Successor {
    /// This epoch has handed out all of its units: the next may assign its own.
    pub(super) fn dispatched(&self) {
        self.dispatched.cancel();
    }

    /// This epoch has taken its last ring buffer: the next may fill from the same ring.
    pub(super) fn ring(&mut self, ring: &Arc<Ring>) {
        if let Some(tx) = self.ring.take() {
            let _ = tx.send(ring.clone());
        }
    }
}

impl Drop for Successor {
    /// An epoch that ends (finished, failed or cancelled) lets the next one go; a ring not
    /// handed over by then is not handed over (the next one makes its own).
    fn drop(&mut self) {
        self.dispatched.cancel();
        self.ended.cancel();
    }
}

impl Predecessor {
    /// Cancelled when the earlier epoch's coordinator has ended.
    pub(crate) fn ended_token(&self) -> CancellationToken {
        self.ended.clone()
    }
}
