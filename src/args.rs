//! Argument parsers that several subcommands share (so no subcommand imports another's).

/// `123`, `64K`, `512M`, `50G`, `2T` (powers of 1024).
pub(crate) fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{text:?}: the suffix is not K, M, G or T")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a number of bytes (such as 50G)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn cache_sizes_read_with_binary_suffixes() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("50g"), Ok(50 << 30));
        assert!(parse_bytes("5X").unwrap_err().contains("suffix"));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999T")
            .unwrap_err()
            .contains("too large"));
    }
}
