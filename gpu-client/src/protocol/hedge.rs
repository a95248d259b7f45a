//! Hedging: in plan order, when the delivery order has not moved for `hedge_after`, the rest
//! of the awaited sample's unit goes to a second live worker too; the first copy wins.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Piece, Protocol, Tensor};

impl<P: Tensor> Protocol<P> {
    /// When to hedge: plan order, something is awaited, and the order has not moved for
    /// `hedge_after`.
    pub(super) fn hedge_deadline(&self) -> Option<Instant> {
        if self.held {
            return None;
        }
        let (unit, _) = self.reorder.awaited()?;
        if self.hedged.get(unit as usize).copied().unwrap_or(true) {
            return None;
        }
        Some(self.progressed + self.settings.config.hedge_after)
    }

    /// Gives the rest of the awaited sample's unit to a second live worker too, if a worker
    /// holds it and another is up. First copy wins: the ledger drops the slower one's.
    pub(super) fn hedge(&mut self) {
        let Some((unit, index)) = self.reorder.awaited() else {
            return;
        };
        if let Some(h) = self.hedged.get_mut(unit as usize) {
            *h = true;
        }
        let unit = u64::from(unit);
        let Some((holder, piece)) = self.links.iter().enumerate().find_map(|(i, l)| {
            l.open
                .iter()
                .find(|p| p.unit == unit && (p.start..p.end).contains(&index))
                .map(|p| (i, *p))
        }) else {
            return; // still queued (no worker has it): dispatch will send it
        };
        let Some(other) = (0..self.links.len())
            .filter(|&i| {
                let l = &self.links[i];
                i != holder && l.generation.is_some() && !l.leaving
            })
            .min_by_key(|&i| self.links[i].open.len())
        else {
            // Nobody to hedge to: say what the epoch waits for (a storage node restarting
            // shows here as a pause, and in the worker's log as its retries).
            tracing::info!(
                unit,
                worker = %self.links[holder].name,
                "sample {index} of unit {unit} is late ({:.1} s without progress); no other \
                 worker to hedge to, waiting",
                self.settings.config.hedge_after.as_secs_f64()
            );
            return;
        };
        self.counters.hedged.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("sluice_client_hedged_units_total").increment(1);
        tracing::info!(
            unit,
            slow = %self.links[holder].name,
            to = %self.links[other].name,
            "sample {index} of unit {unit} is late: hedging the rest of the unit"
        );
        for (start, end) in self.ledger.missing(unit, piece.start, piece.end) {
            let a = &mut self.attempts[unit as usize];
            let attempt = *a;
            *a += 1;
            let piece = Piece {
                priority: 0,
                unit,
                start,
                end,
                attempt,
            };
            self.send_piece(other, piece);
        }
    }
}
