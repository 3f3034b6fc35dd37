//! The cooperative-matrix prefill attention ([`PrefillAttnCoop`]) against the f64 reference:
//! GQA groups of 1 to 4, head_dim 64 and 128, chunks on top of a non-empty cache, a sliding
//! window, scores large enough that the lazy rescale fires again and again, and several steps
//! of one plan. Which kernel the default plan picks is asserted too (the coopmat one only where
//! the adapter, the cache and the options allow). Runs where the adapter has f16 16x16x16
//! cooperative matrices with subgroups of 32 (the H200); elsewhere it says so and checks only
//! the fallback choice.

use boostr::attention::{self, AttnOptions, DecodeKernel, PrefillPlan, QueryLayout};
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use boostr::ops_common::{OpPlan, pseudo_random as rnd};
use numr::gpu::{Binding, GpuContext, StepValues};
use numr::testing::{check_close_rtol, test_gpu};

/// Q and P are f16 in the kernel (P below 2^8 relative to the running max), K and V are f16 in
/// the cache already: about 11 bits of each product.
const RTOL: f64 = 4e-3;

/// A cache of `len` random positions written as f16 rows; returns K and V as the reference
/// reads them (`[kv_head][pos][hd]`, the f16-rounded values).
fn filled(ctx: &GpuContext, cfg: KvCacheConfig, len: usize, seed: u64, amp: f32) -> (KvCache, Vec<f32>, Vec<f32>) {
    let mut cache = KvCache::new(ctx, cfg).unwrap();
    let (hd, n_kv, cap) = (cfg.head_dim, cfg.n_kv_heads, cfg.capacity);
    let mut refs = Vec::new();
    for (i, buf) in ["k", "v"].iter().enumerate() {
        let vals = rnd(n_kv * len * hd, seed + i as u64, amp);
        let mut words = vec![half::f16::ZERO; n_kv * cap * hd];
        let mut r = Vec::with_capacity(vals.len());
        for h in 0..n_kv {
            for t in 0..len {
                for d in 0..hd {
                    let x = half::f16::from_f32(vals[(h * len + t) * hd + d]);
                    words[(h * cap + t) * hd + d] = x;
                    r.push(x.to_f32());
                }
            }
        }
        let seg = &cache.segments(0).unwrap()[0];
        let target = if *buf == "k" { &seg.k } else { &seg.v };
        ctx.write(target, 0, bytemuck::cast_slice(&words)).unwrap();
        refs.push(r);
    }
    cache.commit(len).unwrap();
    let v = refs.pop().unwrap();
    let k = refs.pop().unwrap();
    (cache, k, v)
}

fn cfg(hd: usize, n_kv: usize, capacity: usize, dtype: KvDtype) -> KvCacheConfig {
    KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity, dtype, max_segment_bytes: None }
}

/// The keys `0 .. kv_len` of a `[kv_head][len][hd]` array.
fn prefix(a: &[f32], n_kv: usize, len: usize, kv_len: usize, hd: usize) -> Vec<f32> {
    (0..n_kv).flat_map(|h| a[h * len * hd..][..kv_len * hd].to_vec()).collect()
}

