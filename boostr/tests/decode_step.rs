//! A decode step as an engine records it, built from boostr's plans alone: the embedding gathers
//! the id the previous step's argmax left on the GPU, then per layer RMSNorm, the Q/K/V GEMV,
//! RoPE + KV write, flash-decoding attention, the output GEMV, residual + RMSNorm, gate/up GEMV,
//! SwiGLU and the down GEMV; then the final residual + RMSNorm, the LM head and argmax into the id
//! buffer. Everything is built once; the step is recorded 100 times (one submit each) with only
//! the step values changing.
//!
//! Checks: the buffer pool and the bind-group cache do not grow after the first step, and the
//! 100 ids produced on the GPU equal an independent CPU loop's (f64 math over the dequantized
//! weights, K/V rounded through f16 as the cache stores them).

#[path = "formats_util.rs"]
mod util;

use boostr::act::{Act, ActIo, ActKind, ActPlan, GluInput};
use boostr::attention::{AttnOptions, DecodePlan};
use boostr::embedding::{EmbeddingPlan, GpuEmbedding};
use boostr::formats::{GgmlType, PackedWeights};
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use boostr::norm::{Norm, NormIo, NormPlan};
use boostr::ops_common::GpuView;
use boostr::ops_common::OpPlan;
use boostr::quant::{GemvIo, GemvPlan, QuantGemv, QuantMatrix, WeightKind};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopeParams, RopePositions, RopeScaling, RopeStyle};
use boostr::sampling::ArgmaxPlan;
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, Plan, StepValues};
use numr::testing::test_gpu;
use std::sync::Arc;
use util::{Rng, random_ggml};

const V: usize = 96;
const D: usize = 128;
const NQ: usize = 2;
const NKV: usize = 1;
const HD: usize = 64;
const F: usize = 256;
const LAYERS: usize = 2;
const STEPS: usize = 100;
const EPS: f32 = 1e-5;

struct Weights {
    embd: PackedWeights,
    attn_norm: Vec<Vec<f32>>,
    ffn_norm: Vec<Vec<f32>>,
    qkv: Vec<PackedWeights>,
    o: Vec<PackedWeights>,
    gate_up: Vec<PackedWeights>,
    down: Vec<PackedWeights>,
    out_norm: Vec<f32>,
    lm_head: PackedWeights,
}

fn weights() -> Weights {
    let mut rng = Rng(0x5eed_0dec);
    let q8 = GgmlType::Q8_0;
    let norm = |rng: &mut Rng| (0..D).map(|_| rng.f32_in(0.8, 1.2)).collect::<Vec<f32>>();
    let mut w = Weights {
        embd: random_ggml(&mut rng, q8, V, D),
        attn_norm: vec![],
        ffn_norm: vec![],
        qkv: vec![],
        o: vec![],
        gate_up: vec![],
        down: vec![],
        out_norm: vec![],
        lm_head: random_ggml(&mut rng, q8, V, D),
    };
    for _ in 0..LAYERS {
        w.attn_norm.push(norm(&mut rng));
        w.ffn_norm.push(norm(&mut rng));
        w.qkv.push(random_ggml(&mut rng, q8, (NQ + 2 * NKV) * HD, D));
        w.o.push(random_ggml(&mut rng, q8, D, NQ * HD));
        w.gate_up.push(random_ggml(&mut rng, q8, 2 * F, D));
        w.down.push(random_ggml(&mut rng, q8, D, F));
    }
    w.out_norm = norm(&mut rng);
    w
}

fn rope() -> RopeParams {
    RopeParams { head_dim: HD, rot_dim: HD, base: 10000.0, scaling: RopeScaling::None, style: RopeStyle::Normal }
}

// ---------------------------------------------------------------- CPU loop (f64, independent)

fn deq(p: &PackedWeights) -> Vec<f64> {
    (0..p.rows()).flat_map(|r| p.dequantize_row(r).unwrap()).map(|v| v as f64).collect()
}

