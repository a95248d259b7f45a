//! A sans-IO tar decoder: the whole tar state machine over byte blocks, with no reader in it.
//!
//! The decoder tells its IO shell what it needs next ([`Step`]): a 512-byte header, the payload
//! of a metadata entry (pax or GNU long name), the data of a regular file, or a number of bytes
//! to skip. The shell reads them from wherever the shard comes from (a file, a socket, a gzip
//! stream; see `read.rs` for the blocking shell) and feeds them back. Keeping all the parsing
//! here means any shell reads shards the same way, and the rules can be tested without IO.
//!
//! Rules, chosen to agree with Python `tarfile` and GNU tar where they agree with each other,
//! and to be strict where they are lax (see DESIGN.md, "Tar parsers fail by disagreeing"):
//! - ustar, GNU (`L`/`K` long names, base-256 sizes) and pax (`x`) headers; the pax `size`
//!   record is authoritative over the ustar size field; a malformed pax record is an error.
//! - Every header's checksum is verified (unsigned or signed sum, as both historic writers do);
//!   a bad checksum anywhere is an error, not a silent end of archive.
//! - Directories, links and device entries carry no data and are skipped, never followed.
//!   Unknown entry types are skipped over their size. GNU sparse files are refused.
//! - A zero block ends the archive; so does a clean end of stream at a header boundary
//!   (sample ranges fetched with an HTTP Range request end that way).
//! - Sizes are checked against [`Limits`] before anything is allocated.

use std::sync::Arc;

use crate::error::{Result, ShardError};

/// Size of a tar block: headers are one block, data is padded to a whole number of blocks.
pub const BLOCK: usize = 512;

/// Bounds on what a shard may make the reader allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest data size of a single entry (one field of one sample).
    pub max_entry_size: u64,
    /// Largest payload of a pax extended header or GNU long name.
    pub max_meta_size: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entry_size: 256 << 20,
            max_meta_size: 1 << 20,
        }
    }
}

/// Rounds a data size up to whole tar blocks.
pub fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK as u64) * BLOCK as u64
}

/// A regular file entry, with its metadata entries already applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    /// The entry path (pax `path` > GNU long name > ustar prefix/name).
    pub path: String,
    /// Data size in bytes (pax `size` when present).
    pub size: u64,
    /// Byte offset of the entry's first header, including pax/long-name headers before it.
    pub start: u64,
    /// Byte offset of the entry's data.
    pub data_offset: u64,
}

impl EntryHeader {
    /// Byte offset just past the entry's data padding: where the next entry starts.
    pub fn end(&self) -> u64 {
        self.data_offset + padded(self.size)
    }
}

/// What the decoder needs from its IO shell next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Read one 512-byte block and pass it to [`TarDecoder::on_header`]; a clean end of
    /// stream before any byte of it goes to [`TarDecoder::on_eof`].
    Header,
    /// Read this many bytes of metadata payload and pass them to [`TarDecoder::on_meta`].
    Meta(usize),
    /// Read the data of this regular file entry, then call [`TarDecoder::on_data`].
    Data(EntryHeader),
    /// Discard this many bytes, then call [`TarDecoder::on_skipped`].
    Skip(u64),
    /// The archive has ended.
    End,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MetaKind {
    Pax,
    GlobalPax,
    GnuLongName,
    GnuLongLink,
}

impl MetaKind {
    fn describe(self) -> &'static str {
        match self {
            MetaKind::Pax => "pax extended header",
            MetaKind::GlobalPax => "pax global header",
            MetaKind::GnuLongName => "GNU long name",
            MetaKind::GnuLongLink => "GNU long link name",
        }
    }
}

#[derive(Clone, Debug)]
enum State {
    Header,
    Meta { kind: MetaKind, size: u64 },
    Data(EntryHeader),
    Skip { n: u64, what: String },
    End,
}

/// Metadata from pax and GNU long-name entries, waiting for the entry it describes.
#[derive(Clone, Debug, Default)]
struct PendingMeta {
    /// Where the first metadata header of the pending entry started.
    start: Option<u64>,
    pax_path: Option<String>,
    pax_size: Option<u64>,
    long_name: Option<String>,
}

