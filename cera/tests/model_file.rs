//! `ModelFile`/`TensorSource`: the same internal names and shape convention for GGUF and
//! safetensors models.

use cera::fetch::{ModelId, ensure_model};
use cera::gguf::{GgmlType, PerLayer};
use cera::model_file::{ModelFile, TensorDType, TensorSource};
use cera::safetensors::{SafeDType, write_safetensors};
use cera::tokenizer::EncodeOptions;

#[test]
fn gguf_model_file() {
    let path = ensure_model(ModelId::SmolLM2_135M).unwrap();
    let m = ModelFile::open(&path).unwrap();
    assert_eq!(m.format_name(), "GGUF");
    let hp = m.hparams().unwrap();
    assert_eq!((hp.architecture.as_str(), hp.embedding_length, hp.block_count), ("llama", 576, 30));
    assert_eq!((hp.head_count, hp.head_count_kv.clone(), hp.key_length), (9, PerLayer::Uniform(3), 64));
    assert_eq!(hp.rope_freq_base, Some(100000.0));
    let meta = m.tensor_meta("blk.0.attn_k.weight").unwrap();
    assert_eq!(meta.dims, vec![576, 192]);
    assert_eq!(meta.dtype, TensorDType::Ggml(GgmlType::Q4_1));
    assert_eq!(m.tensor_data("blk.0.attn_k.weight").unwrap().len() as u64, 576 * 192 / 32 * 20);
    assert_eq!(m.tensor_names().len(), 272);
    let tok = m.tokenizer().unwrap();
    assert!(m.has_chat_template(&tok));

    let g = ModelFile::open(ensure_model(ModelId::Gemma3_270M).unwrap()).unwrap();
    let hp = g.hparams().unwrap();
    assert_eq!((hp.architecture.as_str(), hp.key_length, hp.sliding_window), ("gemma3", 256, Some(512)));
    let tok = g.tokenizer().unwrap();
    assert!(!g.has_chat_template(&tok));
    let q6 = g.tensors_of_type(GgmlType::Q6_K);
    assert!(!q6.is_empty());
}

trait OfType {
    fn tensors_of_type(&self, t: GgmlType) -> Vec<String>;
}

impl OfType for ModelFile {
    fn tensors_of_type(&self, t: GgmlType) -> Vec<String> {
        self.tensor_names()
            .into_iter()
            .filter(|n| self.tensor_meta(n).is_some_and(|m| m.dtype == TensorDType::Ggml(t)))
            .inspect(|n| assert!(self.tensor_data(n).is_ok()))
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn safetensors_folder_model_file() {
    let dir = std::env::temp_dir().join(format!("cera-hf-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let emb = vec![0u8; 2 * 6 * 4];
    let q = vec![1u8; 2 * 4 * 4];
    let shard1 = write_safetensors(&[("model.embed_tokens.weight", SafeDType::BF16, &[6, 4], &emb)]);
    let shard2 = write_safetensors(&[
        ("model.layers.0.self_attn.q_proj.weight", SafeDType::F16, &[4, 4], &q),
        ("model.layers.0.post_attention_layernorm.weight", SafeDType::F32, &[4], &[0u8; 16]),
    ]);
    std::fs::write(dir.join("model-00001-of-00002.safetensors"), shard1).unwrap();
    std::fs::write(dir.join("model-00002-of-00002.safetensors"), shard2).unwrap();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        br#"{"metadata":{"total_size":80},"weight_map":{
            "model.embed_tokens.weight":"model-00001-of-00002.safetensors",
            "model.layers.0.self_attn.q_proj.weight":"model-00002-of-00002.safetensors",
            "model.layers.0.post_attention_layernorm.weight":"model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("config.json"),
        br#"{"model_type":"gemma3_text","hidden_size":4,"num_hidden_layers":1,"num_attention_heads":1,
            "num_key_value_heads":1,"head_dim":4,"vocab_size":6,"sliding_window":512}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        br#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2},"unk_token":"[UNK]"}}"#,
    )
    .unwrap();
    let m = ModelFile::open(&dir).unwrap();
    assert_eq!(m.format_name(), "safetensors");
    assert_eq!(m.hparams().unwrap().architecture, "gemma3");
    let meta = m.tensor_meta("blk.0.attn_q.weight").unwrap();
    assert_eq!(meta.file_name, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(meta.dims, vec![4, 4]);
    let emb = m.tensor_meta("token_embd.weight").unwrap();
    assert_eq!(emb.dims, vec![4, 6], "ggml order: innermost first");
    assert!(m.tensor_meta("blk.0.post_attention_norm.weight").is_some(), "Gemma post-attention norm");
    assert_eq!(m.tensor_data("blk.0.attn_q.weight").unwrap(), &q[..]);
    let tok = m.tokenizer().unwrap();
    assert_eq!(tok.encode("hello world", EncodeOptions::default()).unwrap(), vec![1, 2]);
    // No template in tokenizer_config.json: the built-in Gemma format.
    let tpl = m.chat_template(&tok).unwrap();
    let text = tpl.render(&[cera::chat_template::ChatMessage::new("user", "hi")], true).unwrap();
    assert_eq!(text, "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n");
    // A single shard opened directly works too.
    let one = ModelFile::open(dir.join("model-00002-of-00002.safetensors")).unwrap();
    assert_eq!(one.tensor_names().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}
