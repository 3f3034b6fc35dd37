//! Pre-tokenizers for byte-level BPE: split text into words before merging, as
//! `tokenizer.ggml.pre` names them.
//!
//! Each pre-tokenizer is a list of regexes applied in turn: every regex splits each piece left by
//! the previous one into its matches and the text between them (llama.cpp's
//! `unicode_regex_split`). The two most common patterns, GPT-2's and Llama 3's, are split by
//! hand-written scanners that follow llama.cpp's own; the others use `fancy-regex`.

use super::TokenizerError;
use super::unicode::{is_letter, is_number, is_whitespace};

/// The GPT-2 word pattern.
pub const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// The Llama 3 word pattern (case-insensitive contractions, numbers in groups of up to three).
pub const LLAMA3_PATTERN: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen 2 word pattern (Llama 3's with single digits).
pub const QWEN2_PATTERN: &str =
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regex list for a `tokenizer.ggml.pre` value, or `None` if it is not supported.
pub fn patterns_for(pre: &str) -> Option<Vec<&'static str>> {
    Some(match pre {
        "default" | "" => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2_PATTERN, r"\p{N}+", "[0-9][0-9][0-9]"],
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
            vec![LLAMA3_PATTERN]
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" => vec![QWEN2_PATTERN],
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais"
        | "trillion" | "granite-docling" => vec![GPT2_PATTERN],
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            vec![r"\p{N}", GPT2_PATTERN]
        }
        _ => return None,
    })
}

/// Whether a pre-tokenizer ignores merges for words that are whole tokens (llama.cpp's
/// `ignore_merges`, set for the Llama 3 family).
pub fn ignores_merges(pre: &str) -> bool {
    matches!(pre, "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2")
}

enum Splitter {
    Gpt2,
    Llama3,
    Regex(Box<fancy_regex::Regex>),
}

/// A compiled pre-tokenizer.
pub struct PreTokenizer {
    name: String,
    splitters: Vec<Splitter>,
}

impl std::fmt::Debug for PreTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreTokenizer").field("name", &self.name).finish()
    }
}

impl PreTokenizer {
    /// The pre-tokenizer `tokenizer.ggml.pre` names.
    pub fn from_name(pre: &str) -> Result<PreTokenizer, TokenizerError> {
        let patterns = patterns_for(pre).ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre.to_string()))?;
        Self::from_patterns(pre, &patterns)
    }

    /// A pre-tokenizer from explicit regexes.
    pub fn from_patterns(name: &str, patterns: &[&str]) -> Result<PreTokenizer, TokenizerError> {
        let splitters = patterns
            .iter()
            .map(|&p| {
                Ok(match p {
                    GPT2_PATTERN => Splitter::Gpt2,
                    LLAMA3_PATTERN => Splitter::Llama3,
                    _ => Splitter::Regex(Box::new(
                        fancy_regex::RegexBuilder::new(p).backtrack_limit(100_000_000).build().map_err(|e| TokenizerError::Regex(e.to_string()))?,
                    )),
                })
            })
            .collect::<Result<_, TokenizerError>>()?;
        Ok(PreTokenizer { name: name.to_string(), splitters })
    }

    /// The name it was built from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Splits `text` into words (slices of `text`, in order, covering it exactly).
    pub fn split<'t>(&self, text: &'t str) -> Result<Vec<&'t str>, TokenizerError> {
        let mut pieces = vec![(0usize, text.len())];
        for s in &self.splitters {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for &(start, end) in &pieces {
                let chunk = &text[start..end];
                let mut bounds = Vec::new();
                match s {
                    Splitter::Gpt2 => split_gpt2(chunk, &mut bounds),
                    Splitter::Llama3 => split_llama3(chunk, &mut bounds),
                    Splitter::Regex(re) => split_regex(re, chunk, &mut bounds)?,
                }
                let mut prev = 0;
                for b in bounds {
                    if b > prev {
                        next.push((start + prev, start + b));
                        prev = b;
                    }
                }
                if prev < chunk.len() {
                    next.push((start + prev, end));
                }
            }
            pieces = next;
        }
        Ok(pieces.into_iter().map(|(s, e)| &text[s..e]).collect())
    }
}

/// Pushes the end offsets of matches and of the gaps between them.
fn split_regex(re: &fancy_regex::Regex, chunk: &str, bounds: &mut Vec<usize>) -> Result<(), TokenizerError> {
    for m in re.find_iter(chunk) {
        let m = m.map_err(|e| TokenizerError::Regex(e.to_string()))?;
        if m.start() == m.end() {
            continue;
        }
        bounds.push(m.start());
        bounds.push(m.end());
    }
    Ok(())
}

/// Code points of a chunk with their byte offsets; index `len` is the end.
struct Cps {
    chars: Vec<char>,
    offs: Vec<usize>,
}

impl Cps {
    fn new(s: &str) -> Cps {
        let mut chars = Vec::with_capacity(s.len());
        let mut offs = Vec::with_capacity(s.len() + 1);
        for (i, c) in s.char_indices() {
            chars.push(c);
            offs.push(i);
        }
        offs.push(s.len());
        Cps { chars, offs }
    }
    fn get(&self, i: usize) -> Option<char> {
        self.chars.get(i).copied()
    }
    fn letter(&self, i: usize) -> bool {
        self.get(i).is_some_and(is_letter)
    }
    fn number(&self, i: usize) -> bool {
        self.get(i).is_some_and(is_number)
    }
    fn space(&self, i: usize) -> bool {
        self.get(i).is_some_and(is_whitespace)
    }
    /// Neither white space, letter nor number (and inside the chunk).
    fn other(&self, i: usize) -> bool {
        self.get(i).is_some_and(|c| !is_whitespace(c) && !is_letter(c) && !is_number(c))
    }
}

