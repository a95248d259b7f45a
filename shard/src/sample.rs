//! Samples: runs of consecutive tar entries that share a key, by the WebDataset rule.
//!
//! An entry path `dir/000123.seg.png` has the key `dir/000123` (the path up to the first dot
//! of its last component) and the field `seg.png` (the rest). Consecutive entries with the
//! same key form one sample; a repeated field starts a new sample with the same key, as the
//! Python `webdataset` package groups them. Entries whose last component has no key (no dot,
//! or a leading dot) and `__meta__`-style top-level files are not sample fields and are
//! skipped, also as `webdataset` does. Unlike `webdataset`, field names keep their case.

use std::sync::Arc;

use crate::read::Entry;

/// One field of a sample: the extension-like name and the entry's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub data: Vec<u8>,
}

/// A sample of a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The shard it came from (a path or URL, for messages).
    pub shard: Arc<str>,
    pub key: String,
    /// Position of the sample in its shard, from 0.
    pub index: u64,
    /// Shard byte offset of the sample's first header.
    pub start: u64,
    /// Shard byte offset just past the sample's last entry (its padding included).
    pub end: u64,
    pub fields: Vec<Field>,
    /// The xxh3-64 of its bytes (`start..end`), once its reader has checked them against
    /// the shard's index: what names its contents without hashing them again. `None` when
    /// nothing checked them.
    pub checksum: Option<u64>,
}

/// A key (or field name) as one column of a text listing: tabs, newlines and other control
/// characters escaped (`\t`, `\n`, `\u{7}`), so a key holding them cannot split a line or a
/// column of `sluice inspect` or `--dump-ids`. Other keys are returned as they are.
pub fn escaped_key(key: &str) -> std::borrow::Cow<'_, str> {
    if key.chars().any(char::is_control) {
        key.escape_debug().to_string().into()
    } else {
        key.into()
    }
}

impl Sample {
    /// The bytes of a field, by name.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.data.as_slice())
    }

    /// Total bytes of all fields.
    pub fn payload_bytes(&self) -> u64 {
        self.fields.iter().map(|f| f.data.len() as u64).sum()
    }
}

/// Splits an entry path into (key, field) by the WebDataset rule, or `None` when the entry is
/// not a sample field.
pub fn split_key(path: &str) -> Option<(&str, &str)> {
    if !path.contains('/') && path.starts_with("__") && path.ends_with("__") {
        return None;
    }
    let last = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[last..].find('.')? + last;
    if dot == last {
        return None;
    }
    Some((&path[..dot], &path[dot + 1..]))
}

/// Whether an entry `key.field` belongs to the sample `current` (whose fields are `fields`):
/// the same key and a field it does not have yet. The one grouping rule, shared by
/// [`SampleGrouper`] and the index's scan, so a sample's indexed range is the one read.
pub fn continues_sample<'a>(
    current: &str,
    mut fields: impl Iterator<Item = &'a str>,
    key: &str,
    field: &str,
) -> bool {
    current == key && fields.all(|f| f != field)
}

/// Groups a stream of entries into samples. Pure: no IO.
#[derive(Debug)]
pub struct SampleGrouper {
    shard: Arc<str>,
    next_index: u64,
    current: Option<Sample>,
}

impl SampleGrouper {
    /// A grouper whose first sample gets index `first_index`.
    pub fn new(shard: Arc<str>, first_index: u64) -> Self {
        SampleGrouper {
            shard,
            next_index: first_index,
            current: None,
        }
    }

    /// Adds an entry; returns the previous sample when this entry starts a new one.
    pub fn push(&mut self, entry: Entry) -> Option<Sample> {
        let (key, field) = split_key(&entry.header.path)?;
        let continues = self.current.as_ref().is_some_and(|s| {
            continues_sample(&s.key, s.fields.iter().map(|f| f.name.as_str()), key, field)
        });
        let field = Field {
            name: field.to_string(),
            data: entry.data,
        };
        if continues {
            if let Some(cur) = self.current.as_mut() {
                cur.fields.push(field);
                cur.end = entry.header.end();
            }
            return None;
        }
        let next = Sample {
            shard: self.shard.clone(),
            key: key.to_string(),
            index: self.next_index,
            start: entry.header.start,
            end: entry.header.end(),
            fields: vec![field],
            checksum: None,
        };
        self.next_index += 1;
        self.current.replace(next)
    }

    /// The last sample, at the end of the stream.
    pub fn finish(&mut self) -> Option<Sample> {
        self.current.take()
    }

    /// Drops a partial sample after a read error: it must not be delivered as complete.
    pub fn discard(&mut self) {
        self.current = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_webdataset_rule() {
        assert_eq!(split_key("000123.jpg"), Some(("000123", "jpg")));
        assert_eq!(
            split_key("a/b/000123.seg.png"),
            Some(("a/b/000123", "seg.png"))
        );
        assert_eq!(split_key("a.b/c.d"), Some(("a.b/c", "d")));
        assert_eq!(split_key("dir/noext"), None);
        assert_eq!(split_key("dir/.hidden"), None);
        assert_eq!(split_key("__index__"), None);
        assert_eq!(split_key("x/__meta__.json"), Some(("x/__meta__", "json")));
        assert_eq!(split_key("trailing."), Some(("trailing", "")));
    }
}
