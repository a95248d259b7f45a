//! Brace notation for shard lists, as WebDataset users write them:
//! `train-{000000..001281}.tar`, `{train,val}-{0..9}.tar`, `s-{0..100..10}.tar`, nested
//! `{a,b{1..2}}`. A range is zero-padded to the longer bound's width when a bound has a
//! leading zero. Braces are expanded left to right, the leftmost varying slowest. `\{`, `\}`
//! and `\,` are literal characters.

use crate::error::{Result, ShardError};

/// Refuse patterns that would expand to more names than this.
pub const MAX_EXPANSION: u64 = 10_000_000;

#[derive(Debug)]
enum Node {
    Lit(String),
    Alt(Vec<Vec<Node>>),
}

/// Expands a brace pattern into the list of names it stands for.
pub fn expand(pattern: &str) -> Result<Vec<String>> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut pos = 0;
    let seq = parse_seq(pattern, &chars, &mut pos, false)?;
    if pos != chars.len() {
        return Err(err(pattern, format!("unmatched '}}' at character {pos}")));
    }
    let count = count(&seq);
    if count > MAX_EXPANSION {
        return Err(err(
            pattern,
            format!("expands to {count} names, over the limit of {MAX_EXPANSION}"),
        ));
    }
    let mut out = vec![String::new()];
    expand_seq(&seq, &mut out);
    Ok(out)
}

fn err(pattern: &str, detail: String) -> ShardError {
    ShardError::Pattern {
        pattern: pattern.to_string(),
        detail,
    }
}

fn parse_seq(pattern: &str, chars: &[char], pos: &mut usize, nested: bool) -> Result<Vec<Node>> {
    let mut nodes = Vec::new();
    let mut lit = String::new();
    while *pos < chars.len() {
        match chars[*pos] {
            '\\' if *pos + 1 < chars.len() => {
                lit.push(chars[*pos + 1]);
                *pos += 2;
            }
            '{' => {
                let open = *pos;
                *pos += 1;
                if !lit.is_empty() {
                    nodes.push(Node::Lit(std::mem::take(&mut lit)));
                }
                nodes.push(parse_group(pattern, chars, pos, open)?);
            }
            '}' | ',' if nested => break,
            '}' => break,
            c => {
                lit.push(c);
                *pos += 1;
            }
        }
    }
    if !lit.is_empty() {
        nodes.push(Node::Lit(lit));
    }
    Ok(nodes)
}

/// Parses the inside of `{...}`; `pos` is just past the `{`.
fn parse_group(pattern: &str, chars: &[char], pos: &mut usize, open: usize) -> Result<Node> {
    // A range has no nested braces or commas: look for `A..B` or `A..B..S` up to the `}`.
    if let Some(close) = chars[*pos..].iter().position(|&c| c == '}') {
        let body: String = chars[*pos..*pos + close].iter().collect();
        if body.contains("..") && !body.contains(['{', ',', '\\']) {
            *pos += close + 1;
            return parse_range(pattern, &body);
        }
    }
    let mut alts = Vec::new();
    loop {
        alts.push(parse_seq(pattern, chars, pos, true)?);
        match chars.get(*pos) {
            Some(',') => *pos += 1,
            Some('}') => {
                *pos += 1;
                break;
            }
            _ => {
                return Err(err(
                    pattern,
                    format!("'{{' at character {open} is never closed"),
                ))
            }
        }
    }
    if alts.len() < 2 {
        return Err(err(
            pattern,
            format!("the braces at character {open} hold neither a list (a,b) nor a range (0..9)"),
        ));
    }
    Ok(Node::Alt(alts))
}

