//! GPU against CPU parity for the decoder-block ops, at odd sizes. Tolerances: f32 ops use the
//! f32 table (1e-5 relative to max(|want|, rms)); ops with transcendental functions of large
//! arguments (RoPE angles, exp in softmax) or long f32 sums in a different order use 1e-4, stated
//! at each use. Each parity test runs under every GPU profile (`numr::test_gpu_profiles!`: the
//! adapter as it is, uniform-arena parameters, no subgroups), so the kernels' fallback choices are
//! checked too.

use boostr::act::{Act, ActKind, GluInput};
use boostr::attention::{self, AttnOptions, DecodeKernel, DecodePlan, PrefillPlan, QueryLayout};
use boostr::conv::ShortConv;
use boostr::embedding::{GpuEmbedding, embedding_ref};
use boostr::formats::{GgmlType, repack};
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use boostr::norm::{Norm, NormKind};
use boostr::ops_common::OpPlan;
use boostr::ops_common::{OpsError, pseudo_random as rnd};
use boostr::rope::{QkvLayout, QkvRope, RopeParams, RopeScaling, RopeStyle};
use boostr::sampling;
use numr::gpu::{Binding, GpuContext, StepValues};
use numr::testing::{check_close, check_close_rtol, test_gpu};
use numr::{DType, Device, Tensor};

fn up(ctx: &GpuContext, v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Gpu(ctx.clone())).unwrap()
}
fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}
fn close(got: &[f32], want: &[f32], tol: Option<f64>) {
    let r = match tol {
        None => check_close(&f64s(got), &f64s(want), DType::F32),
        Some(t) => check_close_rtol(&f64s(got), &f64s(want), t),
    };
    r.unwrap();
}

fn norms(ctx: &GpuContext) {
    let (rows, n) = (3, 1000);
    let x = rnd(rows * n, 1, 2.0);
    let w = rnd(n, 2, 1.0);
    let b = rnd(n, 3, 0.5);
    let r0 = rnd(rows * n, 4, 1.0);
    for cfg in Norm::all() {
        let res = up(ctx, &r0, &[rows, n]);
        let bt = up(ctx, &b, &[n]);
        let got = cfg
            .run(ctx, &up(ctx, &x, &[rows, n]), &up(ctx, &w, &[n]), cfg.bias.then_some(&bt), cfg.residual.then_some(&res), 1e-6)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let mut rr = r0.clone();
        let want = cfg.reference(&x, &w, cfg.bias.then_some(&b[..]), cfg.residual.then_some(&mut rr[..]), n, 1e-6).unwrap();
        close(&got, &want, None);
        if cfg.residual {
            close(&res.to_vec::<f32>().unwrap(), &rr, None);
        }
    }
    let _ = NormKind::Rms;
}

fn activations(ctx: &GpuContext) {
    let (rows, n) = (5, 333);
    for cfg in Act::all() {
        let w = if cfg.input == GluInput::Packed { 2 * n } else { n };
        let a = rnd(rows * w, 7, 6.0);
        let b = rnd(rows * n, 8, 2.0);
        let bt = up(ctx, &b, &[rows, n]);
        let got = cfg.run(ctx, &up(ctx, &a, &[rows, w]), (cfg.input == GluInput::TwoTensors).then_some(&bt)).unwrap().to_vec::<f32>().unwrap();
        let want = cfg.reference(&a, (cfg.input == GluInput::TwoTensors).then_some(&b[..]), rows, n).unwrap();
        close(&got, &want, None);
    }
    let _ = ActKind::Silu;
}

fn rope_params(hd: usize, rot: usize, style: RopeStyle, scaling: RopeScaling) -> RopeParams {
    RopeParams { head_dim: hd, rot_dim: rot, base: 10000.0, scaling, style }
}

