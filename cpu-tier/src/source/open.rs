//! Opening a unit: its samples as a checked stream, ranged through the shard's index where
//! there is one (and the shard is not compressed), else read from the shard's start, or, with
//! no usable index, read whole and held until the shard matched the manifest (see the
//! module documentation of `crate::source`).

use std::io::{self, Read};
use std::sync::Arc;

use sluice_shard::read::decompressed;
use sluice_shard::{Compression, ReadOptions, SampleIndex, SampleReader};

use super::streams::TakeUntilEnd;
use super::verify::{self, Admission, Damage, Verified};
use super::{changed, Expect, ShardLocation, ShardSource, SourceError, UnitSamples};

/// A unit's bytes as opened: a stream to parse, or, where the shard changed on every replica
/// since it was indexed, the unit's samples as one `Changed` skip.
enum Opened {
    Stream {
        stream: Box<dyn Read + Send>,
        options: ReadOptions,
        /// Its bytes come from the worker's cache.
        cached: bool,
    },
    Changed(UnitSamples),
}

impl ShardSource {
    /// [`ShardSource::open_unit`], and whether its bytes come from the worker's cache (so
    /// that a fault in them is the cache's: `Resuming` reads them again from storage).
    pub(super) fn open_unit_from(
        &self,
        loc: &ShardLocation,
        start: u64,
        end: u64,
    ) -> Result<(UnitSamples, bool), SourceError> {
        if start >= end || end > loc.info.samples {
            return Err(SourceError::Range {
                shard: loc.name().into(),
                start,
                end,
                samples: loc.info.samples,
            });
        }
        let whole = start == 0 && end == loc.info.samples;
        // With a cache a whole shard is read as its samples' range too, as the units that
        // split it were: the same bytes are then cached and found (the tar's end-of-archive
        // blocks, which no sample's range holds, would otherwise make every whole read miss).
        let ranged = (!whole || self.cache.is_some()) && loc.info.compression == Compression::None;
        // Without a usable index no sample can be checked on its own: the unit is read whole
        // and held until the shard has matched the manifest's checksum (`verify = false`, an
        // explicit opt-out, reads it unchecked).
        let index = if self.config.verify || ranged {
            match self.index(loc) {
                Ok(index) => Some(counted(loc, index)?),
                Err(e) => {
                    metrics::counter!("sluice_cpu_index_unavailable_total").increment(1);
                    self.warn_unindexed(loc, &e);
                    if self.config.verify {
                        let samples = self.open_unindexed(loc, start, end, &e)?;
                        return Ok((samples, false));
                    }
                    None
                }
            }
        } else {
            None
        };
        let name: Arc<str> = loc.name().into();
        let damage = Damage::default();
        let opened = match &index {
            Some(index) if ranged => self.ranged(loc, index, (start, end), &name, &damage)?,
            _ => self.streamed(loc, index.as_deref(), &name, &damage)?,
        };
        let (stream, options, cached) = match opened {
            Opened::Stream {
                stream,
                options,
                cached,
            } => (stream, options, cached),
            Opened::Changed(samples) => return Ok((samples, false)),
        };
        let reader = SampleReader::new(stream, name, &options).with_spares(self.spares.clone());
        // Where there is an index and verifying is on, every sample passes `Verified`.
        let admission = Admission {
            checked: self.config.verify && index.is_some(),
            index,
            damage,
        };
        let spares = self.spares.clone();
        let samples: UnitSamples = Box::new(
            reader
                .map(move |s| admission.admit(s))
                // Read from the shard's start, those before the unit are passed over.
                .filter_map(move |s| match s {
                    Ok(s) if s.index < start => {
                        spares.give_back(s);
                        None
                    }
                    Err(sluice_shard::ShardError::DamagedSample { index, .. }) if index < start => {
                        None
                    }
                    other => Some(other),
                })
                .take_while_inclusive_end(end),
        );
        Ok((samples, cached))
    }

    /// The unit's samples' byte range, located through the index and fetched with one
    /// request (or from the cache), each sample checked against its checksum as it passes.
    fn ranged(
        &self,
        loc: &ShardLocation,
        index: &SampleIndex,
        (start, end): (u64, u64),
        name: &Arc<str>,
        damage: &Damage,
    ) -> Result<Opened, SourceError> {
        let (offset, len) = index
            .byte_range(start, end)
            .ok_or_else(|| SourceError::Index {
                shard: loc.name().into(),
                detail: format!("has no samples {start}..{end}"),
            })?;
        let expect = Expect {
            size: None,
            checksum: Some(loc.info.checksum),
            cached: self.config.verify,
        };
        let (body, cached) = match self.fetch(loc, Some((offset, len)), expect) {
            Err(SourceError::Changed { detail, .. }) => {
                return Ok(Opened::Changed(changed(loc, detail)))
            }
            other => other?,
        };
        let checks = &index.entries[start as usize..end as usize];
        let stream: Box<dyn Read + Send> = if self.config.verify {
            let v = Verified::new(body, name.clone(), offset, start, checks, None, damage);
            Box::new(v)
        } else {
            Box::new(body.take(len))
        };
        let options = ReadOptions {
            start_offset: offset,
            first_index: start,
            ..self.config.read_options.clone()
        };
        Ok(Opened::Stream {
            stream,
            options,
            cached,
        })
    }

