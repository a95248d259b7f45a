//! The IO shell around [`TarDecoder`]: a blocking reader over `std::io::Read`. It does not
//! seek, so it works on sockets and on gzip streams. It yields regular-file [`Entry`]s;
//! [`SampleReader`] groups them into samples. (The CPU tier reads shards on its decode pool's
//! blocking threads, so no async reader is kept; an async shell would wrap [`TarDecoder`] the
//! same way.)
//!
//! Field data is read straight from the source into the entry's own buffer (one copy, the
//! unavoidable one). The buffer grows with the bytes that actually arrive, so a header that
//! lies about its size cannot make the reader allocate more than the limit, and a truncated
//! stream costs no more memory than it delivered.

use std::io::{self, BufRead, Read};
use std::sync::Arc;

use crate::error::Result;
use crate::sample::{Sample, SampleGrouper};
use crate::spares::Spares;
use crate::tar::{EntryHeader, Limits, Step, TarDecoder, BLOCK};

/// Up to this many bytes of an entry's data are reserved up front; larger entries grow as
/// their bytes arrive.
const PREALLOC: u64 = 8 << 20;

/// A regular file from a tar stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub header: EntryHeader,
    pub data: Vec<u8>,
}

/// Where a reader starts: a whole shard, or a sample range fetched from a byte offset.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    pub limits: Limits,
    /// Shard byte offset of the first byte the reader sees.
    pub start_offset: u64,
    /// Index in the shard of the first sample the reader sees.
    pub first_index: u64,
}

/// Reads the regular-file entries of a tar stream, blocking.
pub struct TarReader<R> {
    inner: R,
    decoder: TarDecoder,
    scratch: Vec<u8>,
    /// Where entries' buffers come from, when given.
    spares: Option<Arc<Spares>>,
}

impl<R: Read> TarReader<R> {
    pub fn new(inner: R, shard: impl Into<Arc<str>>, options: &ReadOptions) -> Self {
        TarReader {
            inner,
            decoder: TarDecoder::starting_at(shard.into(), options.limits, options.start_offset),
            scratch: Vec::new(),
            spares: None,
        }
    }

    /// The same reader reading each entry into a buffer from `spares` when it has one.
    pub fn with_spares(mut self, spares: Arc<Spares>) -> Self {
        self.spares = Some(spares);
        self
    }

    pub fn shard(&self) -> &Arc<str> {
        self.decoder.shard()
    }

    /// The shard offset the reader has reached.
    pub fn offset(&self) -> u64 {
        self.decoder.offset()
    }

    /// The underlying stream.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The next regular file, or `None` at the end of the archive.
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        let Some(header) = self.next_header()? else {
            return Ok(None);
        };
        let data = match &self.spares {
            // A spare's bytes are initialized already: they are read over as they are, not
            // zeroed first (as `read_to_end` does for a reader without `read_buf`).
            Some(spares) if header.size <= PREALLOC => {
                let mut data = spares.take(header.size);
                data.resize(header.size as usize, 0);
                let got =
                    read_full(&mut self.inner, &mut data).map_err(|e| self.decoder.io_error(e))?;
                if got < data.len() {
                    return Err(self.decoder.truncated("", (data.len() - got) as u64));
                }
                data
            }
            _ => {
                let mut data = Vec::with_capacity(header.size.min(PREALLOC) as usize);
                let got = (&mut self.inner)
                    .take(header.size)
                    .read_to_end(&mut data)
                    .map_err(|e| self.decoder.io_error(e))?;
                if (got as u64) < header.size {
                    return Err(self.decoder.truncated("", header.size - got as u64));
                }
                data
            }
        };
        self.decoder.on_data();
        Ok(Some(Entry { header, data }))
    }

    /// The next regular file's header, its data not yet read (so nothing of it is held):
    /// [`TarReader::skip_data`] reads past it. `None` at the end of the archive.
    pub fn next_header(&mut self) -> Result<Option<EntryHeader>> {
        loop {
            match self.decoder.step() {
                Step::Header => {
                    let mut block = [0u8; BLOCK];
                    let got = read_full(&mut self.inner, &mut block)
                        .map_err(|e| self.decoder.io_error(e))?;
                    if got == 0 {
                        self.decoder.on_eof()?;
                    } else if got < BLOCK {
                        return Err(self.decoder.truncated("tar header", (BLOCK - got) as u64));
                    } else {
                        self.decoder.on_header(&block)?;
                    }
                }
                Step::Meta(n) => {
                    self.scratch.clear();
                    self.scratch.resize(n, 0);
                    let got = read_full(&mut self.inner, &mut self.scratch)
                        .map_err(|e| self.decoder.io_error(e))?;
                    if got < n {
                        return Err(self.decoder.truncated("", (n - got) as u64));
                    }
                    self.decoder.on_meta(&self.scratch)?;
                }
                Step::Data(header) => return Ok(Some(header)),
                Step::Skip(n) => {
                    let got = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())
                        .map_err(|e| self.decoder.io_error(e))?;
                    if got < n {
                        return Err(self.decoder.truncated("", n - got));
                    }
                    self.decoder.on_skipped();
                }
                Step::End => return Ok(None),
            }
        }
    }

    /// Reads past the data of the entry [`TarReader::next_header`] returned, keeping none of
    /// it (the stream still sees every byte).
    pub fn skip_data(&mut self) -> Result<()> {
        if let Step::Data(header) = self.decoder.step() {
            let got = io::copy(&mut (&mut self.inner).take(header.size), &mut io::sink())
                .map_err(|e| self.decoder.io_error(e))?;
            if got < header.size {
                return Err(self.decoder.truncated("", header.size - got));
            }
            self.decoder.on_data();
        }
        Ok(())
    }
}