/// Batched QK-norm + RoPE (+ KV write) over a packed QKV buffer with a padded token stride.
fn qk_norm_rope_and_kv_write(ctx: &GpuContext) {
    let llama3 = RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 64 };
    let cases = [
        (64, 64, RopeStyle::Neox, RopeScaling::None, Some(KvDtype::F16), true),
        (128, 96, RopeStyle::Normal, RopeScaling::Linear { factor: 2.0 }, Some(KvDtype::Q8_0), true),
        (256, 256, RopeStyle::Neox, llama3, None, false),
        (64, 32, RopeStyle::Normal, RopeScaling::None, Some(KvDtype::F16), false),
    ];
    for (i, &(hd, rot, style, scaling, kv, norm)) in cases.iter().enumerate() {
        let (n_tok, n_q, n_kv) = (5, 3, 1);
        let mut l = QkvLayout::packed(n_tok, n_q, n_kv, hd);
        l.tok_stride += 7; // padding between tokens
        l.x_off = 3;
        let x0 = rnd(l.x_off + n_tok * l.tok_stride, 10 + i as u64, 1.5);
        let pos: Vec<u32> = vec![0, 9, 3, 40, 17];
        let qw = rnd(hd, 20, 1.0);
        let kw = rnd(hd, 21, 1.0);
        let rp = rope_params(hd, rot, style, scaling);
        let cfg = QkvRope { style, rope: true, qk_norm: norm, norm_offset: i == 0, kv_write: kv };
        let xt = up(ctx, &x0, &[x0.len()]);
        let xb = xt.gpu_binding(4).unwrap().0;
        let (qwt, kwt) = (up(ctx, &qw, &[hd]), up(ctx, &kw, &[hd]));
        let (qb, kb) = (qwt.gpu_binding(4).unwrap().0, kwt.gpu_binding(4).unwrap().0);
        let mut cache = kv.map(|dtype| {
            KvCache::new(ctx, KvCacheConfig { n_layers: 2, n_kv_heads: n_kv, head_dim: hd, capacity: 8, dtype, max_segment_bytes: Some(3 * hd as u64) })
                .unwrap()
        });
        // Two positions already in the cache.
        if let Some(c) = cache.as_mut() {
            c.commit(2).unwrap();
        }
        cfg.run(ctx, &xb, &l, &rp, &pos, norm.then_some(&qb), norm.then_some(&kb), 1e-6, cache.as_ref().map(|c| (c, 1))).unwrap();
        let mut want = x0.clone();
        let (ks, vs) = cfg.reference(&mut want, &l, &rp, &pos, Some(&qw), Some(&kw), 1e-6).unwrap();
        // RoPE angles up to 40 rad: GPU sin/cos differ from f64 by about 1e-6 relative to the angle.
        close(&xt.to_vec::<f32>().unwrap(), &want, Some(1e-4));
        if let Some(c) = cache {
            assert!(c.segment_len() < 8, "the test exercises a split cache");
            let (k, v) = c.read_layer(ctx, 1, 2 + n_tok).unwrap();
            // Slots 2.. hold the chunk; rows are [kv_head][pos][hd] with one kv head.
            let tol = if kv == Some(KvDtype::Q8_0) { 2e-2 } else { 2e-3 };
            close(&k[2 * hd..], &ks, Some(tol));
            close(&v[2 * hd..], &vs, Some(tol));
        }
    }
}

/// Fills a cache for `layer` with `n` random positions through the fused write (no RoPE), and
/// returns the cached K/V as `[n_kv][n][hd]` (rounded as stored).
fn fill(ctx: &GpuContext, cache: &mut KvCache, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let c = *cache.config();
    let (hd, n_kv) = (c.head_dim, c.n_kv_heads);
    let l = QkvLayout { n_tok: n, n_q: 0, n_kv, head_dim: hd, tok_stride: 2 * n_kv * hd, x_off: 0, q_off: 0, k_off: 0, v_off: n_kv * hd };
    let x = rnd(n * l.tok_stride, seed, 1.0);
    let xt = up(ctx, &x, &[x.len()]);
    let cfg = QkvRope { style: RopeStyle::Neox, rope: false, qk_norm: false, norm_offset: false, kv_write: Some(c.dtype) };
    let rp = rope_params(hd, hd, RopeStyle::Neox, RopeScaling::None);
    let pos: Vec<u32> = (0..n as u32).collect();
    cfg.run(ctx, &xt.gpu_binding(4).unwrap().0, &l, &rp, &pos, None, None, 0.0, Some((cache, 0))).unwrap();
    cache.commit(n).unwrap();
    let mut xr = x.clone();
    let (ks, vs) = cfg.reference(&mut xr, &l, &rp, &pos, None, None, 0.0).unwrap();
    // [t][kvh][hd] -> [kvh][t][hd]
    let tr = |a: &[f32]| {
        let mut o = vec![0.0; a.len()];
        for t in 0..n {
            for h in 0..n_kv {
                o[(h * n + t) * hd..][..hd].copy_from_slice(&a[(t * n_kv + h) * hd..][..hd]);
            }
        }
        o
    };
    (tr(&ks), tr(&vs))
}