    /// A whole shard, a gzip shard, or no index: the shard streamed from its start (the reader
    /// skips to the range). The file checksum covers the stored (maybe compressed) bytes;
    /// sample checksums cover the tar stream. Without an index no sample can be checked
    /// before it is delivered: a shard whose size is not the manifest's is refused whole.
    /// With one, each sample is admitted on its own (a shard cut short still yields its
    /// intact prefix).
    fn streamed(
        &self,
        loc: &ShardLocation,
        index: Option<&SampleIndex>,
        name: &Arc<str>,
        damage: &Damage,
    ) -> Result<Opened, SourceError> {
        let verify = self.config.verify;
        let expect = Expect {
            size: index.is_none().then_some(loc.info.size),
            checksum: Some(loc.info.checksum),
            cached: index.is_some() && verify,
        };
        let (body, cached) = match self.fetch(loc, None, expect) {
            Err(SourceError::Changed { detail, .. }) => {
                return Ok(Opened::Changed(changed(loc, detail)))
            }
            other => other?,
        };
        let body: Box<dyn Read + Send> = if verify {
            let whole = Some(loc.info.checksum);
            Box::new(Verified::new(body, name.clone(), 0, 0, &[], whole, damage))
        } else {
            body
        };
        let tar = decompressed(io::BufReader::with_capacity(1 << 20, body)).map_err(|source| {
            SourceError::Io {
                url: loc.name().into(),
                source,
            }
        })?;
        let stream: Box<dyn Read + Send> = match (index, verify) {
            (Some(index), true) => Box::new(Verified::new(
                tar,
                name.clone(),
                0,
                0,
                &index.entries,
                None,
                damage,
            )),
            _ => tar,
        };
        Ok(Opened::Stream {
            stream,
            options: self.config.read_options.clone(),
            cached,
        })
    }

    /// A unit of a shard with no usable index. No sample can be checked on its own, so the
    /// whole shard is read from one replica, the unit's samples held, and they are delivered
    /// only once the shard's last byte has matched the manifest's checksum. A replica whose
    /// bytes do not is demoted and the next one read; when every replica answered with other
    /// bytes, the unit's samples are skipped as changed, by name. A read that fails is an
    /// error (the unit is read again, here or on another worker).
    fn open_unindexed(
        &self,
        loc: &ShardLocation,
        start: u64,
        end: u64,
        why: &SourceError,
    ) -> Result<UnitSamples, SourceError> {
        let name: Arc<str> = loc.name().into();
        let (mut mismatched, mut failed, mut unavailable) = (Vec::new(), Vec::new(), Vec::new());
        for url in self.suspects.order(&loc.urls) {
            let one = loc.only(url.clone());
            let expect = Expect {
                size: Some(loc.info.size),
                checksum: Some(loc.info.checksum),
                cached: false,
            };
            let outcome = self
                .fetch(&one, None, expect)
                .map(|(body, _)| body)
                .map_err(|e| match e {
                    SourceError::Changed { detail, .. } => verify::Whole::Mismatch(detail),
                    other if other.is_unavailable() => {
                        verify::Whole::Unavailable(other.to_string())
                    }
                    other => verify::Whole::Read(other.to_string()),
                });
            let outcome = outcome.and_then(|body| {
                verify::read_whole_checked(
                    body,
                    name.clone(),
                    loc.info.checksum,
                    (start, end),
                    &self.config.read_options,
                )
            });
            match outcome {
                Ok(samples) => return Ok(Box::new(samples.into_iter())),
                Err(verify::Whole::Mismatch(detail)) => {
                    if loc.urls.len() > 1 {
                        self.suspects
                            .demote(&url, &format!("its copy of {} {detail}", loc.name()));
                    }
                    mismatched.push(format!("{url}: {detail}"));
                }
                Err(verify::Whole::Read(detail)) => failed.push(detail),
                Err(verify::Whole::Unavailable(detail)) => unavailable.push(detail),
            }
        }
        if failed.is_empty() && mismatched.is_empty() && !unavailable.is_empty() {
            return Err(SourceError::Unavailable {
                shard: loc.name().into(),
                errors: unavailable,
            });
        }
        failed.extend(unavailable);
        if failed.is_empty() && !mismatched.is_empty() {
            return Ok(changed(
                loc,
                format!(
                    "{why}; and no replica's bytes match the manifest's checksum ({})",
                    mismatched.join("; ")
                ),
            ));
        }
        Err(match failed.len() {
            0 | 1 => SourceError::Request {
                url: loc.urls.first().cloned().unwrap_or_default(),
                detail: failed.pop().unwrap_or_else(|| "no replica".into()),
            },
            _ => SourceError::AllReplicasFailed {
                shard: loc.name().into(),
                errors: failed,
            },
        })
    }
}

/// The index, if it counts the samples the manifest says: a manifest that understates (or
/// overstates) a shard would silently leave samples out of training (or ask for ones that
/// are not there), so a disagreement is an error naming both.
fn counted(loc: &ShardLocation, index: Arc<SampleIndex>) -> Result<Arc<SampleIndex>, SourceError> {
    if index.entries.len() as u64 != loc.info.samples {
        return Err(SourceError::Index {
            shard: loc.name().into(),
            detail: format!(
                "the manifest says {} samples, the shard's index lists {}: re-run sluice index",
                loc.info.samples,
                index.entries.len()
            ),
        });
    }
    Ok(index)
}
