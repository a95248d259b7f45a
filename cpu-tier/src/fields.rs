//! What of a sample besides its image a job receives: its integer label, read from the field
//! the job names (`cls`, or a key path inside a JSON field), and the non-image fields it asked
//! for, each within `max_field_bytes`. A sample whose label cannot be read, or whose sent
//! field is too large, is a named skip: never a label of -1 that crashes a loss on the GPU,
//! never a frame too large to send.

use sluice_shard::{Field, Sample};
use sluice_wire::{FieldSelection, LabelSource};

use crate::error::DecodeError;

/// A job's choice of label and fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldSpec {
    pub fields: FieldSelection,
    pub label: LabelSource,
    pub max_field_bytes: u64,
}

impl Default for FieldSpec {
    fn default() -> Self {
        FieldSpec {
            fields: FieldSelection::None,
            label: LabelSource::default(),
            max_field_bytes: 1 << 20,
        }
    }
}

/// Digits only, with an optional sign: an integer, whatever its size.
fn is_long_integer(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

impl FieldSpec {
    /// The sample's label: `None` for a job without one.
    pub fn label(&self, sample: &Sample) -> Result<Option<i64>, DecodeError> {
        let Some(name) = self.label.field() else {
            return Ok(None);
        };
        let present = || {
            sample
                .fields
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let raw = sample.field(name).ok_or_else(|| {
            DecodeError::Label(format!(
                "no {name:?} field (the sample has {}); give label=None for unlabeled data",
                present()
            ))
        })?;
        if raw.len() as u64 > self.max_field_bytes {
            return Err(DecodeError::FieldTooLarge {
                field: name.into(),
                bytes: raw.len() as u64,
                limit: self.max_field_bytes,
            });
        }
        let shown = || String::from_utf8_lossy(&raw[..raw.len().min(40)]).into_owned();
        match &self.label {
            LabelSource::None => Ok(None),
            LabelSource::Field(_) => {
                let text = std::str::from_utf8(raw).map(str::trim).unwrap_or("");
                match text.parse::<i64>() {
                    Ok(v) => Ok(Some(v)),
                    Err(_) if text.parse::<i128>().is_ok() || is_long_integer(text) => {
                        Err(DecodeError::Label(format!(
                            "{name} field {:?} is an integer too large for a 64-bit label",
                            shown()
                        )))
                    }
                    Err(_) => Err(DecodeError::Label(format!(
                        "{name} field {:?} is not an integer",
                        shown()
                    ))),
                }
            }
            LabelSource::Json { path, .. } => {
                let value: serde_json::Value = serde_json::from_slice(raw).map_err(|e| {
                    DecodeError::Label(format!("{name} field is not valid JSON ({e})"))
                })?;
                let mut at = &value;
                for (depth, key) in path.iter().enumerate() {
                    let next = match at {
                        serde_json::Value::Object(m) => m.get(key),
                        serde_json::Value::Array(a) => {
                            key.parse::<usize>().ok().and_then(|i| a.get(i))
                        }
                        _ => None,
                    };
                    at = next.ok_or_else(|| {
                        DecodeError::Label(format!(
                            "{name} field has no {:?}",
                            path[..=depth].join(".")
                        ))
                    })?;
                }
                let at_path = format!("{name}:{}", path.join("."));
                if let Some(v) = at.as_i64() {
                    return Ok(Some(v));
                }
                let why = match at {
                    serde_json::Value::Number(n)
                        if n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0) =>
                    {
                        format!("is {n}, an integer too large for a 64-bit label")
                    }
                    serde_json::Value::String(text) => {
                        format!("is the string {text:?}, not an integer (labels are JSON numbers)")
                    }
                    other => format!("is {other}, not an integer"),
                };
                Err(DecodeError::Label(format!("{at_path} {why}")))
            }
        }
    }

    /// Every field name `sample` has, when a field asked for by name is not among those sent
    /// (missing, or the image field, which is never sent); empty otherwise.
    pub fn names_if_missing(&self, sample: &Sample, image_field: &str) -> Vec<String> {
        let sent: Vec<&str> = sample
            .fields
            .iter()
            .map(|f| f.name.as_str())
            .filter(|n| *n != image_field)
            .collect();
        if self.fields.missing_from(&sent).is_empty() {
            return Vec::new();
        }
        sample.fields.iter().map(|f| f.name.clone()).collect()
    }

    /// The fields sent with the sample's tensor: those asked for, in the shard's order, the
    /// image field never.
    pub fn pick(&self, sample: &Sample, image_field: &str) -> Result<Vec<Field>, DecodeError> {
        if self.fields.is_none() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for f in &sample.fields {
            if f.name == image_field || !self.fields.wants(&f.name) {
                continue;
            }
            if f.data.len() as u64 > self.max_field_bytes {
                return Err(DecodeError::FieldTooLarge {
                    field: f.name.clone(),
                    bytes: f.data.len() as u64,
                    limit: self.max_field_bytes,
                });
            }
            out.push(f.clone());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn sample(fields: &[(&str, &[u8])]) -> Sample {
        Sample {
            shard: Arc::from("s.tar"),
            key: "k".into(),
            index: 0,
            start: 0,
            end: 0,
            fields: fields
                .iter()
                .map(|(n, d)| Field {
                    name: n.to_string(),
                    data: d.to_vec(),
                })
                .collect(),
            checksum: None,
        }
    }

    fn spec(label: &str) -> FieldSpec {
        FieldSpec {
            label: LabelSource::parse(label).unwrap(),
            ..FieldSpec::default()
        }
    }

    #[test]
    fn labels_come_from_the_named_field_or_a_json_path() {
        let s = sample(&[
            ("jpg", b"x"),
            ("cls", b" 7\n"),
            ("json", br#"{"category_id": 12, "a": [{"b": 5}]}"#),
        ]);
        assert_eq!(spec("cls").label(&s), Ok(Some(7)));
        assert_eq!(spec("json:category_id").label(&s), Ok(Some(12)));
        assert_eq!(spec("json:a.0.b").label(&s), Ok(Some(5)));
        assert_eq!(spec("none").label(&s), Ok(None));
    }

    #[test]
    fn a_missing_or_bad_label_is_an_error_naming_it() {
        let s = sample(&[("jpg", b"x"), ("cls", b"cat"), ("json", b"{\"a\": 1.5}")]);
        let e = |l: &str| spec(l).label(&s).unwrap_err().to_string();
        assert!(
            e("cls").contains("\"cat\" is not an integer"),
            "{}",
            e("cls")
        );
        assert!(e("txt").contains("no \"txt\" field") && e("txt").contains("label=None"));
        assert!(e("json:b").contains("has no \"b\""), "{}", e("json:b"));
        assert!(
            e("json:a").contains("1.5, not an integer"),
            "{}",
            e("json:a")
        );
        let huge = sample(&[
            ("cls", b"1180591620717411303424"),
            (
                "json",
                br#"{"a": 1180591620717411303424, "s": "3", "n": -5}"#,
            ),
        ]);
        let e = |l: &str| spec(l).label(&huge).unwrap_err().to_string();
        assert!(
            e("cls").contains("too large for a 64-bit label"),
            "{}",
            e("cls")
        );
        assert!(
            e("json:a").contains("too large for a 64-bit label"),
            "{}",
            e("json:a")
        );
        assert!(
            e("json:s").contains("the string \"3\", not an integer"),
            "{}",
            e("json:s")
        );
        // Negative labels are the client's to refuse (LabelRange), so they travel.
        assert_eq!(spec("json:n").label(&huge), Ok(Some(-5)));
        assert!(
            LabelSource::parse("").is_err(),
            "an empty label is not \"no label\""
        );
        let bad = sample(&[("json", b"{")]);
        assert!(spec("json:a")
            .label(&bad)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
    }

    #[test]
    fn only_requested_fields_travel_and_each_within_the_limit() {
        let s = sample(&[
            ("jpg", b"img"),
            ("txt", b"a cat"),
            ("json", b"{}"),
            ("cls", b"1"),
        ]);
        let names = |spec: &FieldSpec| {
            spec.pick(&s, "jpg")
                .unwrap()
                .into_iter()
                .map(|f| f.name)
                .collect::<Vec<_>>()
        };
        let mut spec = FieldSpec::default();
        assert!(names(&spec).is_empty());
        spec.fields = FieldSelection::Named(vec!["json".into(), "npy".into()]);
        assert_eq!(names(&spec), ["json"]);
        spec.fields = FieldSelection::All;
        assert_eq!(names(&spec), ["txt", "json", "cls"]);
        spec.max_field_bytes = 4;
        let e = spec.pick(&s, "jpg").unwrap_err().to_string();
        assert!(e.contains("\"txt\" is 5 bytes, over the limit of 4"), "{e}");
    }
}
