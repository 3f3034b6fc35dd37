//! Synthetic tokenizers of an exact vocabulary size, valid for cera and llama.cpp.
//!
//! - llama: a byte-level BPE (`tokenizer.ggml.model = gpt2`, pre-tokenizer `llama-bpe`): the 256
//!   byte tokens in GPT-2's byte-to-unicode mapping (in byte order), then merged tokens, then
//!   the control tokens `<|begin_of_text|>` (bos), `<|end_of_text|>` (eos), `<|im_start|>`,
//!   `<|im_end|>`. Merged tokens are all pairs of common characters (space-prefixed and lower-case
//!   first), then each earlier merged token extended by a lower-case letter, in that order, until
//!   the vocabulary is full; merge `k` is `"A B"` and made token `k`, so ranks are creation order.
//! - gemma3: a SentencePiece vocabulary (`tokenizer.ggml.model = llama`): `<pad>` `<eos>`
//!   `<bos>` `<unk>` `<start_of_turn>` `<end_of_turn>`, the byte-fallback tokens `<0x00>` ..
//!   `<0xFF>`, then pieces built the same way (with `▁` for the space) with descending scores.

use std::collections::HashSet;

use cera::gguf::{MetadataArray, MetadataValue};

/// ChatML, for the llama presets.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Gemma's turn template.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const BYTE: i32 = 6;

/// GPT-2's byte-to-unicode mapping: printable bytes stand for themselves, the others for
/// code points from 256 up, in byte order.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("in range")
}

const LOWER: &str = "abcdefghijklmnopqrstuvwxyz";
const UPPER: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
const DIGITS: &str = "0123456789";
const PUNCT: &str = ".,!?'\"-:;()";

/// Merged tokens as `(left, right)` pairs of existing tokens, `n` of them, most common-looking
/// first: pairs of characters (`space` standing for the space), then earlier merges extended by
/// a lower-case letter. Every left and right part is a single character or an earlier merge.
fn merges(space: &str, n: usize) -> Vec<(String, String)> {
    let firsts: Vec<String> =
        std::iter::once(space.to_string()).chain(LOWER.chars().chain(UPPER.chars()).chain(DIGITS.chars()).chain(PUNCT.chars()).map(String::from)).collect();
    let seconds: Vec<String> = LOWER.chars().chain(UPPER.chars()).chain(DIGITS.chars()).chain(PUNCT.chars()).map(String::from).collect();
    // Most plausible pairs first: (space|lower) + lower, then everything else.
    let mut pairs = Vec::new();
    for (tier, f) in firsts.iter().enumerate() {
        for (k, s) in seconds.iter().enumerate() {
            let common = tier <= 26 && k < 26;
            pairs.push((!common, tier, k, f.clone(), s.clone()));
        }
    }
    pairs.sort();
    let mut out: Vec<(String, String)> = Vec::with_capacity(n);
    let mut seen = HashSet::new();
    for (.., f, s) in pairs {
        if out.len() == n {
            return out;
        }
        seen.insert(format!("{f}{s}"));
        out.push((f, s));
    }
    // Then longer ones: each merged token (in creation order) plus a lower-case letter.
    let mut next = 0;
    while out.len() < n {
        let base = format!("{}{}", out[next].0, out[next].1);
        next += 1;
        for c in LOWER.chars() {
            if out.len() == n {
                break;
            }
            let t = format!("{base}{c}");
            if seen.insert(t) {
                out.push((base.clone(), c.to_string()));
            }
        }
    }
    out
}

fn strings(v: Vec<String>) -> MetadataValue {
    MetadataValue::Array(MetadataArray::String(v))
}

fn kv(k: &str, v: MetadataValue) -> (String, MetadataValue) {
    (k.to_string(), v)
}

/// The `tokenizer.*` keys of a byte-level BPE of exactly `vocab` tokens (at least 261), split by
/// the pre-tokenizer `pre` (`tokenizer.ggml.pre`).
pub fn bpe_metadata(vocab: usize, pre: &str) -> Vec<(String, MetadataValue)> {
    const SPECIAL: [&str; 4] = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"];
    assert!(vocab > 256 + SPECIAL.len(), "a BPE vocabulary needs at least 261 tokens");
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let space = byte_char(b' ').to_string();
    let ms = merges(&space, vocab - 256 - SPECIAL.len());
    let mut merge_texts = Vec::with_capacity(ms.len());
    for (a, b) in ms {
        tokens.push(format!("{a}{b}"));
        merge_texts.push(format!("{a} {b}"));
    }
    let bos = tokens.len() as u32;
    tokens.extend(SPECIAL.iter().map(|s| s.to_string()));
    let mut types = vec![NORMAL; tokens.len()];
    for t in &mut types[bos as usize..] {
        *t = CONTROL;
    }
    debug_assert_eq!(tokens.len(), vocab);
    vec![
        kv("tokenizer.ggml.model", MetadataValue::String("gpt2".into())),
        kv("tokenizer.ggml.pre", MetadataValue::String(pre.into())),
        kv("tokenizer.ggml.tokens", strings(tokens)),
        kv("tokenizer.ggml.token_type", MetadataValue::Array(MetadataArray::I32(types))),
        kv("tokenizer.ggml.merges", strings(merge_texts)),
        kv("tokenizer.ggml.bos_token_id", MetadataValue::U32(bos)),
        kv("tokenizer.ggml.eos_token_id", MetadataValue::U32(bos + 1)),
        kv("tokenizer.ggml.add_bos_token", MetadataValue::Bool(false)),
        kv("tokenizer.chat_template", MetadataValue::String(CHATML.into())),
    ]
}

