//! Causal attention of the step's queries over a layer's KV cache, one (token, head) unit at a
//! time, the units split over the threads by their cost (keys read).
//!
//! Query token `t` sits at position `p = pos + t` and reads cache positions `q ≤ p` (with a
//! sliding window `w`, only `p - q < w`, llama.cpp's rule); query head `h` reads KV head
//! `h / group`. Scores are f32 dot products times the scale, soft-capped when the model says so;
//! the softmax subtracts the maximum, sums its exponentials in f64 and weights V in f32.

use std::cell::RefCell;
use std::sync::Arc;

use super::kernels::{AlignedBuf, Kernels};
use super::pool::{Job, MAX_CHUNKS, Pool};
use crate::engine::EngineError;

/// Below this many score computations attention runs on the calling thread alone.
const PARALLEL_MIN: usize = 256;

/// The shape of one attention op.
#[derive(Clone, Copy, Debug)]
pub(super) struct AttnShape {
    pub(super) n_heads: usize,
    pub(super) n_kv: usize,
    pub(super) head_dim: usize,
    /// Cache positions per KV head (the cache is `[kv_head][n_ctx][head_dim]`).
    pub(super) n_ctx: usize,
    pub(super) window: Option<usize>,
    pub(super) scale: f32,
    pub(super) softcap: Option<f32>,
}

impl AttnShape {
    /// The first cache position query position `p` reads.
    fn first(&self, p: usize) -> usize {
        self.window.map_or(0, |w| (p + 1).saturating_sub(w))
    }
}

struct AttnJob {
    k: Kernels,
    s: AttnShape,
    /// `[t][q heads | k heads | v heads]` rows; q at the start of each.
    qkv: Arc<Vec<f32>>,
    keys: Arc<Vec<f32>>,
    values: Arc<Vec<f32>>,
    pos: usize,
    n_tok: usize,
    chunks: usize,
}

impl AttnJob {
    fn keys_of(&self, t: usize) -> usize {
        let p = self.pos + t;
        p + 1 - self.s.first(p)
    }

    /// Units `[a, b)` of chunk `w` of `n`, balanced by keys read.
    fn share(&self, w: usize, n: usize) -> (usize, usize) {
        let total: usize = (0..self.n_tok).map(|t| self.keys_of(t)).sum::<usize>() * self.s.n_heads;
        let bound = |i: usize| {
            if i == 0 {
                return 0;
            }
            if i == n {
                return self.n_tok * self.s.n_heads;
            }
            let target = total * i / n;
            let mut acc = 0;
            for u in 0..self.n_tok * self.s.n_heads {
                if acc >= target {
                    return u;
                }
                acc += self.keys_of(u / self.s.n_heads);
            }
            self.n_tok * self.s.n_heads
        };
        (bound(w), bound(w + 1))
    }
}

thread_local! {
    static SCORES: RefCell<(Vec<f32>, AlignedBuf)> = const { RefCell::new((Vec::new(), AlignedBuf::new())) };
}

impl Job for AttnJob {
    fn chunks(&self) -> usize {
        self.chunks
    }

    fn run(&self, c: usize, out: &mut Vec<f32>) {
        let s = &self.s;
        let hd = s.head_dim;
        let width = (s.n_heads + 2 * s.n_kv) * hd;
        let group = s.n_heads / s.n_kv;
        let (a, b) = self.share(c, self.chunks);
        out.clear();
        out.resize((b - a) * hd, 0.0);
        SCORES.with_borrow_mut(|(scores, acc)| {
            let acc = acc.get(hd);
            for u in a..b {
                let (t, h) = (u / s.n_heads, u % s.n_heads);
                let p = self.pos + t;
                let lo = s.first(p);
                let q = &self.qkv[t * width + h * hd..t * width + (h + 1) * hd];
                let base = (h / group) * s.n_ctx;
                scores.clear();
                let mut max = f32::NEG_INFINITY;
                for j in lo..=p {
                    let mut x = self.k.dot(q, &self.keys[(base + j) * hd..(base + j + 1) * hd]) * s.scale;
                    if let Some(c) = s.softcap {
                        x = c * (x / c).tanh();
                    }
                    max = max.max(x);
                    scores.push(x);
                }
                acc.fill(0.0);
                let mut sum = 0.0f64;
                for (j, &x) in (lo..=p).zip(scores.iter()) {
                    let e = (x - max).exp();
                    sum += e as f64;
                    self.k.axpy(acc, e, &self.values[(base + j) * hd..(base + j + 1) * hd]);
                }
                let inv = (1.0 / sum) as f32;
                for (o, &v) in out[(u - a) * hd..(u - a + 1) * hd].iter_mut().zip(acc.iter()) {
                    *o = v * inv;
                }
            }
        });
    }
}