#[test]
fn coop_prefill_matches_reference() {
    let Some(ctx) = test_gpu() else { return };
    let probe = filled(&ctx, cfg(128, 8, 256, KvDtype::F16), 1, 1, 1.0).0;
    let opts = AttnOptions { scale: 1.0 / 128f32.sqrt(), softcap: None, window: None };
    if PrefillPlan::coop_config(&ctx, &probe, 0, 32, &opts).is_none() {
        numr::testing::skip_path(&ctx, "the cooperative-matrix prefill attention kernel", "no f16 16x16x16 cooperative matrices with subgroups of 32");
        return;
    }
    // (head_dim, n_q, n_kv, p0, n_tok, window, q amplitude)
    let cases = [
        (128, 32, 8, 0, 100, None, 2.0),
        (64, 9, 3, 37, 50, None, 2.0),
        (128, 16, 8, 5, 33, Some(20), 2.0),
        (64, 4, 4, 130, 17, None, 2.0),
        (128, 8, 2, 60, 70, None, 12.0),
        (64, 6, 3, 0, 64, Some(7), 12.0),
        // Up to the cache's end: the last tile's rows past it are clamped.
        (128, 8, 2, 150, 50, None, 2.0),
        (64, 4, 1, 170, 30, Some(40), 2.0),
    ];
    for (i, &(hd, n_q, n_kv, p0, n_tok, window, amp)) in cases.iter().enumerate() {
        // Not a multiple of any key tile.
        let cap = 200;
        let len = p0 + n_tok;
        let (cache, k, v) = filled(&ctx, cfg(hd, n_kv, cap, KvDtype::F16), len, 10 + 2 * i as u64, 1.0);
        let opts = AttnOptions { scale: 1.0 / (hd as f32).sqrt(), softcap: None, window };
        // Queries inside a packed row (offset and stride as the engine's QKV slot has them).
        let stride = (n_q + 2 * n_kv) * hd;
        let q = rnd(n_tok * stride, 90 + i as u64, amp);
        let qb = ctx.upload(bytemuck::cast_slice(&q)).unwrap();
        let ql = QueryLayout { n_tok, n_q, q_off: 0, tok_stride: stride };
        let dense: Vec<f32> = (0..n_tok).flat_map(|t| q[t * stride..][..n_q * hd].to_vec()).collect();
        let plan = PrefillPlan::new(&ctx, &Binding::whole(&qb), &ql, &cache, 0, &opts).unwrap();
        assert_eq!(plan.kernel(), DecodeKernel::Coop, "case {i}");
        // The whole chunk, then a shorter step of the same plan further on.
        for (sp0, sn) in [(p0, n_tok), (p0 + n_tok / 2, n_tok - n_tok / 2)] {
            let kv_len = sp0 + sn;
            let qs: Vec<f32> = dense[..sn * n_q * hd].to_vec();
            let want =
                attention::attention_ref(&qs, &prefix(&k, n_kv, len, kv_len, hd), &prefix(&v, n_kv, len, kv_len, hd), sn, n_q, n_kv, hd, kv_len, sp0, &opts)
                    .unwrap();
            plan.run(&ctx, &StepValues::chunk(sp0 as u32, sn as u32)).unwrap();
            let got = plan.out().unwrap().to_vec::<f32>().unwrap();
            let g: Vec<f64> = got[..sn * n_q * hd].iter().map(|&x| x as f64).collect();
            let w: Vec<f64> = want.iter().map(|&x| x as f64).collect();
            check_close_rtol(&g, &w, RTOL).unwrap_or_else(|e| panic!("case {i} step ({sp0}, {sn}): {e}"));
        }
    }
}

#[test]
fn coop_prefill_only_where_it_applies() {
    let Some(ctx) = test_gpu() else { return };
    let opts = AttnOptions { scale: 0.1, softcap: None, window: None };
    let have = PrefillPlan::coop_config(&ctx, &filled(&ctx, cfg(64, 2, 128, KvDtype::F16), 1, 1, 1.0).0, 0, 4, &opts).is_some();
    // A q8 cache, soft-capping, head_dim 256, a segmented cache: never the coopmat kernel.
    let q8 = KvCache::new(&ctx, cfg(64, 2, 128, KvDtype::Q8_0)).unwrap();
    assert!(PrefillPlan::coop_config(&ctx, &q8, 0, 4, &opts).is_none());
    let capped = AttnOptions { softcap: Some(30.0), ..opts };
    let f16 = KvCache::new(&ctx, cfg(64, 2, 128, KvDtype::F16)).unwrap();
    assert!(PrefillPlan::coop_config(&ctx, &f16, 0, 4, &capped).is_none());
    let wide = KvCache::new(&ctx, cfg(256, 1, 128, KvDtype::F16)).unwrap();
    assert!(PrefillPlan::coop_config(&ctx, &wide, 0, 2, &opts).is_none());
    let seg = KvCache::new(&ctx, KvCacheConfig { max_segment_bytes: Some(64 * 64 * 2), ..cfg(64, 1, 256, KvDtype::F16) }).unwrap();
    assert!(cache_segments(&seg) > 1);
    assert!(PrefillPlan::coop_config(&ctx, &seg, 0, 2, &opts).is_none());
    // Asking for it where it does not apply is a typed error, never a silent fallback.
    let qb = ctx.upload(bytemuck::cast_slice(&vec![0f32; 8 * 4 * 64])).unwrap();
    let ql = QueryLayout { n_tok: 8, n_q: 4, q_off: 0, tok_stride: 4 * 64 };
    let forced = PrefillPlan::builder(&ctx, &Binding::whole(&qb), &ql, &q8, 0, &opts).kernel(DecodeKernel::Coop).build();
    assert!(forced.is_err());
    let default = PrefillPlan::new(&ctx, &Binding::whole(&qb), &ql, &q8, 0, &opts).unwrap();
    assert_ne!(default.kernel(), DecodeKernel::Coop);
    if !have {
        numr::testing::skip_path(
            &ctx,
            "the prefill plan's choice of the cooperative-matrix kernel",
            "no cooperative matrices; only the fallback choices were checked",
        );
    }
}

fn cache_segments(c: &KvCache) -> usize {
    c.segments(0).unwrap().len()
}