fn append(k: &mut Vec<f32>, add: &[f32], n_kv: usize, n0: usize, n1: usize, hd: usize) {
    let mut o = Vec::new();
    for h in 0..n_kv {
        o.extend_from_slice(&k[h * n0 * hd..(h + 1) * n0 * hd]);
        o.extend_from_slice(&add[h * n1 * hd..(h + 1) * n1 * hd]);
    }
    *k = o;
}

/// The prefill attention's tolerance where it computes in f32.
const F32_RTOL: f64 = 1e-4;
/// The cooperative-matrix prefill attention's (Q and P in f16), as `attention_prefill_coop.rs`
/// measures it against its float64 reference.
const COOP_RTOL: f64 = 4e-3;

/// Prefill on top of a non-empty cache, GQA, sliding window, soft-capping, split caches, q8.
fn prefill_attention(ctx: &GpuContext) {
    let cases = [
        (64, 4, 2, KvDtype::F16, None, None, None),
        (128, 6, 2, KvDtype::F16, Some(30.0), Some(11), Some(1600u64)),
        (256, 2, 1, KvDtype::Q8_0, None, Some(5), None),
        (64, 3, 3, KvDtype::Q8_0, Some(5.0), None, Some(1200)),
    ];
    for (i, &(hd, n_q, n_kv, dtype, softcap, window, seg)) in cases.iter().enumerate() {
        let cfg = KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity: 80, dtype, max_segment_bytes: seg };
        let mut cache = KvCache::new(ctx, cfg).unwrap();
        let p0 = 23;
        let (mut k, mut v) = fill(ctx, &mut cache, p0, 30 + i as u64);
        let n_tok = 37;
        let (k2, v2) = fill_chunk_check(ctx, &mut cache, n_tok, 40 + i as u64);
        append(&mut k, &k2, n_kv, p0, n_tok, hd);
        append(&mut v, &v2, n_kv, p0, n_tok, hd);
        let q = rnd(n_tok * n_q * hd, 50 + i as u64, 2.0);
        let qt = up(ctx, &q, &[q.len()]);
        let opts = AttnOptions { scale: 1.0 / (hd as f32).sqrt(), softcap, window };
        let ql = QueryLayout { n_tok, n_q, q_off: 0, tok_stride: n_q * hd };
        let want = attention::attention_ref(&q, &k, &v, n_tok, n_q, n_kv, hd, p0 + n_tok, p0, &opts).unwrap();
        let got = attention::prefill(ctx, &qt.gpu_binding(4).unwrap().0, &ql, &cache, 0, p0, &opts).unwrap().to_vec::<f32>().unwrap();
        // The default kernel is the cooperative-matrix one where the adapter, the cache and the
        // options allow it (the H200 here: f16 caches of head size 64 or 128). It rounds Q and the
        // probabilities to f16, so it is held to its own tolerance (attention_prefill_coop.rs);
        // the f32 kernels only sum exp in another order than the f64 reference.
        let coop = PrefillPlan::coop_config(ctx, &cache, 0, n_q, &opts).is_some();
        close(&got, &want, Some(if coop { COOP_RTOL } else { F32_RTOL }));
        // The f32 kernels as well: the subgroup one (the default where there are no cooperative
        // matrices) and the portable tiled one.
        let qb = qt.gpu_binding(4).unwrap().0;
        let mut kernels = vec![DecodeKernel::Tiled];
        if coop && DecodeKernel::best(&boostr::ops_common::env_of(ctx)) == DecodeKernel::Subgroup {
            kernels.push(DecodeKernel::Subgroup);
        }
        for kernel in kernels {
            let plan = PrefillPlan::builder(ctx, &qb, &ql, &cache, 0, &opts).kernel(kernel).build().unwrap();
            plan.run(ctx, &StepValues::chunk(p0 as u32, n_tok as u32)).unwrap();
            close(&plan.out().unwrap().to_vec::<f32>().unwrap(), &want, Some(F32_RTOL));
        }
    }
}