/// The tar state machine. See the module documentation.
#[derive(Clone, Debug)]
pub struct TarDecoder {
    shard: Arc<str>,
    limits: Limits,
    offset: u64,
    state: State,
    meta: PendingMeta,
}

impl TarDecoder {
    /// A decoder for the shard named `shard` (used in errors), reading from its first byte.
    pub fn new(shard: Arc<str>, limits: Limits) -> Self {
        Self::starting_at(shard, limits, 0)
    }

    /// A decoder whose input begins at byte `offset` of the shard: a range read of samples,
    /// which must begin at an entry's first header. Offsets in entries and errors are shard
    /// offsets.
    pub fn starting_at(shard: Arc<str>, limits: Limits, offset: u64) -> Self {
        TarDecoder {
            shard,
            limits,
            offset,
            state: State::Header,
            meta: PendingMeta::default(),
        }
    }

    pub fn shard(&self) -> &Arc<str> {
        &self.shard
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Bytes of the shard consumed so far (as a shard offset).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// What the decoder needs next.
    pub fn step(&self) -> Step {
        match &self.state {
            State::Header => Step::Header,
            // Bounded by max_meta_size when the state was entered.
            State::Meta { size, .. } => Step::Meta(*size as usize),
            State::Data(entry) => Step::Data(entry.clone()),
            State::Skip { n, .. } => Step::Skip(*n),
            State::End => Step::End,
        }
    }

    /// The stream ended cleanly before a header: the end of the archive, unless a metadata
    /// entry promised an entry that never came.
    pub fn on_eof(&mut self) -> Result<()> {
        if self.meta.start.is_some() {
            return Err(self.truncated("the entry a pax or GNU long-name header announced", 512));
        }
        self.state = State::End;
        Ok(())
    }

    /// Feeds one header block.
    pub fn on_header(&mut self, block: &[u8; BLOCK]) -> Result<()> {
        debug_assert!(matches!(self.state, State::Header));
        let at = self.offset;
        if block.iter().all(|&b| b == 0) {
            if self.meta.start.is_some() {
                return Err(self.malformed(
                    at,
                    "tar header",
                    "end-of-archive block where a pax or GNU long-name header announced an entry"
                        .into(),
                ));
            }
            self.state = State::End;
            return Ok(());
        }
        self.verify_checksum(block)?;
        self.offset += BLOCK as u64;
        let typeflag = block[156];
        let size_field = self.number(&block[124..136], at, "size")?;

        match typeflag {
            b'x' | b'g' | b'L' | b'K' => {
                let kind = match typeflag {
                    b'x' => MetaKind::Pax,
                    b'g' => MetaKind::GlobalPax,
                    b'L' => MetaKind::GnuLongName,
                    _ => MetaKind::GnuLongLink,
                };
                if size_field > self.limits.max_meta_size {
                    return Err(ShardError::TooLarge {
                        shard: self.shard.to_string(),
                        offset: at,
                        entry: kind.describe().into(),
                        size: size_field,
                        limit: self.limits.max_meta_size,
                    });
                }
                if kind != MetaKind::GlobalPax {
                    self.meta.start.get_or_insert(at);
                }
                self.state = State::Meta {
                    kind,
                    size: size_field,
                };
            }
            b'0' | b'\0' | b'7' => {
                let meta = std::mem::take(&mut self.meta);
                let path = match (meta.pax_path, meta.long_name) {
                    (Some(p), _) => p,
                    (None, Some(l)) => l,
                    (None, None) => self.header_name(block, at)?,
                };
                let size = meta.pax_size.unwrap_or(size_field);
                if size > self.limits.max_entry_size {
                    return Err(ShardError::TooLarge {
                        shard: self.shard.to_string(),
                        offset: at,
                        entry: path,
                        size,
                        limit: self.limits.max_entry_size,
                    });
                }
                self.state = State::Data(EntryHeader {
                    path,
                    size,
                    start: meta.start.unwrap_or(at),
                    data_offset: self.offset,
                });
            }
            b'S' => {
                return Err(self.unsupported(at, "tar entry type", "GNU sparse file".into()));
            }
            // Hard link, symbolic link, character/block device, directory, FIFO: no data
            // follows, whatever the size field says (as Python tarfile reads them).
            b'1'..=b'6' => {
                self.meta = PendingMeta::default();
                self.state = State::Header;
            }
            // Anything else (GNU volume labels, dump directories, vendor types) is skipped
            // over its data.
            other => {
                self.meta = PendingMeta::default();
                let size = padded(size_field);
                self.state = if size == 0 {
                    State::Header
                } else {
                    State::Skip {
                        n: size,
                        what: format!("data of tar entry type {:?}", other as char),
                    }
                };
            }
        }
        Ok(())
    }

    /// Feeds the payload of the metadata entry announced by [`Step::Meta`].
    pub fn on_meta(&mut self, payload: &[u8]) -> Result<()> {
        let State::Meta { kind, size } = self.state else {
            unreachable!("on_meta called outside a metadata step");
        };
        debug_assert_eq!(payload.len() as u64, size);
        let at = self.offset;
        match kind {
            MetaKind::Pax => self.apply_pax(payload, at, false)?,
            MetaKind::GlobalPax => self.apply_pax(payload, at, true)?,
            MetaKind::GnuLongName => {
                self.meta.long_name = Some(self.utf8(until_nul(payload), at, "GNU long name")?);
            }
            MetaKind::GnuLongLink => {}
        }
        self.offset += size;
        self.after_payload(size, kind.describe().to_string());
        Ok(())
    }

    /// Tells the decoder the IO shell has read the data of the [`Step::Data`] entry.
    pub fn on_data(&mut self) {
        let State::Data(entry) = &self.state else {
            unreachable!("on_data called outside a data step");
        };
        let size = entry.size;
        let what = format!("padding of tar entry {:?}", entry.path);
        self.offset += size;
        self.after_payload(size, what);
    }

    /// Tells the decoder the IO shell has discarded the bytes of a [`Step::Skip`].
    pub fn on_skipped(&mut self) {
        let State::Skip { n, .. } = self.state else {
            unreachable!("on_skipped called outside a skip step");
        };
        self.offset += n;
        self.state = State::Header;
    }

    /// The error for a stream that ended `needed` bytes short of the current step.
    pub fn truncated(&self, what: &str, needed: u64) -> ShardError {
        let what = match &self.state {
            State::Header => what.to_string(),
            State::Meta { kind, .. } => kind.describe().to_string(),
            State::Data(e) => format!("data of tar entry {:?}", e.path),
            State::Skip { what, .. } => what.clone(),
            State::End => "end of archive".into(),
        };
        ShardError::Truncated {
            shard: self.shard.to_string(),
            offset: self.offset,
            what,
            needed,
        }
    }

    /// Wraps an IO error with the shard and the current offset.
    pub fn io_error(&self, source: std::io::Error) -> ShardError {
        ShardError::Io {
            shard: self.shard.to_string(),
            offset: self.offset,
            source,
        }
    }

    fn after_payload(&mut self, size: u64, what: String) {
        let pad = padded(size) - size;
        self.state = if pad == 0 {
            State::Header
        } else {
            State::Skip { n: pad, what }
        };
    }

    fn verify_checksum(&self, block: &[u8; BLOCK]) -> Result<()> {
        let stored = self.number(&block[148..156], self.offset, "checksum").ok();
        let mut unsigned: u64 = 0;
        let mut signed: i64 = 0;
        for (i, &b) in block.iter().enumerate() {
            let b = if (148..156).contains(&i) { b' ' } else { b };
            unsigned += u64::from(b);
            signed += i64::from(b as i8);
        }
        let matches = stored.is_some_and(|s| s == unsigned || i64::try_from(s) == Ok(signed));
        if matches {
            Ok(())
        } else {
            Err(ShardError::BadChecksum {
                shard: self.shard.to_string(),
                offset: self.offset,
                stored: String::from_utf8_lossy(until_nul(&block[148..156])).into_owned(),
                computed: unsigned,
            })
        }
    }

    /// Parses a numeric header field: octal text (NUL- or space-terminated, as `tarfile`
    /// reads it) or GNU base-256 (high bit of the first byte set).
    fn number(&self, field: &[u8], at: u64, name: &'static str) -> Result<u64> {
        if let Some(&first) = field.first() {
            if first & 0x80 != 0 {
                if first == 0xff {
                    return Err(self.malformed(at, "tar header", format!("negative {name}")));
                }
                let mut n: u64 = u64::from(first & 0x7f);
                for &b in &field[1..] {
                    n = n
                        .checked_mul(256)
                        .map(|n| n + u64::from(b))
                        .ok_or_else(|| {
                            self.malformed(at, "tar header", format!("{name} overflows 64 bits"))
                        })?;
                }
                return Ok(n);
            }
        }
        let text = until_nul(field);
        let text = trim_ascii(text);
        let mut n: u64 = 0;
        for &b in text {
            if !(b'0'..=b'7').contains(&b) {
                return Err(self.malformed(
                    at,
                    "tar header",
                    format!(
                        "{name} field {:?} is not octal",
                        String::from_utf8_lossy(field)
                    ),
                ));
            }
            n = n
                .checked_mul(8)
                .map(|n| n + u64::from(b - b'0'))
                .ok_or_else(|| {
                    self.malformed(at, "tar header", format!("{name} overflows 64 bits"))
                })?;
        }
        Ok(n)
    }

    fn header_name(&self, block: &[u8; BLOCK], at: u64) -> Result<String> {
        let name = until_nul(&block[0..100]);
        // Only POSIX ustar uses the prefix field; GNU tar keeps other data there.
        let posix = &block[257..263] == b"ustar\0";
        let prefix = if posix {
            until_nul(&block[345..500])
        } else {
            &[]
        };
        let name = self.utf8(name, at, "entry name")?;
        if prefix.is_empty() {
            Ok(name)
        } else {
            let prefix = self.utf8(prefix, at, "entry name prefix")?;
            Ok(format!("{prefix}/{name}"))
        }
    }

    /// Applies pax records (`"%d %s=%s\n"`, the length counting the whole record).
    fn apply_pax(&mut self, payload: &[u8], at: u64, global: bool) -> Result<()> {
        let mut rest = payload;
        while !rest.is_empty() {
            if rest.iter().all(|&b| b == 0) {
                break; // some writers pad the payload with NULs
            }
            let space = rest
                .iter()
                .position(|&b| b == b' ')
                .ok_or_else(|| self.malformed(at, "pax record", "no length field".into()))?;
            let len_text = &rest[..space];
            if len_text.is_empty() || !len_text.iter().all(u8::is_ascii_digit) {
                return Err(self.malformed(
                    at,
                    "pax record",
                    format!(
                        "length {:?} is not a number",
                        String::from_utf8_lossy(len_text)
                    ),
                ));
            }
            let len: usize = std::str::from_utf8(len_text)
                .ok()
                .and_then(|s| s.parse().ok())
                .filter(|&l| l > space + 1 && l <= rest.len())
                .ok_or_else(|| {
                    self.malformed(at, "pax record", "length out of range".to_string())
                })?;
            let record = &rest[space + 1..len];
            rest = &rest[len..];
            let Some((&b'\n', body)) = record.split_last() else {
                return Err(self.malformed(at, "pax record", "missing newline".into()));
            };
            let eq = body
                .iter()
                .position(|&b| b == b'=')
                .filter(|&i| i > 0)
                .ok_or_else(|| self.malformed(at, "pax record", "no key=value".into()))?;
            let (key, value) = (&body[..eq], &body[eq + 1..]);
            match key {
                b"path" if global => {
                    return Err(self.unsupported(at, "pax global header", "sets path".into()))
                }
                b"size" if global => {
                    return Err(self.unsupported(at, "pax global header", "sets size".into()))
                }
                b"path" => self.meta.pax_path = Some(self.utf8(value, at, "pax path")?),
                b"size" => {
                    let size = std::str::from_utf8(value)
                        .ok()
                        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                        .and_then(|s| s.parse::<u64>().ok())
                        .ok_or_else(|| {
                            self.malformed(
                                at,
                                "pax record",
                                format!(
                                    "size {:?} is not a number",
                                    String::from_utf8_lossy(value)
                                ),
                            )
                        })?;
                    self.meta.pax_size = Some(size);
                }
                k if k.starts_with(b"GNU.sparse.") => {
                    return Err(self.unsupported(at, "tar entry", "GNU sparse file (pax)".into()))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn utf8(&self, bytes: &[u8], at: u64, what: &'static str) -> Result<String> {
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            self.malformed(
                at,
                "tar header",
                format!("{what} {:?} is not UTF-8", String::from_utf8_lossy(bytes)),
            )
        })
    }

    fn malformed(&self, at: u64, what: &'static str, detail: String) -> ShardError {
        ShardError::Malformed {
            shard: self.shard.to_string(),
            offset: at,
            what,
            detail,
        }
    }

    fn unsupported(&self, at: u64, what: &'static str, detail: String) -> ShardError {
        ShardError::Unsupported {
            shard: self.shard.to_string(),
            offset: at,
            what,
            detail,
        }
    }
}

fn until_nul(bytes: &[u8]) -> &[u8] {
    match bytes.iter().position(|&b| b == 0) {
        Some(i) => &bytes[..i],
        None => bytes,
    }
}

fn trim_ascii(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(s), Some(e)) => &bytes[s..=e],
        _ => &[],
    }
}

/// Builds ustar header blocks; shared by the writer and the tests.
pub mod header {
    use super::BLOCK;

