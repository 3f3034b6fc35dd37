//! The CPU reference the attention kernels are tested against.

use super::AttnOptions;
use crate::ops_common::{OpsError, Result};

/// Naive O(n²) CPU reference. `q` is `[n_tok][n_q][hd]`, `k`/`v` are `[n_kv][kv_len][hd]`
/// (as the cache reads back), query `t` sits at position `p0 + t`. Returns `[n_tok][n_q][hd]`.
/// [`OpsError::BadArgs`] when the lengths disagree with the shape, `n_kv` does not divide `n_q`,
/// or a query position lies past `kv_len` (`p0 + n_tok > kv_len`).
#[allow(clippy::too_many_arguments)]
pub fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_tok: usize,
    n_q: usize,
    n_kv: usize,
    hd: usize,
    kv_len: usize,
    p0: usize,
    opts: &AttnOptions,
) -> Result<Vec<f32>> {
    let bad = |reason: String| OpsError::BadArgs { op: "attention_ref", reason };
    if n_kv == 0 || !n_q.is_multiple_of(n_kv) {
        return Err(bad(format!("{n_q} query heads over {n_kv} KV heads")));
    }
    let nq = n_tok.checked_mul(n_q).and_then(|x| x.checked_mul(hd));
    let nk = n_kv.checked_mul(kv_len).and_then(|x| x.checked_mul(hd));
    if nq != Some(q.len()) || nk != Some(k.len()) || nk != Some(v.len()) {
        return Err(bad(format!(
            "q {}, k {}, v {} values for {n_tok} tokens x {n_q} heads, {n_kv} KV heads x {kv_len} positions, hd {hd}",
            q.len(),
            k.len(),
            v.len()
        )));
    }
    if p0.checked_add(n_tok).is_none_or(|e| e > kv_len) {
        return Err(bad(format!("queries at {p0}..{p0}+{n_tok} past kv_len {kv_len}")));
    }
    let g = n_q / n_kv;
    let mut out = vec![0.0f32; n_tok * n_q * hd];
    for t in 0..n_tok {
        let qp = p0 + t;
        for h in 0..n_q {
            let kvh = h / g;
            let qv = &q[(t * n_q + h) * hd..][..hd];
            let mut scores = Vec::new();
            for kp in 0..kv_len.min(qp + 1) {
                if opts.window.is_some_and(|w| qp - kp >= w) {
                    continue;
                }
                let kr = &k[(kvh * kv_len + kp) * hd..][..hd];
                let mut s = qv.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * opts.scale as f64;
                if let Some(c) = opts.softcap {
                    s = c as f64 * (s / c as f64).tanh();
                }
                scores.push((kp, s));
            }
            let m = scores.iter().fold(f64::NEG_INFINITY, |a, &(_, s)| a.max(s));
            let l: f64 = scores.iter().map(|&(_, s)| (s - m).exp()).sum();
            let o = &mut out[(t * n_q + h) * hd..][..hd];
            for &(kp, s) in &scores {
                let w = (s - m).exp() / l;
                for (d, od) in o.iter_mut().enumerate() {
                    *od += (w * v[(kvh * kv_len + kp) * hd + d] as f64) as f32;
                }
            }
        }
    }
    Ok(out)
}