/// Appends `n` positions without committing twice (helper for a second chunk).
fn fill_chunk_check(ctx: &GpuContext, cache: &mut KvCache, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    // `fill` writes at slot `cache.len()`; positions for RoPE are unused (rope off).
    fill(ctx, cache, n, seed)
}

#[allow(clippy::too_many_arguments)]
fn decode_case(ctx: &GpuContext, hd: usize, n_q: usize, n_kv: usize, len: usize, dtype: KvDtype, opts: AttnOptions, seg: Option<u64>) {
    let cfg = KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity: len + 3, dtype, max_segment_bytes: seg };
    let mut cache = KvCache::new(ctx, cfg).unwrap();
    let (k, v) = fill(ctx, &mut cache, len, len as u64);
    let q = rnd(n_q * hd, 99, 2.0);
    let qt = up(ctx, &q, &[q.len()]);
    let want = attention::attention_ref(&q, &k, &v, 1, n_q, n_kv, hd, len, len - 1, &opts).unwrap();
    // The adapter's best kernel (subgroup where it can) and the portable tiled one.
    let best = DecodeKernel::best(&boostr::ops_common::env_of(ctx));
    // Subgroup: the fused merge (one dispatch on an unsegmented cache) and the two-pass path.
    let runs = if best == DecodeKernel::Tiled { vec![(best, false)] } else { vec![(best, false), (best, true), (DecodeKernel::Tiled, false)] };
    for (kind, two_pass) in runs {
        let qb = qt.gpu_binding(4).unwrap().0;
        let b = DecodePlan::builder(ctx, &qb, 0, n_q, &cache, 0, &opts).kernel(kind);
        let plan = if two_pass { b.two_pass() } else { b }.build().unwrap();
        let fused = kind == DecodeKernel::Subgroup && !two_pass && seg.is_none() && attention::fused_merge_supported(ctx);
        assert_eq!(plan.is_fused(), fused);
        let step = DecodePlan::step(len).unwrap();
        let touched = cache.segments(0).unwrap().iter().filter(|s| s.start < len).count();
        assert_eq!(plan.dispatch_count(&step), if fused { 1 } else { touched + 1 }, "{kind:?} two_pass {two_pass}");
        // Three recordings in one stream: the fused arrival counters must reset between uses.
        for _ in 0..3 {
            plan.run(ctx, &step).unwrap();
        }
        let got = plan.out().unwrap().to_vec::<f32>().unwrap();
        // exp and long sums in another order than the f64 reference.
        close(&got, &want, Some(1e-4));
    }
}

fn decode_attention_short(ctx: &GpuContext) {
    for (hd, n_q, n_kv, len, dtype) in
        [(64, 8, 2, 1, KvDtype::F16), (128, 4, 4, 7, KvDtype::F16), (256, 16, 1, 7, KvDtype::Q8_0), (64, 3, 1, 100, KvDtype::Q8_0)]
    {
        decode_case(ctx, hd, n_q, n_kv, len, dtype, AttnOptions::new(hd), None);
    }
    let capped = AttnOptions { scale: 0.1, softcap: Some(20.0), window: Some(33) };
    decode_case(ctx, 128, 4, 2, 150, KvDtype::F16, capped, Some(40 * 2 * 128 * 2));
}

fn decode_attention_long(ctx: &GpuContext) {
    decode_case(ctx, 128, 4, 1, 4096, KvDtype::F16, AttnOptions::new(128), None);
    // 8193 positions over segments of 3000 positions (a split cache).
    decode_case(ctx, 64, 8, 2, 8193, KvDtype::F16, AttnOptions::new(64), Some(3000 * 2 * 64 * 2));
}

#[test]
fn context_overflow_is_typed() {
    let Some(ctx) = test_gpu() else { return };
    let cfg = KvCacheConfig { n_layers: 1, n_kv_heads: 1, head_dim: 64, capacity: 10, dtype: KvDtype::F16, max_segment_bytes: None };
    let mut cache = KvCache::new(&ctx, cfg).unwrap();
    fill(&ctx, &mut cache, 8, 1);
    let l = QkvLayout::packed(3, 1, 1, 64);
    let x = up(&ctx, &rnd(3 * 3 * 64, 2, 1.0), &[3 * 3 * 64]);
    let cfgr = QkvRope { style: RopeStyle::Neox, rope: true, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::F16) };
    let err = cfgr.run(
        &ctx,
        &x.gpu_binding(4).unwrap().0,
        &l,
        &rope_params(64, 64, RopeStyle::Neox, RopeScaling::None),
        &[8, 9, 10],
        None,
        None,
        0.0,
        Some((&cache, 0)),
    );
    assert!(matches!(err, Err(OpsError::ContextOverflow { needed: 11, capacity: 10 })), "{err:?}");
    assert!(matches!(cache.commit(3), Err(OpsError::ContextOverflow { .. })));
    assert_eq!(cache.len(), 8);
}

