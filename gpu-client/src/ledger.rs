//! The ledger: which planned samples of an epoch are accounted for (delivered or skipped).
//! Pure bookkeeping over the epoch's work units, so exactly-once is decided in one place from
//! a frame's (unit, shard, index) alone, whichever worker or attempt sent it.

use serde::{Deserialize, Serialize};
use sluice_plan::WorkUnit;

/// What the ledger says of an arriving sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Planned and new: take it.
    Accept,
    /// Already accounted for: drop it and count it.
    Duplicate,
    /// Not in this rank's plan for this epoch.
    Unplanned,
}

/// One unit's accounting: a bit per sample of `start..end`.
#[derive(Clone, Debug)]
struct UnitBits {
    unit: WorkUnit,
    bits: Vec<u64>,
    count: u64,
}

impl UnitBits {
    fn new(unit: WorkUnit) -> Self {
        let n = unit.len() as usize;
        UnitBits {
            unit,
            bits: vec![0; n.div_ceil(64)],
            count: 0,
        }
    }

    fn get(&self, i: u64) -> bool {
        let i = (i - self.unit.start) as usize;
        self.bits[i / 64] >> (i % 64) & 1 == 1
    }

    fn set(&mut self, i: u64) {
        let i = (i - self.unit.start) as usize;
        self.bits[i / 64] |= 1 << (i % 64);
        self.count += 1;
    }

    fn complete(&self) -> bool {
        self.count == self.unit.len()
    }
}

/// Accounting for one rank's epoch.
#[derive(Clone, Debug)]
pub struct Ledger {
    /// By unit id; ids are positions in the epoch's plan.
    units: Vec<UnitBits>,
    accounted: u64,
    planned: u64,
}

impl Ledger {
    /// A ledger over the epoch's units; unit ids must be `0..units.len()` in order.
    pub fn new(units: &[WorkUnit]) -> Self {
        Ledger {
            planned: units.iter().map(WorkUnit::len).sum(),
            units: units.iter().cloned().map(UnitBits::new).collect(),
            accounted: 0,
        }
    }

    pub fn planned(&self) -> u64 {
        self.planned
    }

    pub fn accounted(&self) -> u64 {
        self.accounted
    }

    pub fn is_complete(&self) -> bool {
        self.accounted == self.planned
    }

    pub fn unit(&self, id: u64) -> Option<&WorkUnit> {
        self.units.get(id as usize).map(|u| &u.unit)
    }

    /// Checks a sample without recording it.
    pub fn check(&self, unit: u64, shard: u32, index: u64) -> Verdict {
        match self.units.get(unit as usize) {
            Some(u) if u.unit.shard == shard && (u.unit.start..u.unit.end).contains(&index) => {
                if u.get(index) {
                    Verdict::Duplicate
                } else {
                    Verdict::Accept
                }
            }
            _ => Verdict::Unplanned,
        }
    }

    /// Records a sample as accounted for; the verdict says whether it was new.
    pub fn record(&mut self, unit: u64, shard: u32, index: u64) -> Verdict {
        let v = self.check(unit, shard, index);
        if v == Verdict::Accept {
            self.units[unit as usize].set(index);
            self.accounted += 1;
        }
        v
    }

    pub fn unit_complete(&self, unit: u64) -> bool {
        self.units
            .get(unit as usize)
            .is_some_and(UnitBits::complete)
    }

    /// The sample ranges of `start..end` in `unit` not yet accounted for.
    pub fn missing(&self, unit: u64, start: u64, end: u64) -> Vec<(u64, u64)> {
        let Some(u) = self.units.get(unit as usize) else {
            return Vec::new();
        };
        let (start, end) = (start.max(u.unit.start), end.min(u.unit.end));
        let mut out: Vec<(u64, u64)> = Vec::new();
        for i in start..end {
            if !u.get(i) {
                match out.last_mut() {
                    Some(last) if last.1 == i => last.1 = i + 1,
                    _ => out.push((i, i + 1)),
                }
            }
        }
        out
    }

