//! The layout of a sample frame's payload, owned here so the worker that joins it and every
//! client path that takes it apart (a QUIC frame, a same-host frame whose tensor is in a
//! shared-memory slot, a sample handed over in process) agree: the tensor
//! (`SampleHeader::tensor_bytes` bytes), then each field the header lists, back to back in
//! its order.

use crate::{SampleFields, SampleHeader};

/// The payload layout "tensor ‖ fields" (see the module documentation).
pub struct SamplePayload;

impl SamplePayload {
    /// A worker's payload: `tensor` followed by each field's bytes, and the (name, length)
    /// list its header carries.
    pub fn join<'a>(
        mut tensor: Vec<u8>,
        fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> (Vec<u8>, Vec<(String, u64)>) {
        let mut names = Vec::new();
        for (name, bytes) in fields {
            tensor.extend_from_slice(bytes);
            names.push((name.to_string(), bytes.len() as u64));
        }
        (tensor, names)
    }

    /// The tensor's bytes and the fields' bytes of `payload`.
    pub fn parts<'a>(
        header: &SampleHeader,
        payload: &'a [u8],
    ) -> Result<(&'a [u8], &'a [u8]), String> {
        let n = usize::try_from(header.tensor_bytes).unwrap_or(usize::MAX);
        if payload.len() as u64 != header.payload_len() || payload.len() < n {
            return Err(format!(
                "sample {:?}: a payload of {} bytes, its header says {} ({} of tensor)",
                header.key,
                payload.len(),
                header.payload_len(),
                header.tensor_bytes
            ));
        }
        Ok(payload.split_at(n))
    }

    /// The fields of a sample whose field bytes (everything after the tensor) are `bytes`;
    /// the header's list moves into them.
    pub fn fields(header: &mut SampleHeader, bytes: Vec<u8>) -> Result<SampleFields, String> {
        let names = std::mem::take(&mut header.fields);
        let listed = names.iter().fold(0u64, |n, (_, l)| n.saturating_add(*l));
        let fields = SampleFields::new(names, bytes).ok_or_else(|| {
            format!(
                "sample {:?}: its fields add up to {listed} bytes, not what follows its tensor",
                header.key
            )
        })?;
        Ok(fields.with_names_it_has(std::mem::take(&mut header.has)))
    }

    /// Splits a whole payload in place: `payload` keeps the tensor, the fields are returned.
    pub fn split(header: &mut SampleHeader, payload: &mut Vec<u8>) -> Result<SampleFields, String> {
        Self::parts(header, payload)?;
        let bytes = payload.split_off(header.tensor_bytes as usize);
        Self::fields(header, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(tensor_bytes: u64, fields: Vec<(String, u64)>) -> SampleHeader {
        SampleHeader {
            job: 1,
            unit: 0,
            attempt: 0,
            shard: 0,
            index: 0,
            key: "k".into(),
            label: None,
            tensor_bytes,
            fields,
            geometry: Default::default(),
            has: Vec::new(),
        }
    }

    #[test]
    fn a_joined_payload_splits_back_into_its_tensor_and_fields() {
        let (payload, names) = SamplePayload::join(
            vec![1, 2, 3],
            [("txt", b"hi".as_slice()), ("json", b"{}".as_slice())],
        );
        assert_eq!(payload, [1, 2, 3, b'h', b'i', b'{', b'}']);
        let mut h = header(3, names);
        let (tensor, rest) = SamplePayload::parts(&h, &payload).unwrap();
        assert_eq!((tensor, rest), (&[1, 2, 3][..], &b"hi{}"[..]));
        let mut whole = payload.clone();
        let fields = SamplePayload::split(&mut h, &mut whole).unwrap();
        assert_eq!(whole, [1, 2, 3]);
        assert_eq!(fields.get("json"), Some(&b"{}"[..]));
        assert!(h.fields.is_empty(), "the list moved into the fields");
        let short = header(3, vec![("txt".into(), 5)]);
        assert!(SamplePayload::parts(&short, &payload).is_err());
    }
}
