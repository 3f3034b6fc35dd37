//! Shared helpers of the `plans_*` tests (uploads, bindings, tolerances, caches, layouts).
//! Included by the other test files with `#[path = "plans_util.rs"] mod util;`.
#![allow(dead_code)]

use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use boostr::ops_common::pseudo_random as rnd;
use boostr::rope::{QkvLayout, RopeParams, RopeScaling, RopeStyle};
use numr::gpu::{Binding, GpuBuffer, GpuContext, StepValues};
use numr::testing::check_close_rtol;
use numr::{Device, Tensor};
use std::sync::Arc;

pub fn up(ctx: &GpuContext, v: &[f32]) -> Tensor {
    Tensor::from_slice(v, &[v.len()], &Device::Gpu(ctx.clone())).unwrap()
}

pub fn bind(t: &Tensor) -> Binding {
    t.gpu_binding(4).unwrap().0
}

pub fn close(got: &[f32], want: &[f32], tol: f64, what: &str) {
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    if let Err(e) = check_close_rtol(&f(got), &f(want), tol) {
        panic!("{what}: {e}");
    }
}

/// Stored cache rows against the CPU model of the cache. f16 rows match exactly. A q8_0 code
/// is `round(x / d)`, and Vulkan's division need not be correctly rounded (2.5 ULP), so a value
/// within a few ULP of a tie may round the other way on a GPU (it does on the H200): q8_0 rows
/// match exactly except at most one element in a thousand, each off by exactly one step of its
/// block.
pub fn stored_close(got: &[f32], want: &[f32], dtype: KvDtype, what: &str) {
    if dtype == KvDtype::F16 {
        return close(got, want, 1e-6, what);
    }
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut ties = 0;
    for (b, (g, w)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
        let step = w.iter().fold(0.0f32, |m, &x| m.max(x.abs())) / 127.0;
        for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
            let diff = (g - w).abs();
            if diff <= 1e-6 * step.max(1e-30) * 127.0 {
                continue;
            }
            assert!((diff - step).abs() <= 1e-3 * step, "{what}: element {}: got {g} want {w} (step {step})", 32 * b + i);
            ties += 1;
        }
    }
    assert!(ties * 1000 <= got.len(), "{what}: {ties} of {} values a step off", got.len());
}

pub fn read_f32(ctx: &GpuContext, buf: &Arc<GpuBuffer>, off: u64, n: usize) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&ctx.read_bytes(buf, off, (n * 4) as u64).unwrap())
}

/// A cache of one layer whose segments hold `seg` positions (None: one segment).
pub fn new_cache(ctx: &GpuContext, n_kv: usize, hd: usize, capacity: usize, dtype: KvDtype, seg: Option<usize>) -> KvCache {
    let pos_bytes = (n_kv * dtype.row_words(hd) * 4) as u64;
    let cfg = KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity, dtype, max_segment_bytes: seg.map(|s| s as u64 * pos_bytes) };
    let c = KvCache::new(ctx, cfg).unwrap();
    assert_eq!(c.segments(0).unwrap().len(), seg.map_or(1, |s| capacity.div_ceil(s)));
    c
}

/// `n` tokens of K then V heads, `[t][k heads | v heads]`, and their layout.
pub fn kv_rows(n: usize, n_kv: usize, hd: usize, seed: u64) -> (Vec<f32>, QkvLayout) {
    let l = QkvLayout { n_tok: n, n_q: 0, n_kv, head_dim: hd, tok_stride: 2 * n_kv * hd, x_off: 0, q_off: 0, k_off: 0, v_off: n_kv * hd };
    (rnd(n * l.tok_stride, seed, 1.0), l)
}

/// `[n_kv][len][hd]` -> the first `kv` positions of each head.
pub fn prefix(a: &[f32], n_kv: usize, len: usize, kv: usize, hd: usize) -> Vec<f32> {
    (0..n_kv).flat_map(|h| a[h * len * hd..][..kv * hd].to_vec()).collect()
}

/// `[t][n_kv][hd]` -> `[n_kv][t][hd]`.
pub fn by_head(a: &[f32], n: usize, n_kv: usize, hd: usize) -> Vec<f32> {
    let mut o = vec![0.0; a.len()];
    for t in 0..n {
        for h in 0..n_kv {
            o[(h * n + t) * hd..][..hd].copy_from_slice(&a[(t * n_kv + h) * hd..][..hd]);
        }
    }
    o
}

pub fn step_u32(pos: usize, n: usize) -> StepValues {
    StepValues::chunk(pos as u32, n as u32)
}

/// Serialises the tests of one binary that share a context and assert its counters
/// ([`no_copy_alloc_snapshot`]): the test harness runs tests on several threads, and another
/// test's upload on the same shared context would move the counters between the two snapshots
/// (seen on the H200 under the `no_subgroups` profile). Hold the guard for the whole body.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn no_copy_alloc_snapshot(ctx: &GpuContext) -> (u64, u64) {
    (ctx.bind_groups_created(), ctx.pool_stats().created)
}

pub fn rope_params(hd: usize, rot: usize, style: RopeStyle) -> RopeParams {
    RopeParams { head_dim: hd, rot_dim: rot, base: 10000.0, scaling: RopeScaling::Linear { factor: 2.0 }, style }
}