fn short_conv(ctx: &GpuContext) {
    let ch = 77;
    let conv = ShortConv { kernel: 3 };
    let w = rnd(ch * 3, 3, 1.0);
    let wt = up(ctx, &w, &[ch, 3]);
    let mut state = vec![0.0f32; 4 * ch];
    let s = up(ctx, &state, &[4, ch]);
    // A prefill chunk of 9 tokens, then three decode steps of 1 token (the ring updated in place).
    let mut pos = 0;
    for (step, n_tok) in [9usize, 1, 1, 1].into_iter().enumerate() {
        let bcx = rnd(n_tok * 3 * ch, 100 + step as u64, 1.0);
        let got = conv.run(ctx, &up(ctx, &bcx, &[n_tok, 3 * ch]), &wt, &s, pos).unwrap().to_vec::<f32>().unwrap();
        let want = conv.reference(&bcx, &w, &mut state, pos, n_tok, ch).unwrap();
        close(&got, &want, None);
        close(&s.to_vec::<f32>().unwrap(), &state, None);
        pos += n_tok;
    }
}

fn embedding_gather(ctx: &GpuContext) {
    let (vocab, cols) = (37, 96);
    let vals = rnd(vocab * cols, 5, 3.0);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
        let bytes = quantize(ty, &vals);
        let table = repack(ty, &bytes, vocab, cols).unwrap();
        // Chunks of about 5 rows: a table split across bindings.
        let row_bytes = (table.qs_words_per_block() * table.blocks_per_row() * 4) as u64;
        let emb = GpuEmbedding::new(ctx, &table, Some(5 * row_bytes)).unwrap();
        assert!(emb.n_chunks() > 1);
        let ids = [0u32, 36, 5, 5, 17, 9, 30];
        let got = emb.embed(ctx, &ids, 1.5).unwrap().to_vec::<f32>().unwrap();
        let want = embedding_ref(&table, &ids, 1.5).unwrap();
        close(&got, &want, None);
        assert!(matches!(emb.embed(ctx, &[3, 37], 1.0), Err(OpsError::TokenOutOfRange { id: 37, vocab: 37 })));
    }
}

/// GGUF bytes for `vals` (a simple round-to-nearest quantizer for tests).
fn quantize(ty: GgmlType, vals: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => vals.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => vals.iter().for_each(|v| out.extend(half::f16::from_f32(*v).to_le_bytes())),
        _ => {
            for b in vals.chunks(32) {
                let (mn, mx) = b.iter().fold((f32::MAX, f32::MIN), |(a, c), &v| (a.min(v), c.max(v)));
                let amax = b.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
                let h = |x: f32| half::f16::from_f32(x).to_le_bytes();
                match ty {
                    GgmlType::Q8_0 => {
                        let d = amax / 127.0;
                        out.extend(h(d));
                        b.iter().for_each(|&v| out.push((v / d).round() as i8 as u8));
                    }
                    GgmlType::Q4_0 | GgmlType::Q5_0 => {
                        let (levels, off) = if ty == GgmlType::Q4_0 { (8.0, 8.0) } else { (16.0, 16.0) };
                        let d = amax / levels;
                        out.extend(h(d));
                        let q: Vec<u32> = b.iter().map(|&v| ((v / d).round() + off).clamp(0.0, 2.0 * off - 1.0) as u32).collect();
                        pack(&mut out, &q, ty == GgmlType::Q5_0);
                    }
                    _ => {
                        let levels = if ty == GgmlType::Q4_1 { 15.0 } else { 31.0 };
                        let d = (mx - mn) / levels;
                        out.extend(h(d));
                        out.extend(h(mn));
                        let q: Vec<u32> = b.iter().map(|&v| ((v - mn) / d).round().clamp(0.0, levels) as u32).collect();
                        pack(&mut out, &q, ty == GgmlType::Q5_1);
                    }
                }
            }
        }
    }
    out
}