/// The `tokenizer.*` keys of a SentencePiece vocabulary of exactly `vocab` tokens (at least 263).
pub fn spm_metadata(vocab: usize) -> Vec<(String, MetadataValue)> {
    const SPECIAL: [(&str, i32); 6] =
        [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN), ("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL)];
    let fixed = SPECIAL.len() + 256;
    assert!(vocab > fixed, "a SentencePiece vocabulary needs at least {} tokens", fixed + 1);
    let mut tokens: Vec<String> = SPECIAL.iter().map(|(t, _)| t.to_string()).collect();
    let mut types: Vec<i32> = SPECIAL.iter().map(|&(_, ty)| ty).collect();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([BYTE; 256]);
    // Single characters, then merged pieces, scored in that order (higher merges first).
    let space = "\u{2581}";
    let singles: Vec<String> =
        std::iter::once(space.to_string()).chain(LOWER.chars().chain(UPPER.chars()).chain(DIGITS.chars()).chain(PUNCT.chars()).map(String::from)).collect();
    let n_pieces = vocab - fixed;
    let n_singles = singles.len().min(n_pieces);
    tokens.extend(singles.into_iter().take(n_singles));
    tokens.extend(merges(space, n_pieces - n_singles).into_iter().map(|(a, b)| format!("{a}{b}")));
    types.resize(tokens.len(), NORMAL);
    let mut scores = vec![0.0f32; fixed];
    scores.extend((0..n_pieces).map(|k| -(k as f32)));
    debug_assert_eq!(tokens.len(), vocab);
    vec![
        kv("tokenizer.ggml.model", MetadataValue::String("llama".into())),
        kv("tokenizer.ggml.pre", MetadataValue::String("default".into())),
        kv("tokenizer.ggml.tokens", strings(tokens)),
        kv("tokenizer.ggml.scores", MetadataValue::Array(MetadataArray::F32(scores))),
        kv("tokenizer.ggml.token_type", MetadataValue::Array(MetadataArray::I32(types))),
        kv("tokenizer.ggml.bos_token_id", MetadataValue::U32(2)),
        kv("tokenizer.ggml.eos_token_id", MetadataValue::U32(1)),
        kv("tokenizer.ggml.unknown_token_id", MetadataValue::U32(3)),
        kv("tokenizer.ggml.padding_token_id", MetadataValue::U32(0)),
        kv("tokenizer.ggml.add_bos_token", MetadataValue::Bool(true)),
        kv("tokenizer.ggml.add_eos_token", MetadataValue::Bool(false)),
        kv("tokenizer.ggml.add_space_prefix", MetadataValue::Bool(false)),
        kv("tokenizer.chat_template", MetadataValue::String(GEMMA_TEMPLATE.into())),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use cera::gguf::{GgufBuilder, GgufFile};
    use cera::tokenizer::{DecodeOptions, EncodeOptions, Tokenizer};

    const TEXTS: &[&str] = &["Hello, world!", "The quick brown fox jumps over the lazy dog.", "  spaces\tand\nnewlines 12345 ", "ünïcødé → 日本語 🙂"];

    fn tokenizer(kvs: Vec<(String, MetadataValue)>) -> Tokenizer {
        let mut b = GgufBuilder::new(3);
        for (k, v) in kvs {
            b.kv(&k, v);
        }
        Tokenizer::from_gguf(&GgufFile::from_bytes(b.build()).unwrap()).unwrap()
    }

    fn round_trips(tok: &Tokenizer, vocab: usize) {
        assert_eq!(tok.vocab_size(), vocab);
        for text in TEXTS {
            let ids = tok.encode(text, EncodeOptions { add_special: false, parse_special: false }).unwrap();
            assert!(ids.iter().all(|&i| (i as usize) < vocab));
            let back = tok.decode(&ids, DecodeOptions { render_special: false, strip_space_prefix: false }).unwrap();
            assert_eq!(&back, text, "{ids:?}");
        }
    }

    #[test]
    fn byte_mapping_is_gpt2s() {
        assert_eq!(byte_char(b' '), '\u{120}');
        assert_eq!(byte_char(b'\n'), '\u{10a}');
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!((0..=255u8).map(byte_char).collect::<HashSet<_>>().len(), 256);
    }

    #[test]
    fn bpe_round_trips_and_merges_are_consistent() {
        for vocab in [1024, 49152] {
            let kvs = bpe_metadata(vocab, "llama-bpe");
            let tok = tokenizer(kvs.clone());
            round_trips(&tok, vocab);
            let ids = tok.encode("Hello the world", EncodeOptions { add_special: false, parse_special: false }).unwrap();
            assert!(ids.len() < "Hello the world".len(), "merges apply: {ids:?}");
            assert_eq!(tok.special().bos, Some(vocab as u32 - 4));
            assert!(tok.is_eog(vocab as u32 - 1) && tok.is_eog(vocab as u32 - 3));
        }
    }

    #[test]
    fn spm_round_trips() {
        for vocab in [1024, 262_144] {
            let tok = tokenizer(spm_metadata(vocab));
            round_trips(&tok, vocab);
            assert_eq!((tok.special().bos, tok.special().eos), (Some(2), Some(1)));
            let ids = tok.encode("Hello the world", EncodeOptions { add_special: true, parse_special: false }).unwrap();
            assert_eq!(ids[0], 2);
            assert!(ids.len() < 16, "{ids:?}");
        }
    }
}