/// Attention of `n_tok` query rows of `qkv` (tokens at `pos ..`) over one layer's cache into
/// `out` (`[t][n_heads * head_dim]`).
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    pool: &mut Pool,
    k: Kernels,
    s: AttnShape,
    qkv: &Arc<Vec<f32>>,
    keys: &Arc<Vec<f32>>,
    values: &Arc<Vec<f32>>,
    pos: usize,
    n_tok: usize,
    out: &mut [f32],
) -> Result<(), EngineError> {
    let mut job = AttnJob { k, s, qkv: qkv.clone(), keys: keys.clone(), values: values.clone(), pos, n_tok, chunks: 1 };
    let work: usize = (0..n_tok).map(|t| job.keys_of(t)).sum::<usize>() * s.n_heads;
    let parallel = work >= PARALLEL_MIN && pool.threads() > 1;
    if parallel {
        job.chunks = (n_tok * s.n_heads).min(work / PARALLEL_MIN).clamp(1, MAX_CHUNKS);
    }
    let job = Arc::new(job);
    pool.run(job.clone(), parallel)?;
    for c in 0..job.chunks {
        let (a, b) = job.share(c, job.chunks);
        out[a * s.head_dim..b * s.head_dim].copy_from_slice(&pool.result(c)[..(b - a) * s.head_dim]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use boostr::attention::AttnOptions;
    use boostr::attention::attention_ref;
    use boostr::ops_common::pseudo_random;

    /// Against boostr's attention reference (f64): causal, GQA, the sliding window and the
    /// soft-cap, queries at a cache offset, on one thread and on two.
    #[test]
    fn matches_boostrs_attention_reference() {
        let (n_q, n_kv, hd, n_ctx) = (4, 2, 32, 40);
        let k = Kernels::detect();
        for threads in [1, 2] {
            let mut pool = Pool::new(threads).unwrap();
            for (window, softcap, pos, n_tok) in [(None, None, 0, 9), (Some(5), None, 3, 20), (Some(7), Some(4.0), 10, 30), (None, Some(2.0), 30, 1)] {
                let s = AttnShape { n_heads: n_q, n_kv, head_dim: hd, n_ctx, window, scale: 0.3, softcap };
                let width = (n_q + 2 * n_kv) * hd;
                let qkv = Arc::new(pseudo_random(n_tok * width, 1, 2.0));
                let keys = Arc::new(pseudo_random(n_kv * n_ctx * hd, 2, 2.0));
                let values = Arc::new(pseudo_random(n_kv * n_ctx * hd, 3, 2.0));
                let mut out = vec![0.0; n_tok * n_q * hd];
                attention(&mut pool, k, s, &qkv, &keys, &values, pos, n_tok, &mut out).unwrap();
                let q: Vec<f32> = (0..n_tok).flat_map(|t| qkv[t * width..t * width + n_q * hd].to_vec()).collect();
                let opts = AttnOptions { scale: 0.3, softcap, window };
                let want = attention_ref(&q, &keys, &values, n_tok, n_q, n_kv, hd, n_ctx, pos, &opts).unwrap();
                let d = out.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(d < 1e-5, "window {window:?} softcap {softcap:?} pos {pos}: {d}");
            }
        }
    }
}