    /// Writes `value` as a NUL-terminated octal field filling `field`.
    pub fn put_octal(field: &mut [u8], value: u64) -> bool {
        let digits = field.len() - 1;
        let text = format!("{value:0digits$o}");
        if text.len() > digits {
            return false;
        }
        field[..digits].copy_from_slice(text.as_bytes());
        field[digits] = 0;
        true
    }

    /// A ustar header block for a regular file (or a pax `x` header when `typeflag` is `b'x'`)
    /// with fixed mode, owner and mtime, so the same input always gives the same bytes.
    /// `name` must fit in 100 bytes; sizes of 8 GiB and more use base-256.
    pub fn ustar(name: &[u8], size: u64, typeflag: u8) -> [u8; BLOCK] {
        let mut h = [0u8; BLOCK];
        let n = name.len().min(100);
        h[..n].copy_from_slice(&name[..n]);
        put_octal(&mut h[100..108], 0o644);
        put_octal(&mut h[108..116], 0);
        put_octal(&mut h[116..124], 0);
        if !put_octal(&mut h[124..136], size) {
            h[124] = 0x80;
            h[128..136].copy_from_slice(&size.to_be_bytes());
        }
        put_octal(&mut h[136..148], 0);
        h[156] = typeflag;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        set_checksum(&mut h);
        h
    }

    /// Recomputes and stores the header checksum (6 octal digits, NUL, space).
    pub fn set_checksum(h: &mut [u8; BLOCK]) {
        h[148..156].copy_from_slice(b"        ");
        let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
        let text = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(text.as_bytes());
    }

    /// One pax record, `"%d key=value\n"` with the length counting itself.
    pub fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
        let body = key.len() + value.len() + 3; // ' ', '=', '\n'
        let mut len = body + 1;
        while len.to_string().len() + body > len {
            len += 1;
        }
        let mut rec = format!("{len} {key}=").into_bytes();
        rec.extend_from_slice(value);
        rec.push(b'\n');
        debug_assert_eq!(rec.len(), len);
        rec
    }
}

#[cfg(test)]
mod tests;