/// Reads samples (consecutive entries sharing a key) from a tar stream, blocking.
pub struct SampleReader<R> {
    tar: TarReader<R>,
    grouper: SampleGrouper,
    done: bool,
}

impl<R: Read> SampleReader<R> {
    pub fn new(inner: R, shard: impl Into<Arc<str>>, options: &ReadOptions) -> Self {
        let tar = TarReader::new(inner, shard, options);
        let grouper = SampleGrouper::new(tar.shard().clone(), options.first_index);
        SampleReader {
            tar,
            grouper,
            done: false,
        }
    }

    /// The same reader reading fields into buffers from `spares` when it has them (given
    /// back there with [`Spares::give_back`] once a sample is done with).
    pub fn with_spares(mut self, spares: Arc<Spares>) -> Self {
        self.tar.spares = Some(spares);
        self
    }

    /// The shard offset the underlying tar reader has reached.
    pub fn offset(&self) -> u64 {
        self.tar.offset()
    }

    /// The underlying stream.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.tar.inner
    }

    /// The next sample, or `None` at the end of the shard.
    pub fn next_sample(&mut self) -> Result<Option<Sample>> {
        while !self.done {
            match self.tar.next_entry()? {
                Some(entry) => {
                    if let Some(sample) = self.grouper.push(entry) {
                        return Ok(Some(sample));
                    }
                }
                None => self.done = true,
            }
        }
        Ok(self.grouper.finish())
    }
}

impl<R> Drop for SampleReader<R> {
    /// The sample it read ahead (a sample ends where the next key starts) goes back to the
    /// spares too.
    fn drop(&mut self) {
        if let (Some(spares), Some(sample)) = (&self.tar.spares, self.grouper.finish()) {
            spares.give_back(sample);
        }
    }
}

impl<R: Read> Iterator for SampleReader<R> {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_sample() {
            Ok(Some(s)) => Some(Ok(s)),
            Ok(None) => None,
            Err(e) => {
                // After an error the stream position is unknown: stop.
                self.done = true;
                self.grouper.discard();
                Some(Err(e))
            }
        }
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Wraps a buffered stream in a gzip decoder when it starts with the gzip magic bytes, so
/// `.tgz` / `.tar.gz` shards read like plain ones. Concatenated gzip members are read as one
/// stream, as `gzip -d` does.
pub fn decompressed<R: BufRead + Send + 'static>(mut inner: R) -> io::Result<Box<dyn Read + Send>> {
    let head = inner.fill_buf()?;
    if head.starts_with(&GZIP_MAGIC) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(inner)))
    } else {
        Ok(Box::new(inner))
    }
}

/// Opens a shard file (plain or gzip-compressed) for blocking sample reads.
pub fn open_shard(
    path: &std::path::Path,
    options: &ReadOptions,
) -> Result<SampleReader<Box<dyn Read + Send>>> {
    let name: Arc<str> = path.display().to_string().into();
    let io_err = |source| crate::ShardError::Io {
        shard: name.to_string(),
        offset: 0,
        source,
    };
    let file = std::fs::File::open(path).map_err(io_err)?;
    let reader = decompressed(io::BufReader::with_capacity(1 << 20, file)).map_err(io_err)?;
    Ok(SampleReader::new(reader, name.clone(), options))
}

/// Reads until `buf` is full or the stream ends; returns how many bytes were read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::write::encode_sample;

    fn gzipped_shard() -> (Vec<u8>, Vec<u8>) {
        let mut tar = Vec::new();
        for i in 0..5u8 {
            encode_sample(
                &format!("k{i}"),
                &[("bin", &vec![i; 3000]), ("cls", b"1")],
                &mut tar,
            )
            .unwrap();
        }
        tar.extend_from_slice(&[0; 1024]);
        // Two gzip members, as `cat a.gz b.gz` makes: one stream to the reader.
        let (a, b) = tar.split_at(4096);
        let mut gz = Vec::new();
        for part in [a, b] {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(part).unwrap();
            gz.extend(enc.finish().unwrap());
        }
        (tar, gz)
    }

    #[test]
    fn gzip_shards_read_like_plain_ones() {
        let (tar, gz) = gzipped_shard();
        let plain: Vec<Sample> = SampleReader::new(&tar[..], "s.tar", &ReadOptions::default())
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(plain.len(), 5);
        let sync_gz: Vec<Sample> = SampleReader::new(
            decompressed(io::Cursor::new(gz.clone())).unwrap(),
            "s.tar",
            &ReadOptions::default(),
        )
        .collect::<Result<_>>()
        .unwrap();
        assert_eq!(sync_gz, plain);
    }

    #[test]
    fn a_truncated_gzip_stream_is_an_error() {
        let (_, gz) = gzipped_shard();
        let cut = &gz[..gz.len() / 2];
        let results: Vec<Result<Sample>> = SampleReader::new(
            decompressed(io::Cursor::new(cut.to_vec())).unwrap(),
            "s.tgz",
            &ReadOptions::default(),
        )
        .collect();
        let last = results.last().unwrap();
        assert!(last.is_err(), "the cut stream must end in an error");
        assert!(last.as_ref().unwrap_err().to_string().contains("s.tgz"));
    }
}
