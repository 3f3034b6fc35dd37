//! Batched steps on the tiny random Hugging Face checkpoints of every architecture
//! (`tests/golden/hf/`, transformers' logits and greedy continuations), on the CPU executor and
//! on the GPU (lavapipe in CI; head size 16, which only the paged kernels take on the GPU):
//! - one batched step holding every case's whole prompt (sequences of different lengths in one
//!   step, rows at their own positions through their own block tables, blocks handed out
//!   interleaved) gives each case's last logits within the tolerance of `hf_goldens.rs`;
//! - the batcher's greedy continuations equal transformers' (stopping at its EOS), three
//!   sequences joining at different steps, and each sequence's ids (greedy and seeded) equal
//!   what it gives alone;
//! - the same step wanting top-k candidates or argmaxes gives those of its logits;
//! - a batched step is one submit, and its dispatch count does not grow with the sequences;
//! - on the GPU, the same step with every row through the GEMM split over K gives the same
//!   logits (the partials summed by the RoPE op and the residual norms after the projections).
//!
//! LFM2's short-conv layers run batched on both: each sequence's conv state in its own slot.
//! Speculative decoding (n-gram drafts, mostly rejected on random weights) gives the same greedy
//! ids on every architecture: rejected drafts leave nothing behind, LFM2's conv state included.

mod batch_support;

use std::path::PathBuf;
use std::sync::Arc;

use batch_support::{alone, run_staggered};
use boostr::paged::{BlockAllocator, BlockTable};
use cera::engine::cpu::CpuBackend;
use cera::engine::gpu::GpuBackend;
use cera::engine::{
    Backend, BatchEntry, BatchOpts, BatcherOpts, DeviceChoice, Engine, GenerateOpts, HfModel, KvType, LoadOptions, Speculative, StepOutput, Want,
};
use serde_json::Value;

const MODELS: [&str; 8] = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "lfm2-tiny", "gemma3-tiny", "gemma3-6l-tiny", "llama-tiny-awq", "llama-tiny-gptq"];
/// `hf_goldens.rs`'s tolerances (relative to the row's largest logit): the CPU with an f32 KV
/// cache, the GPU with f16 K/V (f16 activations in the GEMMs where it has cooperative matrices).
const CPU_TOL: f64 = 1e-3;
const GPU_TOL: f64 = 2e-3;
const GPU_TOL_F16_GEMM: f64 = 4e-3;

fn dir(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/hf").join(model)
}

struct Case {
    ids: Vec<u32>,
    generated: Vec<u32>,
    last_logits: Vec<f32>,
}

fn cases(model: &str) -> Vec<Case> {
    let d = dir(model);
    let g: Value = serde_json::from_slice(&std::fs::read(d.join("golden.json")).unwrap()).unwrap();
    let blob = std::fs::read(d.join("logits.bin")).unwrap();
    let all: Vec<f32> = blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let vocab = g["vocab"].as_u64().unwrap() as usize;
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<u32>>();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let (off, n) = (c["logits_offset"].as_u64().unwrap() as usize, c["n_tokens"].as_u64().unwrap() as usize);
            Case { ids: ids(&c["ids"]), generated: ids(&c["generated"]), last_logits: all[off + (n - 1) * vocab..off + n * vocab].to_vec() }
        })
        .collect()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / scale
}

