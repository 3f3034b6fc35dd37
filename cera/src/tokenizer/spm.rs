//! SentencePiece-style BPE (GGUF `tokenizer.ggml.model = "llama"`: Llama 2, Gemma).
//!
//! Spaces become `▁`, the text is split into characters, and the adjacent pair whose
//! concatenation is the highest-scoring token (leftmost on ties) is merged until none is left.
//! Characters that are not tokens fall back to `<0xXX>` byte tokens. The result equals
//! llama.cpp's `llm_tokenizer_spm_session`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

/// The SentencePiece word-boundary mark that stands for a space.
pub const SPACE_MARK: &str = "\u{2581}";

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Highest score first, then the leftmost.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then_with(|| o.left.cmp(&self.left)).then_with(|| o.size.cmp(&self.size))
    }
}

/// The id of the byte token for `b` (`<0xXX>`, else the one-byte text), or the unknown token.
pub fn byte_token(vocab: &Vocab, b: u8, unk: Option<u32>) -> Option<u32> {
    let hex = format!("<0x{b:02X}>");
    vocab.id(&hex).or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| vocab.id(s))).or(unk)
}

/// Encodes already escaped text (spaces replaced by `▁`) and appends the ids to `out`.
pub fn encode(vocab: &Vocab, text: &str, unk: Option<u32>, out: &mut Vec<u32>) {
    let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        let idx = syms.len();
        syms.push(Sym { start: i, len: c.len_utf8(), prev: idx.checked_sub(1), next: None });
        if idx > 0 {
            syms[idx - 1].next = Some(idx);
        }
    }
    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<Bigram>, syms: &[Sym], l: usize, r: usize| {
        let (a, b) = (syms[l], syms[r]);
        let piece = &text[a.start..a.start + a.len + b.len];
        if let Some(id) = vocab.id(piece) {
            heap.push(Bigram { score: vocab.score(id), left: l, right: r, size: piece.len() });
        }
    };
    for i in 1..syms.len() {
        try_add(&mut heap, &syms, i - 1, i);
    }
    while let Some(bg) = heap.pop() {
        let (ls, rs) = (syms[bg.left], syms[bg.right]);
        if ls.len == 0 || rs.len == 0 || ls.len + rs.len != bg.size || ls.next != Some(bg.right) {
            continue;
        }
        let l = bg.left;
        syms[l].len += rs.len;
        syms[bg.right].len = 0;
        syms[l].next = rs.next;
        if let Some(n) = rs.next {
            syms[n].prev = Some(l);
        }
        if let Some(p) = syms[l].prev {
            try_add(&mut heap, &syms, p, l);
        }
        if let Some(n) = syms[l].next {
            try_add(&mut heap, &syms, l, n);
        }
    }
    let mut i = if syms.is_empty() { None } else { Some(0) };
    while let Some(k) = i {
        let s = syms[k];
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_token(vocab, b, unk))),
        }
        i = s.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::TokenType;

    #[test]
    fn highest_score_merges_and_byte_fallback() {
        let toks = ["▁", "a", "b", "ab", "▁ab", "<0xE2>", "<0x82>", "<0xAC>", "bb"].map(String::from).to_vec();
        let scores = vec![-1.0, -1.0, -1.0, -0.5, -0.1, 0.0, 0.0, 0.0, -0.2];
        let mut types = vec![TokenType::Normal; 9];
        types[5..8].fill(TokenType::Byte);
        let vocab = Vocab::new(toks, scores, types);
        let mut out = Vec::new();
        encode(&vocab, "▁abb€", None, &mut out);
        // "bb" (-0.2) beats "ab" (-0.5), then "▁a" is no token: ▁, a, bb, then bytes of €.
        assert_eq!(out, vec![0, 1, 8, 5, 6, 7]);
    }
}
