//! Building a tokenizer from GGUF `tokenizer.ggml.*` metadata, with llama.cpp's defaults, and
//! running it.

use super::bpe::Bpe;
use super::pretokenize::{self, PreTokenizer};
use super::spm::{self, SPACE_MARK};
use super::vocab::{Fragment, TokenAttr, TokenType, Vocab};
use super::{DecodeOptions, EncodeOptions, SpecialTokens, TokenizerError, TokenizerKind, bytes};
use crate::gguf::{Metadata, MetadataError};

/// Texts llama.cpp takes as the end-of-turn token when no `eot_token_id` is given (tried in
/// this order here; llama.cpp's order depends on its hash map).
const EOT_TEXTS: &[&str] =
    &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>"];

/// Fill-in-the-middle token texts (prefix, suffix, middle, pad, repo, separator): llama.cpp makes
/// them control tokens, and pad/repo/separator end generation.
const FIM_TEXTS: [&[&str]; 6] = [
    &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "<|code_prefix|>", "<|prefix|>"],
    &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "<|code_suffix|>", "<|suffix|>"],
    &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "<|code_middle|>", "<|middle|>"],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    &["<|file_sep|>"],
];

/// Texts that end generation whenever they are in the vocabulary (and become control tokens).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
];

/// Tokens llama.cpp always renders (gpt-oss): they become user-defined.
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

enum Model {
    Bpe(Bpe),
    Spm,
}

/// A GGUF tokenizer: vocabulary plus algorithm.
pub(crate) struct GgufTokenizer {
    vocab: Vocab,
    model: Model,
    add_space_prefix: bool,
    pre_name: Option<String>,
}

fn opt_bool(md: &Metadata, key: &str) -> Result<Option<bool>, MetadataError> {
    md.optional(key, Metadata::get_bool)
}

