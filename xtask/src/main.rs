//! `cargo xtask <command>`: developer tasks.
//!
//! - `bench [--quick]`: the benchmark table (roofline, copy, matmul) on the chosen GPU
//!   (`NUMR_ADAPTER` picks it), printed as markdown for the README.
//! - `bench --kernels [--quick]`: the quantized kernel table (GEMV per format at Llama-3-8B
//!   shapes, GEMM at M = 512), each figure beside the streaming-read roofline of the same run.
//! - `bench --paged [--quick]`: a batched decode step over the paged KV cache (1, 8, 64 sequences;
//!   block lengths 16 and 32) in GB/s of KV read beside the roofline.
//! - `bench --attention [--quick]`: decode attention GB/s of KV read at 4K/32K context (fraction
//!   of the roofline of the same run) and prefill attention TFLOP/s at 2K tokens.
//! - `bench --model FILE... [-p 512] [-n 128] [-r 5] [--profile] [--json] [--vs-llama-cpp DIR]
//!   [--tune KEY=VALUE]... [--diag KEY=VALUE]...`:
//!   the end-to-end table of `cera bench` (see `cera::bench`).
//! - `synth --arch llama|gemma3|qwen2|qwen3|lfm2 --preset smol-135m|llama-1b|llama-8b|llama-70b|gemma3-270m|qwen3-0.6b|tiny
//!   --qtype q4_0|q4_1|q8_0|q4_k|q6_k --out FILE [--seed N]`: a synthetic GGUF model with random
//!   weights in a real model's shapes, quant types chosen as `llama-quantize` chooses them, and a
//!   generated tokenizer of the exact vocabulary size, which cera and llama.cpp both load (see
//!   [`synth`] for the rules).

