//! Byte-level BPE (GGUF `tokenizer.ggml.model = "gpt2"`: GPT-2, SmolLM2, Qwen, Llama 3).
//!
//! Each pre-tokenized word is byte-level encoded, split into characters, and the adjacent pair
//! with the lowest merge rank (leftmost on ties) is merged until no pair has a rank. The result
//! equals llama.cpp's `llm_tokenizer_bpe_session`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::TokenizerError;
use super::bytes;
use super::pretokenize::PreTokenizer;
use super::vocab::Vocab;

/// BPE merge ranks and the pre-tokenizer.
#[derive(Debug)]
pub struct Bpe {
    /// `"left right"` -> rank (first occurrence wins).
    ranks: HashMap<String, u32>,
    pre: PreTokenizer,
    ignore_merges: bool,
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Bpe {
    /// Builds from `tokenizer.ggml.merges` entries (`"left right"`).
    pub fn new(merges: &[String], pre: PreTokenizer, ignore_merges: bool) -> Result<Bpe, TokenizerError> {
        let mut ranks = HashMap::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let ok = m.as_bytes().iter().skip(1).any(|&b| b == b' ');
            if !ok {
                return Err(TokenizerError::InvalidVocab(format!("merge {i} ({m:?}) has no separating space")));
            }
            ranks.entry(m.clone()).or_insert(i as u32);
        }
        Ok(Bpe { ranks, pre, ignore_merges })
    }

    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> &PreTokenizer {
        &self.pre
    }

    fn rank(&self, key: &mut String, word: &str, a: Sym, b: Sym) -> Option<u32> {
        key.clear();
        key.push_str(&word[a.start..a.start + a.len]);
        key.push(' ');
        key.push_str(&word[b.start..b.start + b.len]);
        self.ranks.get(key.as_str()).copied()
    }

    /// Encodes ordinary text (no special tokens) and appends the ids to `out`.
    pub fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut word = String::new();
        let mut key = String::new();
        for piece in self.pre.split(text)? {
            word.clear();
            bytes::encode_into(piece.as_bytes(), &mut word);
            self.encode_word(vocab, &word, &mut key, out);
        }
        Ok(())
    }

    fn encode_word(&self, vocab: &Vocab, word: &str, key: &mut String, out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(id) = vocab.id(word) {
                out.push(id);
                return;
            }
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(word.len());
        for (i, c) in word.char_indices() {
            let idx = syms.len();
            syms.push(Sym { start: i, len: c.len_utf8(), prev: idx.checked_sub(1), next: None });
            if idx > 0 {
                syms[idx - 1].next = Some(idx);
            }
        }
        // (rank, left, right, combined length); lowest rank first, then leftmost.
        let mut heap: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
        for i in 1..syms.len() {
            if let Some(r) = self.rank(key, word, syms[i - 1], syms[i]) {
                heap.push(Reverse((r, i - 1, i, syms[i - 1].len + syms[i].len)));
            }
        }
        while let Some(Reverse((_, l, r, size))) = heap.pop() {
            let (ls, rs) = (syms[l], syms[r]);
            if ls.len == 0 || rs.len == 0 || ls.len + rs.len != size || ls.next != Some(r) {
                continue;
            }
            syms[l].len += rs.len;
            syms[r].len = 0;
            syms[l].next = rs.next;
            if let Some(n) = rs.next {
                syms[n].prev = Some(l);
            }
            if let Some(p) = syms[l].prev {
                if let Some(rk) = self.rank(key, word, syms[p], syms[l]) {
                    heap.push(Reverse((rk, p, l, syms[p].len + syms[l].len)));
                }
            }
            if let Some(n) = syms[l].next {
                if let Some(rk) = self.rank(key, word, syms[l], syms[n]) {
                    heap.push(Reverse((rk, l, n, syms[l].len + syms[n].len)));
                }
            }
        }
        let mut i = if syms.is_empty() { None } else { Some(0) };
        while let Some(k) = i {
            let s = syms[k];
            let text = &word[s.start..s.start + s.len];
            match vocab.id(text) {
                Some(id) => out.push(id),
                None => {
                    // As llama.cpp: fall back to single-byte tokens where they exist.
                    for b in text.bytes().filter(u8::is_ascii) {
                        let one = [b];
                        if let Some(id) = std::str::from_utf8(&one).ok().and_then(|t| vocab.id(t)) {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_lowest_rank_first() {
        let toks = ["a", "b", "c", "ab", "bc", "abc", "Ġ", "Ġa"].map(String::from).to_vec();
        let vocab = Vocab::new(toks, vec![], vec![]);
        let merges = ["b c", "a b", "a bc", "Ġ a"].map(String::from);
        let bpe = Bpe::new(&merges, PreTokenizer::from_name("gpt-2").unwrap(), false).unwrap();
        let mut out = Vec::new();
        bpe.encode(&vocab, "abc a", &mut out).unwrap();
        assert_eq!(out, vec![5, 7]);
        assert!(Bpe::new(&["ab".to_string()], PreTokenizer::from_name("gpt-2").unwrap(), false).is_err());
    }
}