/// Every case's prompt in one batched step (blocks of 4 positions, handed out round-robin so
/// that each sequence's blocks are interleaved with the others'): its last logits against
/// transformers'. Then the same step with one case alone: the same dispatch count, one submit.
/// Returns that count.
fn one_step(b: &dyn Backend, kv: KvType, tol: f64, what: &str) -> usize {
    let cs = cases(what.split(' ').next().unwrap());
    let opts = BatchOpts { kv, block_len: 4, n_blocks: 256, max_tokens: 256, max_seqs: 8, n_ctx: 128 };
    let mut st = b.new_batch(&opts).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut alloc = BlockAllocator::new(opts.n_blocks);
    let mut tables: Vec<BlockTable> = cs.iter().map(|_| BlockTable::new()).collect();
    let longest = cs.iter().map(|c| c.ids.len()).max().unwrap();
    for len in (4..=longest.next_multiple_of(4)).step_by(4) {
        for (t, c) in tables.iter_mut().zip(&cs) {
            t.grow(&mut alloc, 4, len.min(c.ids.len())).unwrap();
        }
    }
    let entries: Vec<BatchEntry> = cs
        .iter()
        .zip(&tables)
        .enumerate()
        .map(|(i, (c, t))| BatchEntry { slot: i, tokens: &c.ids, pos: 0, table: t, want: Want::Logits, decode: false, out_rows: 1, mask: None })
        .collect();
    let outs = st.step(&entries).unwrap_or_else(|e| panic!("{what}: {e}"));
    let many = st.last_step_counters();
    let mut rows = Vec::new();
    for ((c, out), i) in cs.iter().zip(outs).zip(0..) {
        let StepOutput::Logits(l) = out else { panic!("{what}: not logits") };
        let e = rel(&l, &c.last_logits);
        println!("{what} case {i} ({} tokens): relative logit error {e:.2e}", c.ids.len());
        assert!(e <= tol, "{what} case {i}: relative logit error {e:.2e} > {tol:.0e}");
        rows.push(l);
    }
    // The same step again (the same K/V written at the same places), wanting each row's top-k
    // (the GPU's sorted candidates) or its argmax: what the logits above give.
    let wants = [Want::TopK(7), Want::Argmax, Want::TopK(1), Want::TopK(40)];
    let again: Vec<BatchEntry> = entries.iter().enumerate().map(|(i, e)| BatchEntry { want: wants[i % wants.len()], ..*e }).collect();
    let outs = st.step(&again).unwrap_or_else(|e| panic!("{what}: {e}"));
    for (i, (out, l)) in outs.into_iter().zip(&rows).enumerate() {
        let mut order: Vec<u32> = (0..l.len() as u32).collect();
        order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
        match (out, wants[i % wants.len()]) {
            (StepOutput::TopK(got), Want::TopK(k)) => {
                let want: Vec<(u32, f32)> = order[..k].iter().map(|&j| (j, l[j as usize])).collect();
                assert_eq!(got, want, "{what} case {i}: top-{k}");
            }
            (StepOutput::Argmax(id), Want::Argmax) => assert_eq!(id, order[0], "{what} case {i}: argmax"),
            (o, w) => panic!("{what} case {i}: {o:?} for {w:?}"),
        }
    }
    st.step(&entries[..1]).unwrap();
    let one = st.last_step_counters();
    // On the GPU the plan's first dispatches go out in early submits of doubling size.
    assert_eq!(many.submits, one.submits, "{what}: the submits do not grow with the sequences");
    assert!(if b.is_gpu() { one.submits >= 1 && one.submits <= 1 + (one.dispatches / 16 + 1).ilog2() as usize } else { one.submits == 0 }, "{what}: {one:?}");
    assert_eq!(many.dispatches, one.dispatches, "{what}: the dispatches do not grow with the sequences");
    one.dispatches
}

/// Greedy through the batcher: transformers' continuations, three sequences at different
/// steps; each sequence's ids (greedy and seeded) the same alone.
fn batcher(e: &Engine, model: &str, exact: bool) {
    let cs = cases(model);
    let prompts: Vec<Vec<u32>> = cs.iter().map(|c| c.ids.clone()).collect();
    let greedy: Vec<GenerateOpts> = cs.iter().map(|c| GenerateOpts::greedy(c.generated.len())).collect();
    let b = e.batcher(BatcherOpts { block_len: 4, max_seqs: 4, ..BatcherOpts::default() }).unwrap();
    let got = run_staggered(&b, &prompts, &greedy);
    for (i, (g, c)) in got.iter().zip(&cs).enumerate() {
        let mut want = c.generated.clone();
        if g.stop_token.is_some() {
            assert_eq!(g.stop_token, want.pop(), "{model} case {i}: stop token");
        }
        if exact {
            assert_eq!(g.ids, want, "{model} case {i}: greedy continuation");
        } else if g.ids != want {
            println!("{model} case {i}: parts from transformers (f16 GEMMs): {:?} vs {want:?}", g.ids);
        }
        assert_eq!(g.ids, alone(e, &prompts[i], &greedy[i]).ids, "{model} case {i}: alone");
    }
    // Speculative decoding (one-token n-gram drafts, which a random model mostly rejects): the
    // same greedy ids, so rejected drafts leave no trace in the KV blocks or LFM2's conv rings.
    let spec: Vec<GenerateOpts> = greedy
        .iter()
        .map(|o| GenerateOpts {
            speculative: Some(Speculative { draft_max: cera::engine::MAX_DRAFT, draft_min: 1, ngram: 1, adaptive: false, ..Default::default() }),
            ..o.clone()
        })
        .collect();
    let before = b.metrics();
    let fast = run_staggered(&b, &prompts, &spec);
    for (i, (f, g)) in fast.iter().zip(&got).enumerate() {
        assert_eq!(f.ids, g.ids, "{model} case {i}: greedy with speculation");
    }
    let m = b.metrics();
    // LFM2's rollback is the one that needs proving: its prompts repeat tokens, so it drafts
    // (others may end at EOS before any token recurs).
    assert!(model != "lfm2-tiny" || m.drafted_tokens > before.drafted_tokens, "{model}: no drafts were verified");
    println!("{model}: {} of {} drafts accepted", m.accepted_tokens - before.accepted_tokens, m.drafted_tokens - before.drafted_tokens);
    let seeded: Vec<GenerateOpts> =
        (0..cs.len()).map(|i| GenerateOpts::default().with_seed(11 + i as u64).with_temperature(1.5)).map(|o| GenerateOpts { max_tokens: 6, ..o }).collect();
    let got = run_staggered(&b, &prompts, &seeded);
    for i in 0..cs.len() {
        assert_eq!(got[i].ids, alone(e, &prompts[i], &seeded[i]).ids, "{model} case {i}: seeded, alone");
    }
}

