//! Hugging Face `tokenizer.json` tokenizers (for safetensors models), through the `tokenizers`
//! crate. `tokenizer_config.json` beside it supplies the BOS/EOS token names and the chat
//! template.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;

use super::{EncodeOptions, SpecialTokens, TokenizerError, bytes};

/// How single tokens turn into bytes, judged from the tokenizer's decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceStyle {
    /// GPT-2 byte-level characters.
    ByteLevel,
    /// `▁` for spaces and `<0xXX>` byte fallback (SentencePiece converted to tokenizer.json).
    Metaspace,
    /// Anything else: decode the token alone.
    Other,
}

/// A loaded `tokenizer.json`.
pub struct HfTokenizer {
    tok: tokenizers::Tokenizer,
    /// The same tokenizer with special-token parsing turned off, made on first use.
    literal: OnceLock<Option<tokenizers::Tokenizer>>,
    style: PieceStyle,
    prepends_space: bool,
    chat_template: Option<String>,
    bos_text: Option<String>,
    eos_text: Option<String>,
}

fn hf_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Hf(e.to_string())
}

fn guarded<T>(f: impl FnOnce() -> Result<T, TokenizerError>) -> Result<T, TokenizerError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| Err(TokenizerError::Hf("the tokenizers crate panicked".into())))
}

/// `"<s>"` or `{"content": "<s>", ...}`.
fn token_name(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// A chat template given as a string, or as a list of `{name, template}` (the `default` one).
fn chat_template_of(cfg: &Value) -> Option<String> {
    match cfg.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let pick = list.iter().find(|t| t.get("name").and_then(Value::as_str) == Some("default")).or_else(|| list.first())?;
            pick.get("template").and_then(Value::as_str).map(str::to_string)
        }
        _ => None,
    }
}

