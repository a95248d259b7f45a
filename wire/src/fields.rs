//! What travels beside a sample's tensor: the non-image fields a job asked for (captions,
//! JSON annotations, arrays), where its integer label comes from, and the geometry the
//! augmentation applied (so annotations can follow their crops).
//!
//! Plain data and parsing only: the worker reads fields out of the shard and the label out of
//! its field; the client keeps them in plan order beside the batch. A job that asks for no
//! fields sends none, so classification pays nothing for them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The fields a job wants beside each tensor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FieldSelection {
    /// None (classification: the image and its label only).
    #[default]
    None,
    /// These fields, by name as they stand in the shard (`txt`, `json`, `seg.png`).
    Named(Vec<String>),
    /// Every field but the image.
    All,
}

impl FieldSelection {
    /// From a user's list: `[]` is none, `["all"]` every non-image field, otherwise names.
    /// A name must be a field name as the shard has it: no path separator, no leading dot.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Self, String> {
        let names: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        if names.is_empty() {
            return Ok(FieldSelection::None);
        }
        if names.contains(&"all") {
            if names.len() > 1 {
                return Err(format!(
                    "fields: \"all\" cannot be combined with names ({names:?})"
                ));
            }
            return Ok(FieldSelection::All);
        }
        let mut out: Vec<String> = Vec::with_capacity(names.len());
        for n in names {
            let n = n.trim();
            if n.is_empty() || n.starts_with('.') || n.contains('/') || n.len() > 100 {
                return Err(format!(
                    "fields: {n:?} is not a field name (the part of an entry's name after \
                     its key, such as txt, json or seg.png)"
                ));
            }
            if !out.iter().any(|o| o == n) {
                out.push(n.to_string());
            }
        }
        Ok(FieldSelection::Named(out))
    }

    /// Whether a field named `name` is sent (the image field never is).
    pub fn wants(&self, name: &str) -> bool {
        match self {
            FieldSelection::None => false,
            FieldSelection::Named(names) => names.iter().any(|n| n == name),
            FieldSelection::All => true,
        }
    }

    /// The names asked for that `has` (a sample's field names) lacks: empty unless fields are
    /// asked for by name.
    pub fn missing_from<'a>(&'a self, has: &[&str]) -> Vec<&'a str> {
        match self {
            FieldSelection::Named(names) => names
                .iter()
                .map(String::as_str)
                .filter(|n| !has.contains(n))
                .collect(),
            _ => Vec::new(),
        }
    }

    pub fn is_none(&self) -> bool {
        matches!(self, FieldSelection::None)
    }
}

/// Where a sample's integer label comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LabelSource {
    /// No label (unlabeled data): every sample's label is -1.
    None,
    /// A field holding an integer as text (`cls`, `cls2`, `index`).
    Field(String),
    /// An integer inside a JSON field, at a key path (`json:category_id`,
    /// `json:annotations.0.category_id`: numbers index arrays).
    Json { field: String, path: Vec<String> },
}

impl Default for LabelSource {
    fn default() -> Self {
        LabelSource::Field("cls".into())
    }
}

impl LabelSource {
    /// Parses `cls`, `json:category_id`, `meta.json:a.b`, or `none`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = |why: &str| {
            format!(
                "label: {s:?} {why} (give a field such as \"cls\", a JSON key path such as \
                 \"json:category_id\", or None for unlabeled data)"
            )
        };
        if s.is_empty() {
            return Err(bad(
                "is empty (an empty label would silently read no label at all)",
            ));
        }
        if s.eq_ignore_ascii_case("none") {
            return Ok(LabelSource::None);
        }
        let valid_field = |f: &str| !f.is_empty() && !f.starts_with('.') && !f.contains('/');
        match s.split_once(':') {
            None if valid_field(s) => Ok(LabelSource::Field(s.to_string())),
            None => Err(bad("is not a field name")),
            Some((field, path)) => {
                if !valid_field(field) {
                    return Err(bad("does not start with a field name"));
                }
                let path: Vec<String> = path.split('.').map(str::to_string).collect();
                if path.iter().any(String::is_empty) {
                    return Err(bad("has an empty key in its path"));
                }
                Ok(LabelSource::Json {
                    field: field.to_string(),
                    path,
                })
            }
        }
    }

    /// The field the label is read from.
    pub fn field(&self) -> Option<&str> {
        match self {
            LabelSource::None => None,
            LabelSource::Field(f) | LabelSource::Json { field: f, .. } => Some(f),
        }
    }
}

impl fmt::Display for LabelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LabelSource::None => f.write_str("none"),
            LabelSource::Field(name) => f.write_str(name),
            LabelSource::Json { field, path } => write!(f, "{field}:{}", path.join(".")),
        }
    }
}

/// Where a sample's output came from: the crop box in source pixels (after EXIF orientation)
/// that was resampled to the output size, then mirrored if `flip`. The box may reach past the
/// image (a center crop larger than it: that part is black). A clip's frames share one box.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SampleGeometry {
    /// The source image's height and width.
    pub source: (u32, u32),
    /// (x0, y0, x1, y1) in source pixels.
    pub crop: (f32, f32, f32, f32),
    /// The output's height and width.
    pub size: (u32, u32),
    pub flip: bool,
    /// A clip's frames: which source frames became its tensor's.
    pub frames: Option<ClipFrames>,
    /// The pixel ops' rotate, shear and translate, composed, after the crop and flip: output
    /// pixel (x, y) of the crop went to (a·x + b·y + c, d·x + e·y + f), as `[a, b, c, d, e, f]`
    /// in pixel-edge coordinates (torchvision's for boxes). `None` when none moved it.
    pub affine: Option<[f32; 6]>,
}