/// Number of code points taken by a contraction (`'s`, `'re`, ...) at `pos`, if one starts there.
fn contraction(c: &Cps, pos: usize, fold_case: bool) -> Option<usize> {
    if c.get(pos) != Some('\'') {
        return None;
    }
    let low = |i: usize| c.get(i).map(|ch| if fold_case { ch.to_ascii_lowercase() } else { ch });
    match low(pos + 1) {
        Some('s' | 't' | 'm' | 'd') => return Some(2),
        Some(a) => {
            let b = low(pos + 2);
            if matches!((a, b), ('r', Some('e')) | ('v', Some('e')) | ('l', Some('l'))) {
                return Some(3);
            }
        }
        None => {}
    }
    None
}

/// Whitespace handling shared by both scanners: `\s+(?!\S)` then `\s+`. Returns the new position.
fn whitespace_run(c: &Cps, pos: usize) -> usize {
    let mut n = 0;
    while c.space(pos + n) {
        n += 1;
    }
    if n > 1 && c.get(pos + n).is_some() {
        pos + n - 1
    } else if n > 0 {
        pos + n
    } else {
        pos + 1
    }
}

fn split_gpt2(chunk: &str, bounds: &mut Vec<usize>) {
    let c = Cps::new(chunk);
    let len = c.chars.len();
    let mut pos = 0;
    while pos < len {
        if let Some(n) = contraction(&c, pos, false) {
            pos += n;
            bounds.push(c.offs[pos]);
            continue;
        }
        let sp = usize::from(c.get(pos) == Some(' '));
        let start = pos + sp;
        let end = if c.letter(start) {
            let mut p = start;
            while c.letter(p) {
                p += 1;
            }
            p
        } else if c.number(start) {
            let mut p = start;
            while c.number(p) {
                p += 1;
            }
            p
        } else if c.other(start) {
            let mut p = start;
            while c.other(p) {
                p += 1;
            }
            p
        } else {
            whitespace_run(&c, pos)
        };
        pos = end;
        bounds.push(c.offs[pos]);
    }
}

fn split_llama3(chunk: &str, bounds: &mut Vec<usize>) {
    let c = Cps::new(chunk);
    let len = c.chars.len();
    let mut pos = 0;
    while pos < len {
        if let Some(n) = contraction(&c, pos, true) {
            pos += n;
            bounds.push(c.offs[pos]);
            continue;
        }
        let cpt = c.chars[pos];
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cpt == '\r' || cpt == '\n' || is_number(cpt)) && (is_letter(cpt) || c.letter(pos + 1)) {
            pos += 1;
            while c.letter(pos) {
                pos += 1;
            }
            bounds.push(c.offs[pos]);
            continue;
        }
        // \p{N}{1,3}
        if is_number(cpt) {
            let mut ini = pos;
            while c.number(pos) {
                pos += 1;
                if pos - ini >= 3 {
                    bounds.push(c.offs[pos]);
                    ini = pos;
                }
            }
            bounds.push(c.offs[pos]);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let sp = usize::from(cpt == ' ');
        if c.other(pos + sp) {
            pos += sp;
            while c.other(pos) {
                pos += 1;
            }
            while matches!(c.get(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            bounds.push(c.offs[pos]);
            continue;
        }
        // \s*[\r\n]+
        let mut n = 0;
        let mut last_nl = None;
        while c.space(pos + n) {
            if matches!(c.get(pos + n), Some('\r' | '\n')) {
                last_nl = Some(pos + n + 1);
            }
            n += 1;
        }
        if let Some(end) = last_nl {
            pos = end;
            bounds.push(c.offs[pos]);
            continue;
        }
        pos = whitespace_run(&c, pos);
        bounds.push(c.offs[pos]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        PreTokenizer::from_name(pre).unwrap().split(text).unwrap().into_iter().map(String::from).collect()
    }

    /// The hand-written scanners agree with the regexes they stand for.
    #[test]
    fn scanners_match_regexes() {
        let texts = [
            "Hello world, it's   a test!\n\n  x  \t y",
            "I'VE 12345 apples\r\n\r\n   and 3.14159",
            "  leading and trailing  ",
            "中文 テスト 😀😀 naïve café",
            "a\n\nb\n \n c'll 'RE' 'd",
            "$$$ +++ ===>  ~~~|||",
            " ",
            "\t\t\n",
        ];
        for (pat, scanner) in [(GPT2_PATTERN, "gpt-2"), (LLAMA3_PATTERN, "llama3")] {
            let re = PreTokenizer { name: "re".into(), splitters: vec![Splitter::Regex(Box::new(fancy_regex::Regex::new(pat).unwrap()))] };
            for t in texts {
                let a: Vec<&str> = re.split(t).unwrap();
                assert_eq!(split(scanner, t), a, "{scanner} on {t:?}");
            }
        }
    }

    /// Long runs do not hit the backtracking limit or take quadratic time.
    #[test]
    fn long_runs() {
        let inputs = [" ".repeat(200_000) + "x", "a".repeat(200_000), "\n ".repeat(50_000), "1".repeat(100_000)];
        for pre in ["default", "llama3", "qwen2", "gpt-2", "smollm"] {
            let p = PreTokenizer::from_name(pre).unwrap();
            for t in &inputs {
                let pieces = p.split(t).unwrap();
                assert_eq!(pieces.concat(), *t, "{pre}");
            }
        }
    }

    #[test]
    fn smollm_splits_digits() {
        assert_eq!(split("smollm", "ab 123"), ["ab", " ", "1", "2", "3"]);
        assert_eq!(split("llama3", "1234567"), ["123", "456", "7"]);
        assert!(PreTokenizer::from_name("nope").is_err());
    }
}