mod synth;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "Developer tasks for the workspace")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the benchmark table: streaming-read roofline, copy and matmul.
    Bench {
        /// Small sizes and few repetitions (for software adapters).
        #[arg(long)]
        quick: bool,
        /// The quantized kernel table instead (boostr::quant GEMV GB/s and GEMM TFLOP/s, with the
        /// roofline of the same run).
        #[arg(long)]
        kernels: bool,
        /// With --kernels: `gemv` (only the GEMV rows) or `sweep` (GEMV rows plus a sweep of the
        /// integer-dot GEMV configurations) or `probe` (the fixed cost of a GEMV-sized dispatch:
        /// small streaming reads, empty grids, one-copy GEMVs; see `benches::probe`) or `gemm`
        /// (the coopmat GEMM over every candidate block shape) or `prefetch` (dependent chains with
        /// and without an L2 prefetch of the next kernel's weights; see `benches::l2_prefetch`) or
        /// `tall` (every workgroup shape of the integer-dot GEMV at Q4_0 28672x4096) or `rows` (a batched
        /// decode step's projections at 8 to 64 rows: the rows GEMV beside the coopmat GEMM at block
        /// shapes for few rows; see `benches::small_m`).
        #[arg(long, default_value = "")]
        only: String,
        /// The attention table instead (decode GB/s of KV read at 4K/32K beside the roofline of
        /// the same run, prefill TFLOP/s at 2K tokens).
        #[arg(long)]
        attention: bool,
        /// The paged-attention table instead (a batched decode step of 1, 8 and 64 sequences over
        /// the paged cache at block lengths 16 and 32, GB/s of KV read beside the roofline).
        #[arg(long)]
        paged: bool,
        /// The end-to-end table instead (`cera bench`): pp and tg tokens per second of these
        /// model files, the work of a decode step, GB/s against the roofline of the same run.
        #[arg(short = 'm', long = "model", value_name = "FILE")]
        models: Vec<std::path::PathBuf>,
        /// With --model: prompt lengths (comma-separated).
        #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
        n_prompt: Vec<usize>,
        /// With --model: generation lengths (comma-separated).
        #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
        n_gen: Vec<usize>,
        /// With --model: timed runs per test.
        #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
        reps: usize,
        /// With --model: GPU time per kernel of a decode and a prompt step.
        #[arg(long)]
        profile: bool,
        /// With --model: JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// With --model: llama-server's directory, to run the same files through llama.cpp.
        #[arg(long = "vs-llama-cpp", value_name = "DIR")]
        vs_llama_cpp: Option<std::path::PathBuf>,
        /// With --model: sets a field of the GPU plan builder's tuning (`cera::GpuTuning`,
        /// speed only; the keys are `cera::engine::tuning::TUNING_KEYS`); may be repeated.
        #[arg(long = "tune", value_name = "KEY=VALUE", value_parser = tune_setting)]
        tune: Vec<String>,
        /// With --model: for measuring only, a diagnostic switch (`ablate=-NAME,+NAME` makes the
        /// output wrong; `step_trace=1`; `chain_verbose=1`); may be repeated.
        #[arg(long = "diag", value_name = "KEY=VALUE", value_parser = diag_setting)]
        diag: Vec<String>,
    },
    /// Write a synthetic GGUF model (random weights, real shapes) that cera and llama.cpp load.
    Synth {
        /// Tensor set, metadata keys and tokenizer: `llama`, `gemma3`, `qwen2`, `qwen3` or `lfm2`.
        #[arg(long, default_value = "llama")]
        arch: synth::Arch,
        /// Shapes: smol-135m, llama-1b, llama-8b, llama-70b, gemma3-270m, qwen3-0.6b, lfm2-1.2b, tiny.
        #[arg(long)]
        preset: String,
        /// File type: q4_0, q4_1, q8_0, q4_k (Q4_K_M), q6_k.
        #[arg(long)]
        qtype: synth::QType,
        /// The file to write.
        #[arg(long)]
        out: std::path::PathBuf,
        /// PRNG seed (the same seed gives the same bytes).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Generator threads (default: every core).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Write a Hugging Face folder (llama, qwen2, qwen3, lfm2, gemma3; F32/F16/BF16) as GGUF with
    /// llama.cpp's names and conventions (the golden checkpoints' GGUF twins).
    Hf2gguf {
        /// The model folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json).
        #[arg(long)]
        model: std::path::PathBuf,
        /// Output file.
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

/// Checks one `--tune` setting.
fn tune_setting(s: &str) -> Result<String, String> {
    cera::GpuTuning::default().set_pair(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

/// Checks one `--diag` setting.
fn diag_setting(s: &str) -> Result<String, String> {
    cera::engine::Diagnostics::default().set_pair(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match Cli::parse().cmd {
        Cmd::Bench { models, n_prompt, n_gen, reps, profile, json, vs_llama_cpp, tune, diag, .. } if !models.is_empty() => {
            let mut load = cera::LoadOptions::default();
            for s in &tune {
                load.tuning.set_pair(s)?;
            }
            for s in &diag {
                load.measuring_only.set_pair(s)?;
            }
            let opts = cera::bench::BenchOpts { prompts: n_prompt, gens: n_gen, reps, profile, llama_cpp: vs_llama_cpp, load, ..Default::default() };
            let report = cera::bench::run(&models, &opts, &mut |what| eprintln!("bench: {what}"))?;
            println!("{}", if json { cera::bench::print_json(&report) } else { cera::bench::print_table(&report) });
        }
        Cmd::Bench { quick, kernels, only, attention, paged, .. } => {
            let ctx = numr::GpuContext::new()?;
            let rows = if paged {
                benches::paged::paged_table(&ctx, quick)?
            } else if attention {
                benches::attention::attention_table(&ctx, quick)?
            } else if kernels && only == "gemm" {
                benches::quant::gemm_sweep(&ctx, quick)?
            } else if kernels && only == "rows" {
                benches::small_m::rows_sweep(&ctx, quick)?
            } else if kernels && only == "prefetch" {
                benches::l2_prefetch::prefetch_table(&ctx, quick)?
            } else if kernels && only == "tall" {
                benches::tall::tall_sweep(&ctx, quick)?
            } else if kernels && only == "probe" {
                benches::probe::probe_table(&ctx, quick)?
            } else if kernels {
                benches::quant::quant_table(&ctx, quick, &only)?
            } else {
                benches::core_table(&ctx, quick)?
            };
            benches::print_table(&ctx, &rows);
        }
        Cmd::Hf2gguf { model, out } => {
            synth::hf2gguf::convert(&model, &out)?;
            println!("wrote {}", out.display());
        }
        Cmd::Synth { arch, preset, qtype, out, seed, threads } => {
            let preset = synth::Preset::by_name(&preset)?;
            let opts = synth::SynthOptions { arch, preset, qtype, seed, threads };
            let w = synth::synth(&opts, &out)?;
            let secs = w.elapsed.as_secs_f64();
            println!(
                "wrote {} ({} tensors, {:.1} MB) in {secs:.2} s ({:.0} MB/s)",
                w.path.display(),
                w.tensors,
                w.bytes as f64 / 1e6,
                w.bytes as f64 / 1e6 / secs.max(1e-9)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--arch` takes the engine's names, and the file says the same name back.
    #[test]
    fn synth_arch_flag_takes_every_engine_arch_name() {
        for a in cera::engine::Arch::ALL {
            let cli = Cli::try_parse_from(["xtask", "synth", "--arch", a.name(), "--preset", "tiny", "--qtype", "q4_0", "--out", "x.gguf"]).unwrap();
            let Cmd::Synth { arch, .. } = cli.cmd else { panic!("not synth") };
            assert_eq!(arch, a);
            let o = synth::SynthOptions { arch, preset: synth::Preset::by_name("tiny").unwrap(), qtype: synth::QType::Q4_0, seed: 0, threads: None };
            let kvs = synth::metadata(&o);
            let general = kvs.iter().find(|(k, _)| k == "general.architecture").map(|(_, v)| v.clone());
            assert_eq!(general, Some(cera::gguf::MetadataValue::String(a.name().into())));
        }
        assert!(Cli::try_parse_from(["xtask", "synth", "--arch", "mamba", "--preset", "tiny", "--qtype", "q4_0", "--out", "x.gguf"]).is_err());
    }
}
