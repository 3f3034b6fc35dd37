//! The GPT-2 byte-level mapping: every byte is shown as a printable character, so that BPE
//! vocabularies of byte sequences can be stored as strings (`Ġ` is the space byte).
//!
//! Printable bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` stand for themselves; the other 68 bytes
//! map, in order, to U+0100 onwards.

use std::sync::OnceLock;

struct Tables {
    to_char: [char; 256],
    /// Indexed by code point, for code points below 0x144.
    to_byte: [Option<u8>; 0x144],
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [None; 0x144];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let cp = if printable {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            let c = char::from_u32(cp).unwrap_or('\0'); // cp < 0x144: always valid
            to_char[b as usize] = c;
            to_byte[cp as usize] = Some(b);
        }
        Tables { to_char, to_byte }
    })
}

/// Appends the byte-level encoding of `bytes` to `out`.
pub fn encode_into(bytes: &[u8], out: &mut String) {
    let t = tables();
    out.extend(bytes.iter().map(|&b| t.to_char[b as usize]));
}

/// The byte a byte-level character stands for, if it is one.
pub fn char_to_byte(c: char) -> Option<u8> {
    tables().to_byte.get(c as usize).copied().flatten()
}

/// Decodes a byte-level string back to bytes. Characters outside the mapping are kept as
/// their own UTF-8 bytes.
pub fn decode_into(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_all_bytes() {
        let all: Vec<u8> = (0..=255).collect();
        let mut s = String::new();
        encode_into(&all, &mut s);
        assert_eq!(s.chars().count(), 256);
        assert!(s.starts_with('Ā'));
        let mut back = Vec::new();
        decode_into(&s, &mut back);
        assert_eq!(back, all);
        let mut sp = String::new();
        encode_into(b" \n", &mut sp);
        assert_eq!(sp, "ĠĊ");
    }
}