fn pack(out: &mut Vec<u8>, q: &[u32], five: bool) {
    if five {
        let qh: u32 = q.iter().enumerate().map(|(i, &v)| ((v >> 4) & 1) << i).sum();
        out.extend(qh.to_le_bytes());
    }
    for i in 0..16 {
        out.push(((q[i] & 15) | ((q[i + 16] & 15) << 4)) as u8);
    }
}

fn sampling_ops(ctx: &GpuContext) {
    let n = 50_001;
    let mut logits = rnd(n, 77, 10.0);
    logits[31_337] = 25.0;
    logits[40_000] = 25.0; // tie: the lower index wins
    let t = up(ctx, &logits, &[n]);
    assert_eq!(sampling::argmax(ctx, &t).unwrap(), 31_337);
    let ids = [5u32, 31_337, 7, 5, 49_999];
    sampling::repetition_penalty(ctx, &t, &ids, 1.3).unwrap();
    sampling::repetition_penalty_ref(&mut logits, &ids, 1.3).unwrap();
    close(&t.to_vec::<f32>().unwrap(), &logits, None);
    assert_eq!(sampling::argmax(ctx, &t).unwrap(), 40_000);
    for k in [1, 40, 128] {
        let got = sampling::top_k(ctx, &t, k, 0.7).unwrap();
        let want = sampling::top_k_ref(&logits, k, 0.7).unwrap();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), want.iter().map(|w| w.0).collect::<Vec<_>>(), "k={k}");
        close(&got.iter().map(|g| g.1).collect::<Vec<_>>(), &want.iter().map(|w| w.1).collect::<Vec<_>>(), None);
    }
    assert!(matches!(sampling::repetition_penalty(ctx, &t, &[n as u32], 1.1), Err(OpsError::TokenOutOfRange { .. })));
    let _ = Binding::whole;
}

/// The q8_0 cache rounds exact ties away from zero, as llama.cpp's `quantize_row_q8_0` (`roundf`):
/// with max |x| = 127 the scale is exactly 1, so `x / d` lands on the ties themselves.
fn q8_0_cache_rounds_ties_away_from_zero(ctx: &GpuContext) {
    let hd = 32;
    let mut cache =
        KvCache::new(ctx, KvCacheConfig { n_layers: 1, n_kv_heads: 1, head_dim: hd, capacity: 2, dtype: KvDtype::Q8_0, max_segment_bytes: None }).unwrap();
    let mut row = vec![0.0f32; hd];
    let ties = [127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5, -126.5, 3.25, -0.25];
    row[..ties.len()].copy_from_slice(&ties);
    // One token: K = row, V = -row.
    let l = QkvLayout { n_tok: 1, n_q: 0, n_kv: 1, head_dim: hd, tok_stride: 2 * hd, x_off: 0, q_off: 0, k_off: 0, v_off: hd };
    let x: Vec<f32> = row.iter().copied().chain(row.iter().map(|v| -v)).collect();
    let xt = up(ctx, &x, &[x.len()]);
    let cfg = QkvRope { style: RopeStyle::Neox, rope: false, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::Q8_0) };
    cfg.run(ctx, &xt.gpu_binding(4).unwrap().0, &l, &rope_params(hd, hd, RopeStyle::Neox, RopeScaling::None), &[0], None, None, 0.0, Some((&cache, 0)))
        .unwrap();
    cache.commit(1).unwrap();
    let (k, v) = cache.read_layer(ctx, 0, 1).unwrap();
    let want = [127.0, 3.0, -3.0, 1.0, -1.0, 2.0, -2.0, 127.0, -127.0, 3.0, 0.0];
    assert_eq!(&k[..ties.len()], &want, "K");
    assert_eq!(v[..ties.len()].to_vec(), want.iter().map(|w| -w).collect::<Vec<f32>>(), "V");
    // The CPU model of the cache agrees bit for bit.
    assert_eq!(KvDtype::Q8_0.round_row(&row), k);
}

numr::test_gpu_profiles!(
    norms,
    activations,
    qk_norm_rope_and_kv_write,
    prefill_attention,
    decode_attention_short,
    decode_attention_long,
    short_conv,
    embedding_gather,
    sampling_ops,
    q8_0_cache_rounds_ties_away_from_zero
);