fn parse_range(pattern: &str, body: &str) -> Result<Node> {
    let parts: Vec<&str> = body.split("..").collect();
    let (lo, hi, step) = match parts.as_slice() {
        [lo, hi] => (*lo, *hi, "1"),
        [lo, hi, step] => (*lo, *hi, *step),
        _ => {
            return Err(err(
                pattern,
                format!("range {{{body}}} is not A..B or A..B..STEP"),
            ))
        }
    };
    let number = |s: &str| -> Result<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(
                pattern,
                format!("range bound {s:?} in {{{body}}} is not a non-negative integer"),
            ));
        }
        s.parse()
            .map_err(|_| err(pattern, format!("range bound {s:?} is too large")))
    };
    let (a, b, step) = (number(lo)?, number(hi)?, number(step)?);
    if step == 0 {
        return Err(err(pattern, format!("range {{{body}}} has a step of 0")));
    }
    let padded = |s: &str| s.len() > 1 && s.starts_with('0');
    let width = if padded(lo) || padded(hi) {
        lo.len().max(hi.len())
    } else {
        0
    };
    let len = a.abs_diff(b) / step + 1;
    if len > MAX_EXPANSION {
        return Err(err(
            pattern,
            format!("range {{{body}}} has {len} values, over the limit of {MAX_EXPANSION}"),
        ));
    }
    let values = (0..len).map(|i| {
        let v = if a <= b { a + i * step } else { a - i * step };
        vec![Node::Lit(format!("{v:0width$}"))]
    });
    Ok(Node::Alt(values.collect()))
}

fn count(seq: &[Node]) -> u64 {
    seq.iter().fold(1u64, |acc, node| match node {
        Node::Lit(_) => acc,
        Node::Alt(alts) => {
            let n = alts
                .iter()
                .map(|a| count(a))
                .fold(0u64, u64::saturating_add);
            acc.saturating_mul(n)
        }
    })
}

fn expand_seq(seq: &[Node], out: &mut Vec<String>) {
    for node in seq {
        match node {
            Node::Lit(s) => out.iter_mut().for_each(|o| o.push_str(s)),
            Node::Alt(alts) => {
                let prefixes = std::mem::take(out);
                for prefix in prefixes {
                    for alt in alts {
                        let mut sub = vec![prefix.clone()];
                        expand_seq(alt, &mut sub);
                        out.extend(sub);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn expands_ranges_lists_and_nesting() {
        assert_eq!(expand("a.tar").unwrap(), ["a.tar"]);
        assert_eq!(
            expand("train-{000000..000002}.tar").unwrap(),
            ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
        );
        assert_eq!(expand("{8..10}").unwrap(), ["8", "9", "10"]);
        assert_eq!(expand("{08..10}").unwrap(), ["08", "09", "10"]);
        assert_eq!(expand("{3..1}").unwrap(), ["3", "2", "1"]);
        assert_eq!(expand("{0..10..5}").unwrap(), ["0", "5", "10"]);
        assert_eq!(
            expand("{train,val}-{0..1}").unwrap(),
            ["train-0", "train-1", "val-0", "val-1"]
        );
        assert_eq!(expand("{a,b{1..2}}x").unwrap(), ["ax", "b1x", "b2x"]);
        assert_eq!(expand("{a,}").unwrap(), ["a", ""]);
        assert_eq!(expand(r"\{a\}").unwrap(), ["{a}"]);
        assert_eq!(
            expand("http://h:7000/v1/b/s-{0..1}.tar").unwrap(),
            ["http://h:7000/v1/b/s-0.tar", "http://h:7000/v1/b/s-1.tar"]
        );
    }

    #[test]
    fn malformed_patterns_are_errors() {
        for bad in [
            "{0..9",
            "a}",
            "{a}",
            "{}",
            "{0..x}",
            "{0..9..0}",
            "{1..2..3..4}",
            "{-1..2}",
        ] {
            let e = expand(bad).expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(expand("{0..99999999999}").is_err());
        assert!(expand("{0..9999}{0..9999}").is_err());
    }

    proptest! {
        #[test]
        fn ranges_expand_to_every_number_once(lo in 0u64..500, len in 1u64..300, width in 0usize..8) {
            let hi = lo + len - 1;
            let pattern = format!("s-{{{lo:0width$}..{hi:0width$}}}.tar");
            let names = expand(&pattern).unwrap();
            prop_assert_eq!(names.len() as u64, len);
            for (i, name) in names.iter().enumerate() {
                let n: u64 = name[2..name.len() - 4].parse().unwrap();
                prop_assert_eq!(n, lo + i as u64);
            }
        }

        #[test]
        fn never_panics(s in "[{}a-c0-9.,\\\\]{0,24}") {
            let _ = expand(&s);
        }
    }
}