/// The source frames of a clip's tensor: frame `i` is `min(first + i·stride, total - 1)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClipFrames {
    pub first: u32,
    pub stride: u32,
    /// Frames in the tensor.
    pub count: u32,
    /// Frames in the source clip.
    pub total: u32,
}

impl ClipFrames {
    /// The source frame of each of the tensor's frames.
    pub fn indices(self) -> impl Iterator<Item = u32> {
        let last = self.total.saturating_sub(1);
        (0..self.count).map(move |i| {
            let at = u64::from(self.first) + u64::from(i) * u64::from(self.stride);
            at.min(u64::from(last)) as u32
        })
    }
}

/// A sample's fields as they arrived: each name with its bytes, back to back in one buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleFields {
    /// (name, end offset in `bytes`), in the order the shard has them.
    spans: Vec<(String, usize)>,
    bytes: Vec<u8>,
    /// Every field the sample has, when one asked for by name is not among them (see
    /// [`crate::SampleHeader::has`]); `None` otherwise (boxed: a sample carries it rarely,
    /// and every queue of samples would pay its size).
    has: Option<Box<[String]>>,
}

impl SampleFields {
    /// From a header's (name, length) list and the bytes it describes, back to back.
    /// `None` when the lengths do not add up to `bytes.len()`.
    pub fn new(names: Vec<(String, u64)>, bytes: Vec<u8>) -> Option<Self> {
        let mut end = 0usize;
        let mut spans = Vec::with_capacity(names.len());
        for (name, len) in names {
            end = end.checked_add(usize::try_from(len).ok()?)?;
            spans.push((name, end));
        }
        (end == bytes.len()).then_some(SampleFields {
            spans,
            bytes,
            has: None,
        })
    }

    /// These, with the names of every field the sample has (a worker sends them when a field
    /// asked for by name is missing).
    pub fn with_names_it_has(mut self, has: Vec<String>) -> Self {
        self.has = (!has.is_empty()).then(|| has.into_boxed_slice());
        self
    }

    /// The names of every field the sample has, when the worker sent them (a field asked for
    /// by name was missing); empty otherwise.
    pub fn names_it_has(&self) -> &[String] {
        self.has.as_deref().unwrap_or(&[])
    }

    /// The bytes of field `name`, if the sample has it.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, b)| b)
    }

    /// Each (name, bytes), in the shard's order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        let mut start = 0;
        self.spans.iter().map(move |(name, end)| {
            let b = &self.bytes[start..*end];
            start = *end;
            (name.as_str(), b)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Bytes held (the fields' contents).
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_parse_from_user_lists() {
        assert_eq!(
            FieldSelection::from_names::<&str>(&[]),
            Ok(FieldSelection::None)
        );
        assert_eq!(
            FieldSelection::from_names(&["all"]),
            Ok(FieldSelection::All)
        );
        assert_eq!(
            FieldSelection::from_names(&["txt", "json", "txt"]),
            Ok(FieldSelection::Named(vec!["txt".into(), "json".into()]))
        );
        assert!(FieldSelection::from_names(&["all", "txt"]).is_err());
        assert!(FieldSelection::from_names(&[".txt"]).is_err());
        assert!(FieldSelection::from_names(&["a/b"]).is_err());
        assert!(FieldSelection::All.wants("json"));
        assert!(!FieldSelection::None.wants("json"));
    }

    #[test]
    fn label_sources_parse_and_print_back() {
        for s in [
            "cls",
            "json:category_id",
            "meta.json:annotations.0.id",
            "none",
        ] {
            assert_eq!(LabelSource::parse(s).unwrap().to_string(), s);
        }
        assert!(LabelSource::parse("").unwrap_err().contains("is empty"));
        assert_eq!(
            LabelSource::parse("json:a.b").unwrap(),
            LabelSource::Json {
                field: "json".into(),
                path: vec!["a".into(), "b".into()]
            }
        );
        for bad in ["json:", "json:a..b", ":x", "a/b"] {
            let e = LabelSource::parse(bad).unwrap_err();
            assert!(e.contains("label"), "{e}");
        }
    }

    #[test]
    fn fields_are_found_by_name_and_lengths_must_add_up() {
        let f = SampleFields::new(
            vec![("txt".into(), 2), ("json".into(), 3), ("e".into(), 0)],
            b"hi{}x".to_vec(),
        )
        .unwrap();
        assert_eq!(f.get("txt"), Some(&b"hi"[..]));
        assert_eq!(f.get("json"), Some(&b"{}x"[..]));
        assert_eq!(f.get("e"), Some(&b""[..]));
        assert_eq!(f.get("cls"), None);
        assert_eq!(f.iter().count(), 3);
        assert!(SampleFields::new(vec![("txt".into(), 3)], b"hi".to_vec()).is_none());
        assert!(SampleFields::new(vec![("txt".into(), u64::MAX)], vec![]).is_none());
    }
}
