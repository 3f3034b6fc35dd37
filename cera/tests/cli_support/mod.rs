//! What the `cera` binary's end-to-end tests share: running the binary, temporary folders, a
//! tiny synthetic GGUF model, and the real SmolLM2 test model with its llama.cpp golden.
//!
//! Each test file that uses it says `mod cli_support;` (not every test file uses every item).

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cera::fetch::{ModelId, ensure_model};
use cera::gguf::{GgmlType, GgufBuilder, MetadataArray, MetadataValue};

/// Runs `cera ARGS` with no standard input: (success, standard output, standard error).
pub fn cera(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cera")).args(args).stdin(Stdio::null()).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Runs `cera ARGS` with `input` as its standard input: (success, standard output, standard error).
pub fn cera_with_stdin(args: &[&str], input: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_cera")).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The child may stop reading early (an error); a broken pipe here is its answer, not ours.
    let _ = stdin.write_all(input.as_bytes());
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// A fresh temporary folder for one test, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(test: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("cera-cli-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}\
                      {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A small GGUF model: a SentencePiece vocabulary (`<unk> <s> </s> ▁ a ▁a`), a ChatML
/// template, and `n_tensors` tiny F32 tensors.
pub fn tiny_model(path: &Path, n_tensors: usize) {
    let mut b = GgufBuilder::new(3);
    b.kv("general.architecture", MetadataValue::String("llama".into()));
    b.kv("general.name", MetadataValue::String("tiny".into()));
    let tokens = ["<unk>", "<s>", "</s>", "▁", "a", "▁a"];
    b.kv("tokenizer.ggml.model", MetadataValue::String("llama".into()));
    b.kv("tokenizer.ggml.tokens", MetadataValue::Array(MetadataArray::String(tokens.iter().map(|s| s.to_string()).collect())));
    b.kv("tokenizer.ggml.scores", MetadataValue::Array(MetadataArray::F32(vec![0.0, 0.0, 0.0, -3.0, -2.0, -1.0])));
    b.kv("tokenizer.ggml.token_type", MetadataValue::Array(MetadataArray::I32(vec![2, 3, 3, 1, 1, 1])));
    b.kv("tokenizer.chat_template", MetadataValue::String(CHATML.into()));
    for i in 0..n_tensors {
        b.tensor(&format!("blk.{i}.attn_norm.weight"), &[4], GgmlType::F32, vec![0u8; 16]);
    }
    std::fs::write(path, b.build()).unwrap();
}

/// Runs `cera` with standard output piped, reads `read` bytes of it (0: none), closes the pipe,
/// and returns the exit status's success and standard error.
pub fn cera_closing_stdout(args: &[&str], read: usize) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cera")).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; read];
    stdout.read_exact(&mut buf).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into())
}

/// The SmolLM2 test model's path.
pub fn smollm2() -> String {
    ensure_model(ModelId::SmolLM2_135M).unwrap().to_str().unwrap().to_string()
}

pub fn golden_chat_single() -> serde_json::Value {
    let path = format!("{}/../tests/golden/generation/smollm2-135m.json", env!("CARGO_MANIFEST_DIR"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"].as_array().unwrap().iter().find(|c| c["name"] == "chat_single").unwrap().clone()
}

pub const GREEDY_CPU: [&str; 6] = ["--device", "cpu", "-n", "8", "--temp", "0"];

/// The Gemma 3 270M test model's path (a base model: no chat template in the file).
pub fn gemma3() -> String {
    ensure_model(ModelId::Gemma3_270M).unwrap().to_str().unwrap().to_string()
}

/// Writes `dst`: the GGUF file `src` with its metadata keys changed by `edit` (added, changed
/// or removed), its tensors as they are, through `cera::gguf`'s reader and streaming writer.
pub fn rewrite_gguf(src: &Path, dst: &Path, edit: impl FnOnce(&mut Vec<(String, MetadataValue)>)) {
    let f = cera::gguf::GgufFile::open(src).unwrap();
    let mut kvs: Vec<(String, MetadataValue)> = f.metadata().iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    edit(&mut kvs);
    let descs: Vec<cera::gguf::TensorDesc> = f.tensors().iter().map(|t| cera::gguf::TensorDesc::new(t.name.clone(), &t.dims, t.ty)).collect();
    let out = std::io::BufWriter::new(std::fs::File::create(dst).unwrap());
    let mut w = cera::gguf::GgufWriter::new(out, f.version(), &kvs, &descs).unwrap();
    for t in f.tensors() {
        w.write_tensor_data(f.tensor_data_raw(&t.name).unwrap()).unwrap();
    }
    w.finish().unwrap();
}

/// Sets (or adds) one metadata key, for [`rewrite_gguf`].
pub fn set_key(kvs: &mut Vec<(String, MetadataValue)>, key: &str, value: MetadataValue) {
    match kvs.iter_mut().find(|(k, _)| k == key) {
        Some(kv) => kv.1 = value,
        None => kvs.push((key.to_string(), value)),
    }
}
