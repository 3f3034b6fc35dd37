//! The CPU reference of a batched step's attention.

use crate::attention::{AttnOptions, attention_ref};
use crate::ops_common::{Result, bad};

/// Causal attention of a batched step on the CPU: `seqs[i] = (k, v, pos, n_tok)` gives sequence
/// `i`'s keys and values (`[n_kv][kv_len][hd]`, as [`super::PagedKvCache::read_sequence`]
/// returns them, `kv_len = pos + n_tok`) and its tokens' first position and count; `q` holds the
/// step's tokens in the same order (`[token][n_q][hd]`). Returns `[token][n_q][hd]`.
pub fn paged_attention_ref(q: &[f32], seqs: &[(&[f32], &[f32], usize, usize)], n_q: usize, n_kv: usize, hd: usize, opts: &AttnOptions) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(q.len());
    let mut t0 = 0;
    for &(k, v, pos, n_tok) in seqs {
        let rows = n_tok * n_q * hd;
        let qs = q.get(t0 * n_q * hd..t0 * n_q * hd + rows).ok_or_else(|| bad("paged_attention_ref", "q holds fewer tokens than the sequences"))?;
        out.extend(attention_ref(qs, k, v, n_tok, n_q, n_kv, hd, pos + n_tok, pos, opts)?);
        t0 += n_tok;
    }
    Ok(out)
}