fn matvec(w: &[f64], x: &[f64], rows: usize) -> Vec<f64> {
    let k = x.len();
    (0..rows).map(|r| w[r * k..(r + 1) * k].iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn rmsnorm(x: &[f64], w: &[f32]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + EPS as f64).sqrt();
    x.iter().zip(w).map(|(v, &wi)| v * inv * wi as f64).collect()
}

fn f16r(x: f64) -> f64 {
    half::f16::from_f64(x).to_f64()
}

/// Greedy ids from `first`, and the smallest top-2 logit gap seen.
fn cpu_loop(w: &Weights, first: u32) -> (Vec<u32>, f64) {
    let embd = deq(&w.embd);
    let lm = deq(&w.lm_head);
    let (qkv, o, gu, down): (Vec<_>, Vec<_>, Vec<_>, Vec<_>) =
        (w.qkv.iter().map(deq).collect(), w.o.iter().map(deq).collect(), w.gate_up.iter().map(deq).collect(), w.down.iter().map(deq).collect());
    let freqs = rope().inv_freqs();
    let mut kc = vec![Vec::<Vec<f64>>::new(); LAYERS];
    let mut vc = vec![Vec::<Vec<f64>>::new(); LAYERS];
    let (mut ids, mut gap) = (vec![first], f64::INFINITY);
    for pos in 0..STEPS {
        let id = *ids.last().unwrap() as usize;
        let mut h: Vec<f64> = embd[id * D..(id + 1) * D].to_vec();
        for l in 0..LAYERS {
            let n = rmsnorm(&h, &w.attn_norm[l]);
            let mut y = matvec(&qkv[l], &n, (NQ + 2 * NKV) * HD);
            for head in 0..NQ + NKV {
                let x = &mut y[head * HD..(head + 1) * HD];
                for (i, &f) in freqs.iter().enumerate() {
                    let th = (pos as f32 * f) as f64;
                    let (s, c) = th.sin_cos();
                    let (a, b) = (x[2 * i], x[2 * i + 1]);
                    x[2 * i] = a * c - b * s;
                    x[2 * i + 1] = a * s + b * c;
                }
            }
            kc[l].push(y[NQ * HD..(NQ + 1) * HD].iter().map(|&v| f16r(v)).collect());
            vc[l].push(y[(NQ + 1) * HD..].iter().map(|&v| f16r(v)).collect());
            let mut att = vec![0.0; NQ * HD];
            for qh in 0..NQ {
                let q = &y[qh * HD..(qh + 1) * HD];
                let s: Vec<f64> = kc[l].iter().map(|k| k.iter().zip(q).map(|(a, b)| a * b).sum::<f64>() / (HD as f64).sqrt()).collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (p, ep) in e.iter().enumerate() {
                    for d in 0..HD {
                        att[qh * HD + d] += ep / z * vc[l][p][d];
                    }
                }
            }
            let delta = matvec(&o[l], &att, D);
            h.iter_mut().zip(&delta).for_each(|(a, b)| *a += b);
            let n = rmsnorm(&h, &w.ffn_norm[l]);
            let g = matvec(&gu[l], &n, 2 * F);
            let act: Vec<f64> = (0..F).map(|i| g[i] / (1.0 + (-g[i]).exp()) * g[F + i]).collect();
            let delta = matvec(&down[l], &act, D);
            h.iter_mut().zip(&delta).for_each(|(a, b)| *a += b);
        }
        let logits = matvec(&lm, &rmsnorm(&h, &w.out_norm), V);
        let mut order: Vec<usize> = (0..V).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        gap = gap.min(logits[order[0]] - logits[order[1]]);
        ids.push(order[0] as u32);
    }
    (ids, gap)
}

// ---------------------------------------------------------------- the GPU step, from plans

fn buf(ctx: &GpuContext, floats: usize) -> Arc<GpuBuffer> {
    let b = ctx.alloc((floats * 4) as u64, BufferKind::Storage).unwrap();
    ctx.write(&b, 0, &vec![0u8; floats * 4]).unwrap();
    b
}

fn upload_f32(ctx: &GpuContext, v: &[f32]) -> GpuView {
    GpuView::whole(&ctx.upload(bytemuck::cast_slice(v)).unwrap())
}

fn gemv(ctx: &GpuContext, w: &PackedWeights, x: &Arc<GpuBuffer>, y: &Arc<GpuBuffer>) -> Plan {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let m = QuantMatrix::upload(ctx, "w", w).unwrap();
    let cfg = QuantGemv { f16_math: false, ..QuantGemv::new(WeightKind::of(w.format()), &env, 1) };
    GemvPlan::new(ctx, &cfg, &m, &GemvIo::new(Binding::whole(x), Binding::whole(y))).unwrap().plan().clone()
}

/// The whole step as one plan, and the id buffer (`ids[0]` = the first token).
fn build(ctx: &GpuContext, w: &Weights, cache: &KvCache) -> (Plan, Arc<GpuBuffer>) {
    let ids = ctx.alloc(((STEPS + 1) * 4) as u64, BufferKind::Storage).unwrap();
    let (res, delta, n, qkv, att, gu, act, logits) =
        (buf(ctx, D), buf(ctx, D), buf(ctx, D), buf(ctx, (NQ + 2 * NKV) * HD), buf(ctx, NQ * HD), buf(ctx, 2 * F), buf(ctx, F), buf(ctx, V));
    let mut plan = Plan::new();
    let table = GpuEmbedding::new(ctx, &w.embd, None).unwrap();
    plan.append(EmbeddingPlan::new(ctx, &table, &GpuView::whole(&ids), 1, 1.0, Some(GpuView::whole(&res))).unwrap().plan());
    let norm = |x: &Arc<GpuBuffer>, wv: &[f32], residual: bool| {
        let io = NormIo {
            x: GpuView::whole(if residual { &delta } else { x }),
            w: upload_f32(ctx, wv),
            b: None,
            residual: residual.then(|| GpuView::whole(&res)),
            out: Some(GpuView::whole(&n)),
        };
        NormPlan::new(ctx, &Norm { residual, ..Norm::rms() }, &io, D, 1, EPS).unwrap().plan().clone()
    };
    let layout = QkvLayout::packed(1, NQ, NKV, HD);
    let rope_cfg = QkvRope { style: RopeStyle::Normal, rope: true, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::F16) };
    let rp = rope();
    for l in 0..LAYERS {
        // Layer 0 normalises the embedding itself; later layers first add the last FFN delta.
        plan.append(&norm(&res, &w.attn_norm[l], l > 0));
        plan.append(&gemv(ctx, &w.qkv[l], &n, &qkv));
        let qb = Binding::whole(&qkv);
        let inputs = QkvRopeInputs { x: &qb, layout, rope: &rp, positions: &RopePositions::Step, qw: None, kw: None, eps: EPS, cache: Some((cache, l)) };
        plan.append(QkvRopePlan::new(ctx, &rope_cfg, &inputs).unwrap().plan());
        let ab = Binding::whole(&att);
        let attn = DecodePlan::builder(ctx, &qb, 0, NQ, cache, l, &AttnOptions::new(HD)).output(&ab, 0).build().unwrap();
        plan.append(attn.plan());
        plan.append(&gemv(ctx, &w.o[l], &att, &delta));
        plan.append(&norm(&res, &w.ffn_norm[l], true));
        plan.append(&gemv(ctx, &w.gate_up[l], &n, &gu));
        let glu = Act { kind: ActKind::Silu, input: GluInput::Packed };
        plan.append(ActPlan::new(ctx, &glu, &ActIo { a: GpuView::whole(&gu), b: None, out: Some(GpuView::whole(&act)) }, F, 1).unwrap().plan());
        plan.append(&gemv(ctx, &w.down[l], &act, &delta));
    }
    plan.append(&norm(&res, &w.out_norm, true));
    plan.append(&gemv(ctx, &w.lm_head, &n, &logits));
    // Argmax writes ids[token + 1]: the next step's embedding input, never leaving the GPU.
    let next = GpuView::new(Binding::whole(&ids), 1);
    plan.append(ArgmaxPlan::new(ctx, &GpuView::whole(&logits), V, Some(next), STEPS).unwrap().plan());
    (plan, ids)
}

