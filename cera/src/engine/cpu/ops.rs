//! The CPU executor's QK-norm + RoPE + KV-cache write, on boostr's CPU references (the per-head
//! RMSNorm, `RopeParams::rotate`, the cache types' `round_row`).

use boostr::kv_cache::KvDtype;
use boostr::norm::Norm;
use boostr::ops_common::OpsError;
use boostr::rope::RopeParams;

/// The head layout of the packed `[q | k | v]` rows and the cache.
#[derive(Clone, Copy, Debug)]
pub(super) struct Heads {
    pub(super) n_q: usize,
    pub(super) n_kv: usize,
    pub(super) head_dim: usize,
    /// Cache positions per KV head (the cache is `[kv_head][n_ctx][head_dim]`).
    pub(super) n_ctx: usize,
}

/// On `n` rows of `qkv` (tokens at positions `pos ..`): the optional per-head RMSNorm of q and
/// k (`eps`), RoPE of q and k with `freqs`, then K and V rounded through `kv` (`None`: kept exact) into the caches
/// at those positions.
#[allow(clippy::too_many_arguments)]
pub(super) fn qkv_rope(
    h: Heads,
    qkv: &mut [f32],
    n: usize,
    pos: usize,
    qk_norm: Option<(&[f32], &[f32])>,
    eps: f32,
    rope: &RopeParams,
    freqs: &[f32],
    kv: Option<KvDtype>,
    keys: &mut [f32],
    values: &mut [f32],
) -> Result<(), OpsError> {
    let hd = h.head_dim;
    let w = (h.n_q + 2 * h.n_kv) * hd;
    for t in 0..n {
        let p = pos + t;
        let (q, rest) = qkv[t * w..(t + 1) * w].split_at_mut(h.n_q * hd);
        let (k, v) = rest.split_at_mut(h.n_kv * hd);
        if let Some((qw, kw)) = qk_norm {
            for (x, w) in [(&mut *q, qw), (&mut *k, kw)] {
                let y = Norm::rms().reference(x, w, None, None, hd, eps)?;
                x.copy_from_slice(&y);
            }
        }
        for head in q.chunks_exact_mut(hd).chain(k.chunks_exact_mut(hd)) {
            rope.rotate(head, p as u32, freqs)?;
        }
        for j in 0..h.n_kv {
            let at = (j * h.n_ctx + p) * hd;
            match kv {
                Some(kv) => {
                    keys[at..at + hd].copy_from_slice(&kv.round_row(&k[j * hd..(j + 1) * hd]));
                    values[at..at + hd].copy_from_slice(&kv.round_row(&v[j * hd..(j + 1) * hd]));
                }
                None => {
                    keys[at..at + hd].copy_from_slice(&k[j * hd..(j + 1) * hd]);
                    values[at..at + hd].copy_from_slice(&v[j * hd..(j + 1) * hd]);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use boostr::ops_common::pseudo_random;
    use boostr::rope::{QkvLayout, QkvRope, RopeScaling, RopeStyle};

    /// The op against boostr's fused-kernel reference (`QkvRope::reference`), for both RoPE
    /// styles, with and without the QK-norm, both cache types.
    #[test]
    fn matches_boostrs_qkv_rope_reference() {
        let (n_q, n_kv, hd, n, pos, n_ctx) = (4, 2, 64, 3, 5, 16);
        let h = Heads { n_q, n_kv, head_dim: hd, n_ctx };
        let x = pseudo_random(n * (n_q + 2 * n_kv) * hd, 7, 3.0);
        let (qw, kw) = (pseudo_random(hd, 8, 1.0), pseudo_random(hd, 9, 1.0));
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            for norm in [false, true] {
                for kv in [KvDtype::F16, KvDtype::Q8_0] {
                    let rope = RopeParams { head_dim: hd, rot_dim: 48, base: 10_000.0, scaling: RopeScaling::Linear { factor: 2.0 }, style };
                    let mut ours = x.clone();
                    let (mut kc, mut vc) = (vec![0.0; n_kv * n_ctx * hd], vec![0.0; n_kv * n_ctx * hd]);
                    let nw = norm.then_some((&qw[..], &kw[..]));
                    qkv_rope(h, &mut ours, n, pos, nw, 1e-6, &rope, &rope.inv_freqs(), Some(kv), &mut kc, &mut vc).unwrap();
                    let op = QkvRope { style, rope: true, qk_norm: norm, norm_offset: false, kv_write: Some(kv) };
                    let mut want = x.clone();
                    let positions: Vec<u32> = (0..n as u32).map(|t| pos as u32 + t).collect();
                    let (ks, vs) = op.reference(&mut want, &QkvLayout::packed(n, n_q, n_kv, hd), &rope, &positions, Some(&qw), Some(&kw), 1e-6).unwrap();
                    assert_eq!(ours, want, "{style:?} norm {norm} {kv:?}: the rotated rows");
                    for t in 0..n {
                        for j in 0..n_kv {
                            let at = (j * n_ctx + pos + t) * hd;
                            let r = (t * n_kv + j) * hd;
                            assert_eq!(kc[at..at + hd], ks[r..r + hd], "K row {t} head {j}");
                            assert_eq!(vc[at..at + hd], vs[r..r + hd], "V row {t} head {j}");
                        }
                    }
                }
            }
        }
    }
}
