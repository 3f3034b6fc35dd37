//! Entry points shared by the cargo-fuzz targets in `fuzz/` and the seeded mutation tests in
//! `cera/tests/mutation_fuzz.rs`: each takes arbitrary bytes and exercises every reader on them.
//! They must never panic, hang or allocate without bound; errors are expected and ignored.

use crate::gguf::{GgmlType, GgufBuilder, GgufFile, MetadataArray, MetadataValue};
use crate::model_file::TensorSource;
use crate::safetensors::{SafeDType, SafetensorsModel, write_safetensors};
use crate::tokenizer::{EncodeOptions, Tokenizer};

/// Parses `data` as GGUF and, if that works, reads every tensor, the hyperparameters, the
/// tokenizer (encoding and decoding a short text) and the chat template.
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for name in TensorSource::tensor_names(&file) {
        let _ = TensorSource::tensor_data(&file, name);
        let _ = file.tensor_data_raw(name);
    }
    let _ = file.hparams();
    if let Ok(tok) = Tokenizer::from_gguf(&file) {
        for opts in [EncodeOptions::default(), EncodeOptions { add_special: true, parse_special: true }] {
            if let Ok(ids) = tok.encode("Hello world <s> 12345 \u{1F600}\n\n  x", opts) {
                let _ = tok.decode(&ids, Default::default());
                let mut s = tok.stream_decoder();
                for id in ids {
                    let _ = s.push(id);
                }
                let _ = s.finish();
            }
        }
        if let Ok(t) = crate::chat_template::ChatTemplate::from_gguf(&file, &tok) {
            let _ = t.render(&[crate::chat_template::ChatMessage::new("user", "hi")], true);
        }
    }
}

/// Parses `data` as a single safetensors file and reads every tensor (and, on the side, as a
/// `config.json`).
pub fn safetensors(data: &[u8]) {
    let _ = crate::safetensors::HfConfig::parse(data);
    let Ok(m) = SafetensorsModel::from_bytes(data.to_vec(), None) else {
        return;
    };
    let names: Vec<String> = m.tensor_names().map(str::to_string).collect();
    for n in &names {
        let _ = m.tensor_data(n);
        let _ = m.tensor_data_raw(n);
    }
}

/// A small valid GGUF with every metadata type, nested arrays, a BPE tokenizer, a chat template
/// and tensors of several types: the seed for mutation fuzzing.
pub fn seed_gguf() -> Vec<u8> {
    let mut b = GgufBuilder::new(3);
    let s = |v: &str| MetadataValue::String(v.to_string());
    b.kv("general.architecture", s("llama"));
    b.kv("general.alignment", MetadataValue::U32(32));
    b.kv("llama.embedding_length", MetadataValue::U32(64));
    b.kv("llama.block_count", MetadataValue::U32(1));
    b.kv("llama.attention.head_count", MetadataValue::U32(4));
    b.kv("llama.attention.head_count_kv", MetadataValue::Array(MetadataArray::U32(vec![2])));
    b.kv("llama.rope.freq_base", MetadataValue::F32(10000.0));
    b.kv("llama.attention.layer_norm_rms_epsilon", MetadataValue::F64(1e-5));
    b.kv("x.u8", MetadataValue::U8(1));
    b.kv("x.i8", MetadataValue::I8(-1));
    b.kv("x.u16", MetadataValue::U16(2));
    b.kv("x.i16", MetadataValue::I16(-2));
    b.kv("x.i32", MetadataValue::I32(-3));
    b.kv("x.u64", MetadataValue::U64(4));
    b.kv("x.i64", MetadataValue::I64(-5));
    b.kv("x.bool", MetadataValue::Bool(true));
    b.kv(
        "x.nested",
        MetadataValue::Array(MetadataArray::Array(vec![
            MetadataArray::String(vec!["a".into(), "b".into()]),
            MetadataArray::Array(vec![MetadataArray::I64(vec![1, 2])]),
        ])),
    );
    let tokens: Vec<String> = ["<s>", "</s>", "H", "e", "l", "o", "He", "ll", "Ġ", "w", "Ġw", "1", "Ċ"].iter().map(|t| t.to_string()).collect();
    let n = tokens.len();
    b.kv("tokenizer.ggml.model", s("gpt2"));
    b.kv("tokenizer.ggml.pre", s("llama3"));
    b.kv("tokenizer.ggml.tokens", MetadataValue::Array(MetadataArray::String(tokens)));
    let mut types = vec![1i32; n];
    types[0] = 3;
    types[1] = 3;
    b.kv("tokenizer.ggml.token_type", MetadataValue::Array(MetadataArray::I32(types)));
    b.kv("tokenizer.ggml.merges", MetadataValue::Array(MetadataArray::String(vec!["H e".into(), "l l".into(), "Ġ w".into()])));
    b.kv("tokenizer.ggml.bos_token_id", MetadataValue::U32(0));
    b.kv("tokenizer.ggml.eos_token_id", MetadataValue::U32(1));
    b.kv("tokenizer.ggml.add_bos_token", MetadataValue::Bool(true));
    b.kv("tokenizer.chat_template", s("{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"));
    b.tensor("token_embd.weight", &[32, 2], GgmlType::Q4_0, vec![7u8; 36]);
    b.tensor("blk.0.attn_norm.weight", &[4], GgmlType::F32, vec![1u8; 16]);
    b.tensor("blk.0.ffn_up.weight", &[256], GgmlType::Q4_K, vec![3u8; 144]);
    b.tensor("blk.0.iq", &[256], GgmlType::IQ2_XXS, vec![0u8; 66]);
    b.build()
}

/// A small valid safetensors file: the seed for mutation fuzzing.
pub fn seed_safetensors() -> Vec<u8> {
    write_safetensors(&[
        ("model.embed_tokens.weight", SafeDType::F16, &[4, 2], &[1u8; 16]),
        ("model.layers.0.self_attn.q_proj.qweight", SafeDType::I32, &[2, 1], &[2u8; 8]),
        ("model.norm.weight", SafeDType::BF16, &[2], &[3u8; 4]),
        ("extra", SafeDType::F64, &[1], &[0u8; 8]),
    ])
}