#[test]
fn hundred_decode_steps_from_plans_match_the_cpu_and_allocate_nothing() {
    let Some(ctx) = test_gpu() else { return };
    let w = weights();
    let first = 7u32;
    let (want, gap) = cpu_loop(&w, first);
    assert!(gap > 1e-3, "the CPU loop has a near tie ({gap}); pick another seed");
    let cfg = KvCacheConfig { n_layers: LAYERS, n_kv_heads: NKV, head_dim: HD, capacity: STEPS, dtype: KvDtype::F16, max_segment_bytes: None };
    let cache = KvCache::new(&ctx, cfg).unwrap();
    let (plan, ids) = build(&ctx, &w, &cache);
    ctx.write(&ids, 0, &first.to_le_bytes()).unwrap();
    let per_step = plan.dispatch_count(&StepValues::decode(0));
    let mut after_first = None;
    for t in 0..STEPS as u32 {
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &StepValues::decode(t).with_token(t)).unwrap();
        rec.submit().unwrap();
        if t == 0 {
            after_first = Some((ctx.pool_stats().created, ctx.bind_groups_created()));
        }
    }
    let counters = (ctx.pool_stats().created, ctx.bind_groups_created());
    assert_eq!(Some(counters), after_first, "the decode loop created buffers or bind groups after its first step");
    let got: Vec<u32> = bytemuck::cast_slice(&ctx.read_bytes(&ids, 0, ((STEPS + 1) * 4) as u64).unwrap()).to_vec();
    println!("decode step: {per_step} dispatches for {LAYERS} layers; smallest CPU top-2 gap {gap:.4}");
    assert_eq!(got, want, "GPU ids vs the CPU loop");
}