fn check(model: &str) {
    let hf = HfModel::open(&dir(model)).unwrap();
    let graph = hf.graph().unwrap();
    let cpu = CpuBackend::load(&graph, &hf, 2, None).unwrap();
    one_step(&cpu, KvType::F32, CPU_TOL, &format!("{model} CPU"));
    let e = Engine::load(dir(model), &LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(128), threads: Some(2), ..Default::default() }, None).unwrap();
    batcher(&e, model, true);
    let Some(ctx) = numr::testing::test_gpu() else { return };
    let gpu = GpuBackend::load(Arc::new(ctx), &graph, &hf, None).unwrap();
    let coop = boostr::quant::QuantGemm::coopmat_available(gpu.context());
    let tol = if coop { GPU_TOL_F16_GEMM } else { GPU_TOL };
    one_step(&gpu, KvType::F16, tol, &format!("{model} GPU"));
    // Every row through the GEMM, split over K in two, the partials summed by the op after each
    // projection (the RoPE op, with its QK norm where the model has one; the residual norms) or
    // by a sum dispatch: the same logits.
    let mut t = cera::engine::GpuTuning::default();
    t.set("batch_gemv_max_seqs", "0").unwrap();
    t.set("batch_split_k", "2").unwrap();
    let mut unsplit = t.clone();
    unsplit.set("batch_split_k", "1").unwrap();
    let plain = GpuBackend::load(gpu.context().clone(), &graph, &hf, None).unwrap().with_tuning(unsplit);
    let plain = one_step(&plain, KvType::F16, tol, &format!("{model} GPU, unsplit GEMMs"));
    let split = one_step(&gpu.with_tuning(t), KvType::F16, tol, &format!("{model} GPU, split GEMMs"));
    // (At least gate/up keeps a sum dispatch of its own.)
    assert!(split > plain, "{model}: {split} dispatches split, {plain} not");
    let e = Engine::load(dir(model), &LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(128), ..Default::default() }, None).unwrap();
    batcher(&e, model, !coop);
}

#[test]
fn llama_tiny() {
    check(MODELS[0]);
}

#[test]
fn qwen2_tiny() {
    check(MODELS[1]);
}

#[test]
fn qwen3_tiny() {
    check(MODELS[2]);
}

#[test]
fn lfm2_tiny() {
    check(MODELS[3]);
}

#[test]
fn gemma3_tiny() {
    check(MODELS[4]);
}

#[test]
fn gemma3_6l_tiny() {
    check(MODELS[5]);
}

#[test]
fn llama_tiny_awq() {
    check(MODELS[6]);
}

#[test]
fn llama_tiny_gptq() {
    check(MODELS[7]);
}

/// `cera bench --concurrency --profile`'s steps on the tiny llama: a decode step of 3 rows, then
/// the same rows beside a 9-token prompt chunk (the prompt lane's GEMMs added: more dispatches,
/// more GPU time), each with its kernels' shares; a CPU engine is refused with the usage error.
#[cfg(feature = "cli")]
#[test]
fn the_step_profile_times_decode_and_prompt_steps() {
    use cera::bench::batch_profile::profile_step;
    if numr::testing::test_gpu().is_none() {
        return;
    }
    let e = Engine::load(dir(MODELS[0]), &LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(128), ..Default::default() }, None).unwrap();
    let opts = BatcherOpts { max_step_tokens: 12, ..BatcherOpts::default() };
    let decode = profile_step(&e, 3, 0, 20, &opts, 8).unwrap();
    let mixed = profile_step(&e, 3, 9, 20, &opts, 8).unwrap();
    for p in [&decode, &mixed] {
        assert!(p.wall_ms > 0.0 && p.gpu_ms > 0.0 && p.dispatches > 0, "{p:?}");
        assert!(!p.kernels.is_empty() && p.kernels.len() <= 8, "{p:?}");
        let share: f64 = p.kernels.iter().map(|k| k.fraction).sum();
        assert!(share > 0.0 && share <= 1.0 + 1e-9, "{p:?}");
    }
    assert_eq!((decode.seqs, decode.prompt_rows, mixed.seqs, mixed.prompt_rows, mixed.depth), (3, 0, 3, 9, 20));
    assert!(mixed.dispatches > decode.dispatches, "{} dispatches with the prompt chunk, {} without", mixed.dispatches, decode.dispatches);
    let cpu = Engine::load(dir(MODELS[0]), &LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(128), ..Default::default() }, None).unwrap();
    let err = profile_step(&cpu, 1, 0, 4, &opts, 8).unwrap_err().to_string();
    assert!(err.contains("needs a GPU run"), "{err}");
}