    /// The ledger as a compact record: complete units by id, partial ones as accounted ranges.
    pub fn to_record(&self) -> LedgerRecord {
        let mut record = LedgerRecord::default();
        for (id, u) in self.units.iter().enumerate() {
            if u.complete() {
                match record.complete.last_mut() {
                    Some(last) if last.1 == id as u64 => last.1 += 1,
                    _ => record.complete.push((id as u64, id as u64 + 1)),
                }
            } else if u.count > 0 {
                let missing = self.missing(id as u64, u.unit.start, u.unit.end);
                let mut have = Vec::new();
                let mut at = u.unit.start;
                for (s, e) in missing {
                    if s > at {
                        have.push((at, s));
                    }
                    at = e;
                }
                if at < u.unit.end {
                    have.push((at, u.unit.end));
                }
                record.partial.push((id as u64, have));
            }
        }
        record
    }

    /// Marks what a record says was accounted for. Errors name what does not fit the plan.
    pub fn apply(&mut self, record: &LedgerRecord) -> Result<(), String> {
        for &(a, b) in &record.complete {
            for id in a..b {
                let u = self
                    .units
                    .get(id as usize)
                    .ok_or_else(|| format!("unit {id} is not in this epoch's plan"))?;
                let (shard, start, end) = (u.unit.shard, u.unit.start, u.unit.end);
                for i in start..end {
                    self.record(id, shard, i);
                }
            }
        }
        for (id, ranges) in &record.partial {
            let u = self
                .units
                .get(*id as usize)
                .ok_or_else(|| format!("unit {id} is not in this epoch's plan"))?;
            let (shard, start, end) = (u.unit.shard, u.unit.start, u.unit.end);
            for &(a, b) in ranges {
                if a < start || b > end || a > b {
                    return Err(format!(
                        "unit {id}: samples {a}..{b} are outside {start}..{end}"
                    ));
                }
                for i in a..b {
                    self.record(*id, shard, i);
                }
            }
        }
        Ok(())
    }
}

/// A ledger as it goes into a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRecord {
    /// Runs of unit ids accounted for completely, as half-open ranges.
    pub complete: Vec<(u64, u64)>,
    /// Units accounted for in part: (unit id, accounted sample ranges).
    pub partial: Vec<(u64, Vec<(u64, u64)>)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units() -> Vec<WorkUnit> {
        vec![
            WorkUnit {
                id: 0,
                shard: 3,
                start: 0,
                end: 100,
                padding: false,
                group: 0,
            },
            WorkUnit {
                id: 1,
                shard: 1,
                start: 50,
                end: 70,
                padding: false,
                group: 0,
            },
            WorkUnit {
                id: 2,
                shard: 3,
                start: 100,
                end: 130,
                padding: true,
                group: 0,
            },
        ]
    }

    #[test]
    fn accepts_each_planned_sample_once() {
        let mut l = Ledger::new(&units());
        assert_eq!(l.planned(), 150);
        assert_eq!(l.record(0, 3, 5), Verdict::Accept);
        assert_eq!(l.record(0, 3, 5), Verdict::Duplicate);
        assert_eq!(l.record(0, 1, 5), Verdict::Unplanned, "wrong shard");
        assert_eq!(l.record(1, 1, 49), Verdict::Unplanned, "before the unit");
        assert_eq!(l.record(1, 1, 70), Verdict::Unplanned, "after the unit");
        assert_eq!(l.record(9, 3, 5), Verdict::Unplanned, "no such unit");
        assert_eq!(l.accounted(), 1);
        for i in 50..70 {
            assert_eq!(l.record(1, 1, i), Verdict::Accept);
        }
        assert!(l.unit_complete(1));
        assert_eq!(l.missing(0, 0, 10), vec![(0, 5), (6, 10)]);
        assert_eq!(l.missing(0, 4, 7), vec![(4, 5), (6, 7)]);
    }

    #[test]
    fn records_round_trip() {
        let mut l = Ledger::new(&units());
        for i in (0..100).filter(|i| i % 7 != 0) {
            l.record(0, 3, i);
        }
        for i in 50..70 {
            l.record(1, 1, i);
        }
        let r = l.to_record();
        assert_eq!(r.complete, vec![(1, 2)]);
        let mut back = Ledger::new(&units());
        back.apply(&r).unwrap();
        assert_eq!(back.accounted(), l.accounted());
        assert_eq!(back.missing(0, 0, 100), l.missing(0, 0, 100));
        assert_eq!(back.to_record(), r);
        let bad = LedgerRecord {
            complete: vec![(7, 8)],
            partial: vec![],
        };
        assert!(Ledger::new(&units())
            .apply(&bad)
            .unwrap_err()
            .contains("unit 7"));
    }
}
