//! A GGUF vocabulary: token texts, scores, token types, and the special-token splitter.

use std::collections::HashMap;

use aho_corasick::AhoCorasick;

/// A token's type, from `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenType {
    /// 0: no type given.
    Undefined,
    /// 1: an ordinary token.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<bos>`, `<|im_start|>`): only produced from text with
    /// `parse_special`, and rendered only when asked.
    Control,
    /// 4: a user-defined token: always matched in text before anything else.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a byte token `<0xXX>` (SentencePiece byte fallback).
    Byte,
}

impl TokenType {
    /// The type for a raw `token_type` value (unknown values are treated as normal).
    pub fn from_raw(v: i64) -> TokenType {
        match v {
            0 => TokenType::Undefined,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}

/// Token attributes as llama.cpp keeps them: a bit set derived from the [`TokenType`] and
/// adjusted by name-based rules (end-of-turn tokens become control tokens, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TokenAttr(pub u16);

impl TokenAttr {
    /// No attribute (type undefined).
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    /// The unknown token.
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    /// An unused slot.
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    /// An ordinary token.
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    /// A control token.
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    /// A user-defined token.
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    /// A byte token.
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);

    /// Whether any of `other`'s bits are set.
    pub fn any(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    /// The union of two sets.
    pub fn with(self, other: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | other.0)
    }

    /// The attributes a token type starts with.
    pub fn from_type(t: TokenType) -> TokenAttr {
        match t {
            TokenType::Undefined => TokenAttr::UNDEFINED,
            TokenType::Normal => TokenAttr::NORMAL,
            TokenType::Unknown => TokenAttr::UNKNOWN,
            TokenType::Control => TokenAttr::CONTROL,
            TokenType::UserDefined => TokenAttr::USER_DEFINED,
            TokenType::Unused => TokenAttr::UNUSED,
            TokenType::Byte => TokenAttr::BYTE,
        }
    }
}

/// A piece of input after special tokens have been split out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Byte range of ordinary text.
    Text(usize, usize),
    /// A special token.
    Token(u32),
}

/// Token texts and properties, with look-up by text.
#[derive(Debug)]
pub struct Vocab {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<TokenType>,
    attrs: Vec<TokenAttr>,
    by_text: HashMap<String, u32>,
    /// Special tokens (control, user-defined, unknown), longest text first.
    specials: Vec<u32>,
    /// Finds which special texts occur in an input, to skip the others quickly.
    special_finder: Option<AhoCorasick>,
}

impl Vocab {
    /// Builds a vocabulary. `scores` and `types` may be empty (all 0.0 / all normal).
    pub fn new(tokens: Vec<String>, scores: Vec<f32>, types: Vec<TokenType>) -> Vocab {
        let n = tokens.len();
        let scores = if scores.len() == n { scores } else { vec![0.0; n] };
        let types = if types.len() == n { types } else { vec![TokenType::Normal; n] };
        let mut by_text = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            // As in llama.cpp, a later duplicate wins.
            by_text.insert(t.clone(), i as u32);
        }
        let attrs = types.iter().map(|&t| TokenAttr::from_type(t)).collect();
        let mut v = Vocab { tokens, scores, types, attrs, by_text, specials: Vec::new(), special_finder: None };
        v.rebuild_specials();
        v
    }

    pub(crate) fn rebuild_specials(&mut self) {
        let special = TokenAttr::CONTROL.with(TokenAttr::USER_DEFINED).with(TokenAttr::UNKNOWN);
        let mut specials: Vec<u32> =
            (0..self.tokens.len() as u32).filter(|&i| self.attrs[i as usize].any(special) && !self.tokens[i as usize].is_empty()).collect();
        specials.sort_by(|&a, &b| self.tokens[b as usize].len().cmp(&self.tokens[a as usize].len()).then(a.cmp(&b)));
        self.special_finder = if specials.is_empty() { None } else { AhoCorasick::new(specials.iter().map(|&i| self.tokens[i as usize].as_bytes())).ok() };
        self.specials = specials;
    }

    /// Changes a token's attributes; call [`Vocab::rebuild_specials`] afterwards.
    pub(crate) fn set_attr(&mut self, id: u32, attr: TokenAttr) {
        if let Some(a) = self.attrs.get_mut(id as usize) {
            *a = attr;
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// A token's text as stored (byte-level or `▁`-escaped).
    pub fn text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// A token's score (SentencePiece log-probability; 0 if none).
    pub fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// A token's type, as stored in the file.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// A token's attributes, after llama.cpp's adjustments.
    pub fn attr(&self, id: u32) -> Option<TokenAttr> {
        self.attrs.get(id as usize).copied()
    }

    /// The id of the token with exactly this text.
    pub fn id(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    /// Splits `text` into ordinary text and special tokens, the way llama.cpp does: each special
    /// token, longest first, splits every remaining text fragment at all its occurrences.
    /// Control and unknown tokens are only matched when `parse_special` is set; user-defined
    /// tokens always are.
    pub(crate) fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(0, text.len())];
        let Some(finder) = &self.special_finder else {
            return frags;
        };
        let mut present = vec![false; self.specials.len()];
        let mut any = false;
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
            any = true;
        }
        if !any {
            return frags;
        }
        for (k, &id) in self.specials.iter().enumerate() {
            if !present[k] {
                continue;
            }
            if !parse_special && self.attrs[id as usize].any(TokenAttr::CONTROL.with(TokenAttr::UNKNOWN)) {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            let mut out = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut start, end) = f else {
                    out.push(f);
                    continue;
                };
                while let Some(i) = text[start..end].find(needle) {
                    let m = start + i;
                    if m > start {
                        out.push(Fragment::Text(start, m));
                    }
                    out.push(Fragment::Token(id));
                    start = m + needle.len();
                }
                if start < end {
                    out.push(Fragment::Text(start, end));
                }
            }
            frags = out;
        }
        frags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_longest_first_and_user_defined_always() {
        let toks = ["a", "<s>", "<s><s>", "##", "b"].map(String::from).to_vec();
        let types = vec![TokenType::Normal, TokenType::Control, TokenType::Control, TokenType::UserDefined, TokenType::Normal];
        let v = Vocab::new(toks, vec![], types);
        let text = "a<s><s><s>b##";
        let f = v.partition(text, true);
        assert_eq!(f, vec![Fragment::Text(0, 1), Fragment::Token(2), Fragment::Token(1), Fragment::Text(10, 11), Fragment::Token(3)]);
        let f = v.partition(text, false);
        assert_eq!(f, vec![Fragment::Text(0, 11), Fragment::Token(3)]);
    }
}