impl GgufTokenizer {
    pub(crate) fn from_metadata(md: &Metadata) -> Result<(GgufTokenizer, SpecialTokens), TokenizerError> {
        let model_name = md.get_str("tokenizer.ggml.model")?;
        let tokens = md.get_string_array("tokenizer.ggml.tokens")?.to_vec();
        let n = tokens.len();
        if n == 0 || n >= u32::MAX as usize {
            return Err(TokenizerError::InvalidVocab(format!("{n} tokens")));
        }
        let scores = match md.optional("tokenizer.ggml.scores", Metadata::get_f32_array)? {
            Some(s) if s.len() != n => {
                return Err(TokenizerError::InvalidVocab(format!("{} scores for {n} tokens", s.len())));
            }
            Some(s) => s.to_vec(),
            None => Vec::new(),
        };
        let types = match md.optional("tokenizer.ggml.token_type", Metadata::get_int_array)? {
            Some(t) if t.len() != n => {
                return Err(TokenizerError::InvalidVocab(format!("{} token types for {n} tokens", t.len())));
            }
            Some(t) => t.into_iter().map(TokenType::from_raw).collect(),
            None => Vec::new(),
        };
        let mut vocab = Vocab::new(tokens, scores, types);

        let (model, mut special, mut add_space_prefix, pre_name) = match model_name {
            "gpt2" => {
                let pre = md.optional("tokenizer.ggml.pre", Metadata::get_str)?.unwrap_or("default");
                let merges = md.get_string_array("tokenizer.ggml.merges")?;
                let bpe = Bpe::new(merges, PreTokenizer::from_name(pre)?, pretokenize::ignores_merges(pre))?;
                let add_bos = pretokenize::ignores_merges(pre) || matches!(pre, "tekken" | "chameleon");
                let special = SpecialTokens { bos: Some(11), eos: Some(11), add_bos, ..Default::default() };
                (Model::Bpe(bpe), special, false, Some(pre.to_string()))
            }
            "llama" => {
                let special = SpecialTokens { bos: Some(1), eos: Some(2), unk: Some(0), add_bos: true, ..Default::default() };
                (Model::Spm, special, true, None)
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };

        // Ids from the metadata override the defaults; ids outside the vocabulary are ignored,
        // as llama.cpp does (with a warning there).
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let read_id = |key: &str, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
            Ok(match md.optional(key, Metadata::get_i64)? {
                Some(v) => match u32::try_from(v) {
                    Ok(v) if (v as usize) < n => Some(v),
                    _ => in_range(default),
                },
                None => in_range(default),
            })
        };
        special.bos = read_id("tokenizer.ggml.bos_token_id", special.bos)?;
        special.eos = read_id("tokenizer.ggml.eos_token_id", special.eos)?;
        special.unk = read_id("tokenizer.ggml.unknown_token_id", special.unk)?;
        special.sep = read_id("tokenizer.ggml.seperator_token_id", None)?;
        special.pad = read_id("tokenizer.ggml.padding_token_id", None)?;
        special.eot = read_id("tokenizer.ggml.eot_token_id", None)?;
        special.eom = read_id("tokenizer.ggml.eom_token_id", None)?;
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_bos_token")? {
            special.add_bos = v;
        }
        if let Some(v) = opt_bool(md, "tokenizer.ggml.add_eos_token")? {
            special.add_eos = v;
        }
        apply_text_rules(&mut vocab, &mut special, |key| read_id(key, None))?;
        let tok = GgufTokenizer { vocab, model, add_space_prefix, pre_name };
        Ok((tok, special))
    }

    pub(crate) fn kind(&self) -> TokenizerKind {
        match self.model {
            Model::Bpe(_) => TokenizerKind::Bpe,
            Model::Spm => TokenizerKind::SentencePiece,
        }
    }

    pub(crate) fn pre_tokenizer(&self) -> Option<&str> {
        self.pre_name.as_deref()
    }

    pub(crate) fn adds_space_prefix(&self) -> bool {
        self.add_space_prefix && matches!(self.model, Model::Spm)
    }

    pub(crate) fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    pub(crate) fn encode(&self, text: &str, opts: EncodeOptions, sp: &SpecialTokens) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        if opts.add_special && sp.add_bos {
            out.extend(sp.bos);
        }
        let frags = self.vocab.partition(text, opts.parse_special);
        match &self.model {
            Model::Bpe(bpe) => {
                for f in frags {
                    match f {
                        Fragment::Text(s, e) => bpe.encode(&self.vocab, &text[s..e], &mut out)?,
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in frags {
                    match f {
                        Fragment::Text(s, e) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push_str(SPACE_MARK);
                            }
                            for c in text[s..e].chars() {
                                if c == ' ' { buf.push_str(SPACE_MARK) } else { buf.push(c) }
                            }
                            spm::encode(&self.vocab, &buf, sp.unk, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
        }
        if opts.add_special && sp.add_eos {
            out.extend(sp.eos);
        }
        Ok(out)
    }

    /// llama.cpp's `token_to_piece` (without its cache).
    pub(crate) fn piece(&self, id: u32, render_special: bool) -> Vec<u8> {
        let (Some(text), Some(attr)) = (self.vocab.text(id), self.vocab.attr(id)) else {
            return Vec::new();
        };
        let special = TokenAttr::CONTROL.with(TokenAttr::UNKNOWN);
        if !render_special && attr.any(special) {
            return Vec::new();
        }
        if attr.any(special.with(TokenAttr::USER_DEFINED)) {
            return text.as_bytes().to_vec();
        }
        match self.model {
            Model::Spm if attr.any(TokenAttr::NORMAL) => text.replace(SPACE_MARK, " ").into_bytes(),
            Model::Spm if attr.any(TokenAttr::BYTE) => parse_byte_token(text).map(|b| vec![b]).unwrap_or_default(),
            Model::Bpe(_) if attr.any(TokenAttr::NORMAL) => {
                let mut out = Vec::with_capacity(text.len());
                bytes::decode_into(text, &mut out);
                out
            }
            _ => Vec::new(),
        }
    }

    pub(crate) fn decode(&self, ids: &[u32], opts: DecodeOptions) -> String {
        let mut out = Vec::new();
        for &id in ids {
            let p = self.piece(id, opts.render_special);
            // The prefix space sits on the first piece that produces text (after an unrendered BOS).
            let strip = out.is_empty() && opts.strip_space_prefix && self.adds_space_prefix() && p.first() == Some(&b' ');
            out.extend_from_slice(if strip { &p[1..] } else { &p });
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The byte of a `<0xXX>` token.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's name-based rules: find EOT/EOM/FIM tokens by text when the metadata does not
/// name them, make end markers control tokens, and collect the end-of-generation set.
fn apply_text_rules(vocab: &mut Vocab, sp: &mut SpecialTokens, read_id: impl Fn(&str) -> Result<Option<u32>, TokenizerError>) -> Result<(), TokenizerError> {
    fn add_control(vocab: &mut Vocab, id: u32) {
        if let Some(a) = vocab.attr(id) {
            vocab.set_attr(id, a.with(TokenAttr::CONTROL));
        }
    }
    if sp.eot.is_none() {
        sp.eot = EOT_TEXTS.iter().find_map(|t| vocab.id(t));
        if let Some(id) = sp.eot {
            add_control(vocab, id);
        }
    }
    if sp.eom.is_none() {
        sp.eom = vocab.id("<|eom_id|>");
        if let Some(id) = sp.eom {
            add_control(vocab, id);
        }
    }
    const FIM_KEYS: [&str; 6] = ["fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"];
    let mut fim = [None; 6];
    for (k, texts) in FIM_TEXTS.iter().enumerate() {
        fim[k] = read_id(&format!("tokenizer.ggml.{}_token_id", FIM_KEYS[k]))?;
        if fim[k].is_none() {
            fim[k] = texts.iter().find_map(|t| vocab.id(t));
            if let Some(id) = fim[k] {
                add_control(vocab, id);
            }
        }
    }
    let mut eog: Vec<u32> = fim[3..].iter().flatten().copied().collect();
    for t in EOG_TEXTS {
        if let Some(id) = vocab.id(t) {
            eog.push(id);
            add_control(vocab, id);
        }
    }
    for t in ALWAYS_RENDERED {
        if let Some(id) = vocab.id(t) {
            vocab.set_attr(id, TokenAttr::USER_DEFINED);
        }
    }
    eog.extend([sp.eos, sp.eot, sp.eom].into_iter().flatten());
    let has = |text: &str, eog: &[u32], vocab: &Vocab| eog.iter().find(|&&i| vocab.text(i) == Some(text)).copied();
    // Harmony (gpt-oss) and solar-open: `<|end|>` is not an end marker there.
    if let Some(end) = has("<|end|>", &eog, vocab) {
        let call = has("<|call|>", &eog, vocab).or(has("<|calls|>", &eog, vocab)).is_some();
        let ret = has("<|return|>", &eog, vocab).or(has("<|flush|>", &eog, vocab)).is_some();
        if call && ret {
            eog.retain(|&i| i != end);
            vocab.set_attr(end, TokenAttr::USER_DEFINED);
        }
    }
    // Gemma 4: `</s>` is text.
    if let (Some(s), Some(_)) = (has("</s>", &eog, vocab), has("<|tool_response>", &eog, vocab)) {
        eog.retain(|&i| i != s);
        vocab.set_attr(s, TokenAttr::NORMAL);
    }
    eog.sort_unstable();
    eog.dedup();
    sp.eog = eog;
    vocab.rebuild_specials();
    Ok(())
}
