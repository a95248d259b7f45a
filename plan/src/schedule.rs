//! Weight schedules: a mixture's weights as a function of the training step.
//!
//! A schedule is a list of points (step, weights), steps increasing: before the first point
//! the first point's weights hold, after the last the last's, and between two points either
//! the earlier point's (`Interpolate::Step`, piecewise constant) or a straight line from one
//! to the next (`Interpolate::Linear`). Each point's weights are scaled to parts of
//! [`WEIGHT_SCALE`] summing to it, so every step's weights have the same sum.
//!
//! **The step** is the one a training loop counts: in epoch `e` of a loader whose ranks take
//! `B` batches an epoch, step `e × B + b` at its `b`-th batch (see
//! [`crate::Mixture::epoch_step`] for epochs resumed at another world size). The schedule
//! acts on a segment of an epoch in two ways, both pure functions of the steps the segment
//! spans: each source's share of the segment is its weight summed over those steps
//! ([`Schedule::integrated`]), and a rank's sequence places each source's samples by the
//! weight at each step (`mixture`'s merge), so a batch holds the sources in the proportions of
//! its own step, ±1 sample.
//!
//! Integer arithmetic throughout, so every rank computes the same weights.

use serde::{Deserialize, Serialize};

use crate::PlanError;

/// Weights are kept as parts of this many, so plans are integer arithmetic.
pub const WEIGHT_SCALE: u64 = 1_000_000_000;

/// Weights as parts of [`WEIGHT_SCALE`]: each finite and ≥ 0, not all 0; a positive weight
/// never rounds to 0.
pub fn scale_weights(weights: &[f64]) -> Result<Vec<u64>, PlanError> {
    let bad = || PlanError::Weights(format!("{weights:?}"));
    if weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
        return Err(bad());
    }
    let sum: f64 = weights.iter().sum();
    if sum <= 0.0 {
        return Err(bad());
    }
    Ok(weights
        .iter()
        .map(|&w| match w > 0.0 {
            true => ((w / sum * WEIGHT_SCALE as f64).round() as u64).max(1),
            false => 0,
        })
        .collect())
}

/// How weights go from one point to the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interpolate {
    /// The earlier point's weights until the next point's step.
    #[default]
    Step,
    /// A straight line from each point's weights to the next's.
    Linear,
}

/// One point of a schedule as written: from `step` on, `weights` (one per source, in any
/// units, as a mixture's weights).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulePoint {
    pub step: u64,
    pub weights: Vec<f64>,
}

/// A schedule as written (a mixture file's `[schedule]`, a loader's `weight_schedule`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    pub points: Vec<SchedulePoint>,
    #[serde(default)]
    pub interpolate: Interpolate,
}

impl ScheduleSpec {
    /// The schedule for `sources` sources; errors name the point that is wrong.
    pub fn build(&self, sources: usize) -> Result<Schedule, PlanError> {
        let points: Vec<(u64, Vec<f64>)> = self
            .points
            .iter()
            .map(|p| (p.step, p.weights.clone()))
            .collect();
        Schedule::new(&points, self.interpolate, sources)
    }
}

/// A mixture's weights by step (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// (step, weights in parts of [`WEIGHT_SCALE`], summing to it), steps increasing.
    pub points: Vec<(u64, Vec<u64>)>,
    pub interpolate: Interpolate,
}

impl Schedule {
    /// A schedule of `points` for `sources` sources: at least one point, steps strictly
    /// increasing, one finite non-negative weight per source at each, not all 0.
    pub fn new(
        points: &[(u64, Vec<f64>)],
        interpolate: Interpolate,
        sources: usize,
    ) -> Result<Self, PlanError> {
        let bad = |detail: String| Err(PlanError::Schedule(detail));
        if points.is_empty() {
            return bad("it has no points".into());
        }
        let mut out = Vec::with_capacity(points.len());
        for (i, (step, weights)) in points.iter().enumerate() {
            if i > 0 && *step <= points[i - 1].0 {
                return bad(format!(
                    "point {i} is at step {step}, not after point {} at step {}",
                    i - 1,
                    points[i - 1].0
                ));
            }
            if weights.len() != sources {
                return bad(format!(
                    "point {i} (step {step}) has {} weights for {sources} sources",
                    weights.len()
                ));
            }
            let scaled = scale_weights(weights)
                .map_err(|e| PlanError::Schedule(format!("point {i} (step {step}): {e}")))?;
            out.push((*step, normalized(scaled)));
        }
        Ok(Schedule {
            points: out,
            interpolate,
        })
    }