impl HfTokenizer {
    pub(crate) fn from_file(path: PathBuf) -> Result<(HfTokenizer, SpecialTokens), TokenizerError> {
        let json = std::fs::read(&path).map_err(|source| TokenizerError::Io { path: path.clone(), source })?;
        let cfg_path = path.with_file_name("tokenizer_config.json");
        let cfg = match std::fs::read(&cfg_path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(TokenizerError::Io { path: cfg_path, source });
            }
        };
        Self::from_bytes(&json, cfg.as_deref())
    }

    pub(crate) fn from_bytes(json: &[u8], config: Option<&[u8]>) -> Result<(HfTokenizer, SpecialTokens), TokenizerError> {
        let tok = guarded(|| tokenizers::Tokenizer::from_bytes(json).map_err(hf_err))?;
        let cfg: Value = match config {
            Some(b) => serde_json::from_slice(b).map_err(|e| hf_err(format!("tokenizer_config.json: {e}")))?,
            None => Value::Null,
        };
        let decoder = tok.get_decoder().and_then(|d| serde_json::to_string(d).ok()).unwrap_or_default();
        let style = if decoder.contains("\"ByteLevel\"") {
            PieceStyle::ByteLevel
        } else if decoder.contains("\"ByteFallback\"") || decoder.contains("\"Metaspace\"") || decoder.contains('\u{2581}') {
            PieceStyle::Metaspace
        } else {
            PieceStyle::Other
        };
        let pre = tok.get_pre_tokenizer().and_then(|p| serde_json::to_string(p).ok()).unwrap_or_default();
        let norm = tok.get_normalizer().and_then(|p| serde_json::to_string(p).ok()).unwrap_or_default();
        let prepends_space = style == PieceStyle::Metaspace && (pre.contains("\"Metaspace\"") && !pre.contains("\"never\"") || norm.contains("\"Prepend\""));
        let bos_text = token_name(cfg.get("bos_token"));
        let eos_text = token_name(cfg.get("eos_token"));
        let h = HfTokenizer { literal: OnceLock::new(), style, prepends_space, chat_template: chat_template_of(&cfg), bos_text, eos_text, tok };
        let mut sp = SpecialTokens {
            bos: h.bos_text.as_deref().and_then(|t| h.token_id(t)),
            eos: h.eos_text.as_deref().and_then(|t| h.token_id(t)),
            unk: token_name(cfg.get("unk_token")).and_then(|t| h.token_id(&t)),
            pad: token_name(cfg.get("pad_token")).and_then(|t| h.token_id(&t)),
            ..Default::default()
        };
        // What the post-processor adds tells whether BOS/EOS are added.
        if let Ok(ids) = h.encode("a", EncodeOptions { add_special: true, parse_special: false }) {
            sp.add_bos = sp.bos.is_some() && ids.first() == sp.bos.as_ref();
            sp.add_eos = sp.eos.is_some() && ids.len() > 1 && ids.last() == sp.eos.as_ref();
        }
        sp.eot = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"].iter().find_map(|t| h.token_id(t));
        sp.eom = h.token_id("<|eom_id|>");
        let mut eog: Vec<u32> = [sp.eos, sp.eot, sp.eom].into_iter().flatten().collect();
        eog.extend(["<|endoftext|>", "<|end_of_text|>", "<|return|>"].iter().filter_map(|t| h.token_id(t)));
        eog.sort_unstable();
        eog.dedup();
        sp.eog = eog;
        Ok((h, sp))
    }

    /// The chat template from `tokenizer_config.json`, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The BOS token's text from `tokenizer_config.json`.
    pub fn bos_text(&self) -> Option<&str> {
        self.bos_text.as_deref()
    }

    /// The EOS token's text from `tokenizer_config.json`.
    pub fn eos_text(&self) -> Option<&str> {
        self.eos_text.as_deref()
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.tok.get_vocab_size(true)
    }

    pub(crate) fn adds_space_prefix(&self) -> bool {
        self.prepends_space
    }

    pub(crate) fn token_text(&self, id: u32) -> Option<String> {
        self.tok.id_to_token(id)
    }

    pub(crate) fn token_id(&self, text: &str) -> Option<u32> {
        self.tok.token_to_id(text)
    }

    pub(crate) fn encode(&self, text: &str, opts: EncodeOptions) -> Result<Vec<u32>, TokenizerError> {
        let tok = if opts.parse_special {
            &self.tok
        } else {
            let lit = self.literal.get_or_init(|| {
                let mut t = self.tok.clone();
                t.set_encode_special_tokens(true);
                Some(t)
            });
            lit.as_ref().unwrap_or(&self.tok)
        };
        guarded(|| Ok(tok.encode(text, opts.add_special).map_err(hf_err)?.get_ids().to_vec()))
    }

    pub(crate) fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        guarded(|| self.tok.decode(ids, skip_special).map_err(hf_err))
    }

    fn is_special(&self, id: u32) -> bool {
        self.tok.get_added_tokens_decoder().get(&id).is_some_and(|t| t.special)
    }

    /// The bytes of one token.
    pub(crate) fn piece(&self, id: u32, render_special: bool) -> Result<Vec<u8>, TokenizerError> {
        if self.is_special(id) {
            return Ok(if render_special { self.token_text(id).unwrap_or_default().into_bytes() } else { Vec::new() });
        }
        let Some(text) = self.token_text(id) else {
            return Ok(Vec::new());
        };
        Ok(match self.style {
            PieceStyle::ByteLevel => {
                let mut out = Vec::new();
                bytes::decode_into(&text, &mut out);
                out
            }
            PieceStyle::Metaspace => {
                let byte = text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).and_then(|h| u8::from_str_radix(h, 16).ok());
                match byte {
                    Some(b) if text.len() == 6 => vec![b],
                    _ => text.replace('\u{2581}', " ").into_bytes(),
                }
            }
            PieceStyle::Other => self.decode(&[id], false)?.into_bytes(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{DecodeOptions, Tokenizer};

    /// A byte-level BPE `tokenizer.json` with all 256 byte characters, one merge and `<s>`.
    fn byte_level_json() -> Vec<u8> {
        let mut vocab = serde_json::Map::new();
        vocab.insert("<s>".into(), 0.into());
        for b in 0..=255u8 {
            let mut s = String::new();
            bytes::encode_into(&[b], &mut s);
            vocab.insert(s, (b as u32 + 1).into());
        }
        vocab.insert("Hi".into(), 257.into());
        let bl = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        serde_json::to_vec(&serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
                              "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "vocab": vocab, "merges": ["H i"]}
        }))
        .unwrap()
    }

    #[test]
    fn hf_byte_level_round_trip_and_stream() {
        let cfg = br#"{"bos_token": "<s>", "chat_template": "{{ bos_token }}{{ messages[0].content }}"}"#;
        let tok = Tokenizer::from_hf_bytes(&byte_level_json(), Some(cfg)).unwrap();
        let text = "<s>Hi €!";
        let ids = tok.encode(text, EncodeOptions { add_special: false, parse_special: true }).unwrap();
        assert_eq!(ids[0], 0);
        assert!(ids.contains(&257));
        let literal = tok.encode(text, EncodeOptions { add_special: false, parse_special: false }).unwrap();
        assert_ne!(literal[0], 0, "with parse_special off, <s> is plain text");
        assert_eq!(tok.decode(&ids, DecodeOptions::default()).unwrap(), text);
        let mut s = tok.stream_decoder();
        let mut out = String::new();
        for &id in &ids {
            let part = s.push(id).unwrap();
            assert!(!part.contains('\u{FFFD}'));
            out.push_str(&part);
        }
        out.push_str(&s.finish());
        assert_eq!(out, text);
        assert_eq!(tok.special().bos, Some(0));
        assert_eq!(tok.hf().unwrap().chat_template(), Some("{{ bos_token }}{{ messages[0].content }}"));
        assert!(Tokenizer::from_hf_bytes(b"{not json", None).is_err());
    }
}
