//! `cargo xtask synth`: synthetic GGUF models with random weights that both cera and llama.cpp
//! load, in the shapes of real models, for load-time, memory and speed tests without
//! downloading anything.
//!
//! ```text
//! cargo xtask synth --arch llama|gemma3|qwen2|qwen3|lfm2 --preset smol-135m|llama-1b|llama-8b|llama-70b|gemma3-270m|qwen3-0.6b|lfm2-1.2b|tiny \
//!     --qtype q4_0|q4_1|q8_0|q4_k|q6_k --out FILE [--seed N]
//! ```
//!
//! - Shapes: [`presets`]. `--arch` decides the tensor set, the metadata keys and the tokenizer
//!   (llama and qwen3: byte-level BPE, pre-tokenizer `llama-bpe` / `qwen2`; gemma3:
//!   SentencePiece, see [`tokenizer`]; qwen3 adds the per-head `attn_q_norm`/`attn_k_norm`;
//!   lfm2 (pre-tokenizer `lfm2`) writes short-conv blocks with F32 random taps on the layers
//!   [`Preset::lfm2_attention`] does not pick, `head_count_kv` per layer (0 on conv blocks),
//!   `shortconv.l_cache = 3` and the final norm as `token_embd_norm`); any preset goes with any
//!   arch.
//! - Storage types, as `llama-quantize` picks them for the file type:
//!   - every 2-D weight is `--qtype`, except
//!   - the LM head (`output.weight`, or the tied `token_embd.weight` when there is no
//!     `output.weight`) is Q6_K when its rows are a multiple of 256 long, else Q8_0; for q8_0 files
//!     it is Q8_0. An untied `token_embd.weight` stays in `--qtype`;
//!   - `q4_k` means Q4_K_M: `attn_v` and `ffn_down` are Q6_K on the layers llama.cpp's
//!     `use_more_bits` picks (`i < n/8`, `i >= 7n/8`, or `(i - n/8) % 3 == 2`), Q4_K elsewhere;
//!   - a K-quant tensor whose rows are not a multiple of 256 long falls back as llama.cpp's does:
//!     Q4_K to Q5_0, Q6_K to Q8_0 (cera and boostr decode both);
//!   - norm weights (every 1-D tensor) are F32, all 1.0 (gemma3's GGUF norm weights already hold
//!     gemma's `1 + w`, so 1.0 is a unit scale there too).
//! - Weights: random quant bytes with block scales set so that each row's RMS is about
//!   `1 / sqrt(row length)` ([`blocks`]); deterministic for a `--seed` (default 0), whatever the
//!   number of threads.
//! - The file is streamed ([`cera::gguf::GgufWriter`]): only the header and a few 32 MiB chunks
//!   are ever in memory.
//! - gemma3: the sliding window is written (`gemma3.attention.sliding_window`); one layer in six
//!   attends globally (layers 5, 11, ...), which cera and llama.cpp both fix for gemma3, so no
//!   key holds it. The local layers' RoPE base is 10000 (written as `rope.freq_base_swa`).

pub mod blocks;
pub mod presets;
pub mod tensors;
pub mod tokenizer;
pub mod write;

#[cfg(test)]
mod golden_tests;
pub mod hf2gguf;
#[cfg(test)]
mod hf_gguf_tests;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cera::gguf::MetadataValue;

pub use presets::{Arch, Preset};
pub use tensors::QType;

/// What to write.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    /// Tensor set, keys and tokenizer.
    pub arch: Arch,
    /// Shapes.
    pub preset: Preset,
    /// File type.
    pub qtype: QType,
    /// PRNG seed.
    pub seed: u64,
    /// Generator threads (default: every core).
    pub threads: Option<usize>,
}

/// The metadata of the model: `general.*`, the architecture's keys, the tokenizer.
pub fn metadata(o: &SynthOptions) -> Vec<(String, MetadataValue)> {
    use MetadataValue::{F32, String as S, U32};
    let p = &o.preset;
    let a = o.arch.name();
    let k = |s: &str| format!("{a}.{s}");
    let u = |x: u64| U32(u32::try_from(x).expect("fits u32"));
    let mut kvs = vec![
        ("general.architecture".to_string(), S(a.into())),
        ("general.name".to_string(), S(format!("synthetic {} {a} {}", p.name, o.qtype))),
        ("general.file_type".to_string(), U32(o.qtype.file_type())),
        ("general.quantization_version".to_string(), U32(2)),
        (k("context_length"), u(p.ctx)),
        (k("embedding_length"), u(p.dim)),
        (k("block_count"), u(p.n_layers)),
        (k("feed_forward_length"), u(p.ffn)),
        (k("attention.head_count"), u(p.n_heads)),
        (k("attention.head_count_kv"), head_count_kv(o)),
        (k("attention.key_length"), u(p.head_dim)),
        (k("attention.value_length"), u(p.head_dim)),
        (k("rope.dimension_count"), u(p.head_dim)),
        (k("rope.freq_base"), F32(p.rope_theta)),
        (k("attention.layer_norm_rms_epsilon"), F32(p.rms_eps)),
        (k("vocab_size"), u(p.vocab)),
    ];
    if o.arch == Arch::Lfm2 {
        kvs.push((k("shortconv.l_cache"), u(tensors::LFM2_CONV_TAPS)));
    }
    if o.arch == Arch::Gemma3 {
        kvs.push((k("attention.sliding_window"), u(p.sliding_window)));
        kvs.push((k("rope.freq_base_swa"), F32(p.rope_local_theta)));
    }
    kvs.extend(match o.arch {
        Arch::Llama => tokenizer::bpe_metadata(p.vocab as usize, "llama-bpe"),
        Arch::Qwen2 | Arch::Qwen3 => tokenizer::bpe_metadata(p.vocab as usize, "qwen2"),
        Arch::Lfm2 => tokenizer::bpe_metadata(p.vocab as usize, "lfm2"),
        Arch::Gemma3 => tokenizer::spm_metadata(p.vocab as usize),
        other => unreachable!("cera's Arch::{other:?} has no synthetic tokenizer: add it to xtask synth"),
    });
    kvs
}

/// `attention.head_count_kv`: one value, or for lfm2 one per layer (0 on the conv blocks, as
/// llama.cpp's converter writes it).
fn head_count_kv(o: &SynthOptions) -> MetadataValue {
    let p = &o.preset;
    if o.arch != Arch::Lfm2 {
        return MetadataValue::U32(p.n_kv_heads as u32);
    }
    let per = (0..p.n_layers).map(|l| if p.lfm2_attention(l) { p.n_kv_heads as u32 } else { 0 }).collect();
    MetadataValue::Array(cera::gguf::MetadataArray::U32(per))
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Written {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Tensors in it.
    pub tensors: usize,
    /// Wall time.
    pub elapsed: Duration,
}

/// Writes the model to `out`.
pub fn synth(o: &SynthOptions, out: &Path) -> std::io::Result<Written> {
    let start = Instant::now();
    let kvs = metadata(o);
    let plan = tensors::plan(o.arch, &o.preset, o.qtype);
    let threads = o.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bytes = write::write_model(out, &kvs, &plan, o.seed, threads)?;
    Ok(Written { path: out.to_path_buf(), bytes, tensors: plan.len(), elapsed: start.elapsed() })
}