    /// Each source's weight at `step`.
    pub fn at(&self, step: u64) -> Vec<u64> {
        let after = self.points.partition_point(|(s, _)| *s <= step);
        if after == 0 {
            return self.points[0].1.clone();
        }
        let (s0, w0) = &self.points[after - 1];
        let Some((s1, w1)) = self.points.get(after) else {
            return w0.clone();
        };
        match self.interpolate {
            Interpolate::Step => w0.clone(),
            Interpolate::Linear => {
                let (t, span) = (u128::from(step - s0), u128::from(s1 - s0));
                w0.iter()
                    .zip(w1)
                    .map(|(&a, &b)| {
                        let (a, b) = (u128::from(a), u128::from(b));
                        // a + (b − a)·t/span, rounded down, without negative numbers.
                        match b >= a {
                            true => (a + (b - a) * t / span) as u64,
                            false => (a - (a - b) * t / span) as u64,
                        }
                    })
                    .collect()
            }
        }
    }

    /// Each source's weight summed over steps `from..from + steps`: its share of a segment
    /// spanning those steps.
    pub fn integrated(&self, from: u64, steps: u64) -> Vec<u64> {
        let n = self.points[0].1.len();
        let mut sum = vec![0u64; n];
        let mut step = from;
        let end = from.saturating_add(steps);
        while step < end {
            // Constant stretches (before the first point, after the last, or between points
            // under `Step`) are summed at once; linear ones step by step.
            let next = self.points.partition_point(|(s, _)| *s <= step);
            let constant =
                next == 0 || next == self.points.len() || self.interpolate == Interpolate::Step;
            let until = match (constant, self.points.get(next)) {
                (true, Some((s, _))) => (*s).min(end),
                (true, None) => end,
                (false, _) => step + 1,
            };
            for (acc, w) in sum.iter_mut().zip(self.at(step)) {
                *acc = acc.saturating_add(w.saturating_mul(until - step));
            }
            step = until;
        }
        sum
    }
}

/// Weights brought to sum exactly [`WEIGHT_SCALE`] (the rounding's difference on the
/// largest), so steps compare by their shares alone.
fn normalized(mut w: Vec<u64>) -> Vec<u64> {
    let sum: u64 = w.iter().sum();
    if let Some(i) = (0..w.len()).max_by_key(|&i| (w[i], std::cmp::Reverse(i))) {
        if sum > WEIGHT_SCALE {
            w[i] -= (sum - WEIGHT_SCALE).min(w[i]);
        } else {
            w[i] += WEIGHT_SCALE - sum;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_hold_and_lines_interpolate_with_one_sum() {
        let points = [(0, vec![0.8, 0.2]), (100, vec![0.5, 0.5])];
        let step = Schedule::new(&points, Interpolate::Step, 2).unwrap();
        assert_eq!(step.at(0), vec![800_000_000, 200_000_000]);
        assert_eq!(step.at(99), step.at(0));
        assert_eq!(step.at(100), vec![500_000_000, 500_000_000]);
        assert_eq!(step.at(10_000), step.at(100));
        let line = Schedule::new(&points, Interpolate::Linear, 2).unwrap();
        assert_eq!(line.at(50), vec![650_000_000, 350_000_000]);
        for s in [0, 1, 33, 50, 99, 100, 500] {
            let sum: u64 = line.at(s).iter().sum();
            assert!(WEIGHT_SCALE - sum <= 1, "step {s}: {sum}");
        }
        // Summed over steps: 100 steps at 0.8 then 20 at 0.5.
        assert_eq!(
            step.integrated(0, 120),
            vec![
                100 * 800_000_000 + 20 * 500_000_000,
                100 * 200_000_000 + 20 * 500_000_000
            ]
        );
        let by_step: Vec<u64> = (0..2)
            .map(|i| (40..160).map(|s| line.at(s)[i]).sum())
            .collect();
        assert_eq!(line.integrated(40, 120), by_step);
    }

    #[test]
    fn mistakes_are_named() {
        let e = |p: &[(u64, Vec<f64>)]| {
            Schedule::new(p, Interpolate::Step, 2)
                .unwrap_err()
                .to_string()
        };
        assert!(e(&[]).contains("no points"));
        assert!(e(&[(5, vec![1.0, 1.0]), (5, vec![1.0, 0.0])]).contains("not after point 0"));
        assert!(e(&[(0, vec![1.0])]).contains("1 weights for 2 sources"));
        assert!(e(&[(0, vec![0.0, 0.0])]).contains("point 0 (step 0)"));
    }
}
