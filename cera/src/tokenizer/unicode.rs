//! Unicode character classes used by the pre-tokenizers: letters (`\p{L}`), numbers (`\p{N}`)
//! and white space (the `White_Space` property, as `\s` in Rust and llama.cpp).
//!
//! The letter and number tables come from `regex-syntax`, the same tables the regex engine uses,
//! so the hand-written splitters and the regex-based ones agree.

use std::sync::OnceLock;

fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    let Ok(hir) = regex_syntax::Parser::new().parse(pattern) else {
        return Vec::new();
    };
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect(),
        _ => Vec::new(),
    }
}

fn in_ranges(ranges: &[(u32, u32)], c: char) -> bool {
    let c = c as u32;
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Whether `c` is a letter (general category L).
pub fn is_letter(c: char) -> bool {
    static T: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    in_ranges(T.get_or_init(|| class_ranges(r"\p{L}")), c)
}

/// Whether `c` is a number (general category N).
pub fn is_number(c: char) -> bool {
    static T: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    in_ranges(T.get_or_init(|| class_ranges(r"\p{N}")), c)
}

/// Whether `c` has the Unicode `White_Space` property.
pub fn is_whitespace(c: char) -> bool {
    c.is_whitespace()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert!(is_letter('a') && is_letter('é') && is_letter('中') && is_letter('ß'));
        assert!(!is_letter('1') && !is_letter(' ') && !is_letter('😀') && !is_letter('\u{301}'));
        assert!(is_number('7') && is_number('٣') && is_number('½') && is_number('Ⅻ'));
        assert!(!is_number('a'));
        assert!(is_whitespace('\u{3000}') && is_whitespace('\u{85}') && !is_whitespace('\u{200b}'));
    }
}
