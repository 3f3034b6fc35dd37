//! Rotary position embeddings, fused with the per-head QK-norm (Qwen3, LFM2, Gemma 3) and the
//! KV-cache write, in ONE dispatch for every head of every token.
//!
//! The input is a packed activation buffer: token `t`'s row starts at `x_off + t * tok_stride`,
//! query head `h` at `q_off + h * head_dim` inside it, key head `h` at `k_off + ...`, value head
//! at `v_off + ...` (for separate Q and K tensors, use two dispatches or equal strides). Each
//! workgroup handles one head of one token: load the head into workgroup memory, RMS-normalise
//! it with the q or k weight (optional), rotate the first `rot_dim` dimensions by
//! `pos[t] * inv_freq[i]`, write it back in place, and (optionally) store K and V rows into the
//! KV cache at slot `slot0 + t`.
//!
//! The inverse frequencies come from the host ([`RopeParams::inv_freqs`]), which applies the base,
//! the partial rotary dimension and the linear or Llama-3 frequency scaling; they are uploaded
//! once when a [`QkvRopePlan`] is built. The kernel only multiplies by the position: token `t` of
//! a step sits at `step.pos + t` ([`RopePositions::Step`], computed in the kernel) or at
//! `positions[step.token + t]` of a GPU u32 buffer ([`RopePositions::Buffer`]). K/V go to cache
//! slot `step.pos + t`.
//!
//! Build a [`QkvRopePlan`] once per layer (for the most tokens a step will carry) and record it
//! per step; [`crate::kv_cache::KvWritePlan`] is the same kernel with rotation and norm off, for
//! K/V rows produced elsewhere. [`QkvRope::run`] is the eager form over the implicit stream.

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use crate::kv_cache::KvDtype;
use crate::ops_common::{Result, bad, tree_reduce_fns};

mod plan;

pub use plan::{QkvRopeInputs, QkvRopePlan, RopePositions};

/// Which dimensions form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i + 1)` (llama.cpp's "normal", GPT-J).
    Normal,
    /// Pairs `(i, i + rot_dim / 2)` (NEOX, Hugging Face `rotate_half`).
    Neox,
}

/// Frequency scaling for long context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// The unscaled frequencies.
    None,
    /// Positions divided by `factor` (inverse frequencies divided by `factor`).
    Linear {
        /// The divisor (> 0).
        factor: f32,
    },
    /// Llama 3.1's piecewise scaling.
    Llama3 {
        /// Divisor of the low frequencies (`rope_scaling.factor`).
        factor: f32,
        /// Wavelengths above `original_max_position / low_freq_factor` are divided by `factor`.
        low_freq_factor: f32,
        /// Wavelengths below `original_max_position / high_freq_factor` are kept; those between
        /// are interpolated.
        high_freq_factor: f32,
        /// The pre-training context length (`original_max_position_embeddings`).
        original_max_position: u32,
    },
}

/// Host-side RoPE parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Elements per head.
    pub head_dim: usize,
    /// Rotated dimensions (partial rotary: `< head_dim`); even.
    pub rot_dim: usize,
    /// The frequency base (`rope_theta`, for example 10000 or 500000).
    pub base: f32,
    /// Long-context scaling of the inverse frequencies.
    pub scaling: RopeScaling,
    /// Which dimensions are rotated together.
    pub style: RopeStyle,
}

impl RopeParams {
    /// `rot_dim / 2` inverse frequencies `base^(-2i / rot_dim)`, scaled.
    pub fn inv_freqs(&self) -> Vec<f32> {
        let half = self.rot_dim / 2;
        (0..half)
            .map(|i| {
                let inv = (self.base as f64).powf(-2.0 * i as f64 / self.rot_dim as f64);
                let v = match self.scaling {
                    RopeScaling::None => inv,
                    RopeScaling::Linear { factor } => inv / factor as f64,
                    RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                        let (f, lo, hi, orig) = (factor as f64, low_freq_factor as f64, high_freq_factor as f64, original_max_position as f64);
                        let wavelen = 2.0 * std::f64::consts::PI / inv;
                        if wavelen < orig / hi {
                            inv
                        } else if wavelen > orig / lo {
                            inv / f
                        } else {
                            let smooth = (orig / wavelen - lo) / (hi - lo);
                            (1.0 - smooth) * inv / f + smooth * inv
                        }
                    }
                };
                v as f32
            })
            .collect()
    }

    /// CPU reference: rotates one head in place at `pos` (`freqs` from [`Self::inv_freqs`]).
    /// [`crate::ops_common::OpsError::BadArgs`] when the head is shorter than `rot_dim` or
    /// `freqs` holds fewer than `rot_dim / 2` values.
    pub fn rotate(&self, head: &mut [f32], pos: u32, freqs: &[f32]) -> Result<()> {
        let half = self.rot_dim / 2;
        if head.len() < self.rot_dim || freqs.len() < half {
            return Err(bad("RopeParams::rotate", format!("head of {}, {} freqs for rot_dim {}", head.len(), freqs.len(), self.rot_dim)));
        }
        for (i, &f) in freqs.iter().enumerate().take(half) {
            let (a, b) = match self.style {
                RopeStyle::Normal => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let theta = (pos as f32 * f) as f64;
            let (s, c) = theta.sin_cos();
            let (x, y) = (head[a] as f64, head[b] as f64);
            head[a] = (x * c - y * s) as f32;
            head[b] = (x * s + y * c) as f32;
        }
        Ok(())
    }
}

/// The fused kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QkvRope {
    /// Which dimensions are rotated together.
    pub style: RopeStyle,
    /// Rotate q and k (off: norm and/or KV write only).
    pub rope: bool,
    /// Per-head RMSNorm of q and k before the rotation.
    pub qk_norm: bool,
    /// Gemma's `1 + w` norm weights.
    pub norm_offset: bool,
    /// Also store K (after norm and rotation) and V into the KV cache.
    pub kv_write: Option<KvDtype>,
}

/// Invocations per workgroup.
pub const ROPE_WG: u32 = 64;

/// Where the heads live in the packed activation buffer, and how many there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvLayout {
    /// Tokens (for a plan: the most tokens one step carries).
    pub n_tok: usize,
    /// Query heads per token.
    pub n_q: usize,
    /// KV heads per token.
    pub n_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// f32 elements between tokens.
    pub tok_stride: usize,
    /// Element offset of the first token's row.
    pub x_off: usize,
    /// Offset of the first Q head inside a token's row (elements).
    pub q_off: usize,
    /// Offset of the first K head inside a token's row (elements).
    pub k_off: usize,
    /// Offset of the first V head inside a token's row (elements; read only with a KV write).
    pub v_off: usize,
}

impl std::fmt::Display for QkvLayout {
    /// In words, for error messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self;
        write!(
            f,
            "{} tokens of {} Q and {} KV heads of head size {}, a token every {} values, Q/K/V at {}/{}/{} from {}",
            l.n_tok, l.n_q, l.n_kv, l.head_dim, l.tok_stride, l.q_off, l.k_off, l.v_off, l.x_off
        )
    }
}

impl QkvLayout {
    /// Q, K and V interleaved per token: `[q heads | k heads | v heads]`.
    pub fn packed(n_tok: usize, n_q: usize, n_kv: usize, head_dim: usize) -> QkvLayout {
        QkvLayout {
            n_tok,
            n_q,
            n_kv,
            head_dim,
            tok_stride: (n_q + 2 * n_kv) * head_dim,
            x_off: 0,
            q_off: 0,
            k_off: n_q * head_dim,
            v_off: (n_q + n_kv) * head_dim,
        }
    }

    /// f32 elements the layout reads for `n_tok` tokens (with `kv`: the V heads too); `None` on
    /// overflow.
    pub(crate) fn extent(&self, kv: bool) -> Option<usize> {
        let hd = self.head_dim;
        let mut row = self.q_off.checked_add(self.n_q.checked_mul(hd)?)?.max(self.k_off.checked_add(self.n_kv.checked_mul(hd)?)?);
        if kv {
            row = row.max(self.v_off.checked_add(self.n_kv.checked_mul(hd)?)?);
        }
        self.x_off.checked_add(self.n_tok.checked_sub(1)?.checked_mul(self.tok_stride)?)?.checked_add(row)
    }
}

impl QkvRope {
    /// Every combination of style, rope, QK norm, norm offset and KV write (the variants the
    /// tests validate with naga).
    pub fn all() -> Vec<QkvRope> {
        let mut v = Vec::new();
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            for rope in [false, true] {
                for qk_norm in [false, true] {
                    for norm_offset in [false, true] {
                        for kv_write in [None, Some(KvDtype::F16), Some(KvDtype::Q8_0)] {
                            v.push(QkvRope { style, rope, qk_norm, norm_offset, kv_write });
                        }
                    }
                }
            }
        }
        v
    }

    /// Whether the kernel writes the transformed Q/K heads back (rotation or norm on); without,
    /// the activation binding is read-only (a pure KV write).
    pub fn transforms(&self) -> bool {
        self.rope || self.qk_norm
    }

    /// WGSL. Bindings `x` (rw when [`Self::transforms`], else read), `pos`, `freqs`, `qw`, `kw`,
    /// `kc` (rw), `vc` (rw). One workgroup per (token, head) for tokens `tok0 .. tok_end` over a
    /// 2-D grid: Q heads, then K heads, then (with a KV write) V heads. Token `t` sits at position
    /// `pos0 + t` (`pos_mode` 0) or `pos[pos_base + t]` (`pos_mode` 1), and its K/V go to slot
    /// `pos0 + t` when that slot lies in the bound segment `seg_start .. seg_start + seg_len`
    /// (others are dropped, so a write never leaves the segment's buffers). With `parts > 1`
    /// each head row is the sum of the row at `base` and those `part_off`, `2 * part_off`, ...
    /// further on, added in that order (the partial sums of a projection split over K,
    /// [`QkvRopePlan::with_partial_sum`], [`QkvRopePlan::with_partials`]); with `v_back = 1`
    /// the grid also covers the V heads (`nh` heads a token in all) and every summed head row,
    /// V's included, is written back at `base`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let name = format!(
            "qkv_rope_{:?}_r{}_n{}_o{}_{}",
            self.style,
            self.rope as u8,
            self.qk_norm as u8,
            self.norm_offset as u8,
            self.kv_write.map_or("nokv".to_string(), |d| format!("{d:?}"))
        )
        .to_lowercase();
        let mut pre = String::from("var<workgroup> row: array<f32, 256>;\n");
        pre.push_str(&tree_reduce_fns(ROPE_WG));
        if let Some(d) = self.kv_write {
            pre.push_str(&d.store_fn("kc", ROPE_WG));
            pre.push_str(&d.store_fn("vc", ROPE_WG));
        }
        let wofs = if self.norm_offset { "1.0 + " } else { "" };
        let norm = if self.qk_norm {
            format!(
                "    if (kind < 2u) {{
        var ss = 0.0;
        for (var d = lidx; d < p.hd; d += {ROPE_WG}u) {{ ss += row[d] * row[d]; }}
        let inv = inverseSqrt(red_sum(ss, lidx) / f32(p.hd) + bitcast<f32>(p.eps));
        for (var d = lidx; d < p.hd; d += {ROPE_WG}u) {{
            let w = select(kw[d], qw[d], kind == 0u);
            row[d] = row[d] * inv * ({wofs}w);
        }}
        workgroupBarrier();
    }}
"
            )
        } else {
            String::new()
        };
        let pair = match self.style {
            RopeStyle::Normal => "let a = 2u * i; let b = a + 1u;",
            RopeStyle::Neox => "let a = i; let b = i + p.rot / 2u;",
        };
        let rope = if self.rope {
            format!(
                "    if (kind < 2u) {{
        var ip = p.pos0 + t;
        if (p.pos_mode == 1u) {{ ip = pos[p.pos_base + t]; }}
        let fp = f32(ip);
        for (var i = lidx; i < p.rot / 2u; i += {ROPE_WG}u) {{
            {pair}
            let th = fp * freqs[i];
            let c = cos(th);
            let s = sin(th);
            let x0 = row[a];
            let x1 = row[b];
            row[a] = x0 * c - x1 * s;
            row[b] = x0 * s + x1 * c;
        }}
        workgroupBarrier();
    }}
"
            )
        } else {
            String::new()
        };
        let kv = if self.kv_write.is_some() {
            "    if (kind >= 1u) {
        let slot = p.pos0 + t;
        if (slot >= p.seg_start && slot - p.seg_start < p.seg_len) {
            let base = (hh * p.seg_len + slot - p.seg_start) * p.row_words;
            if (kind == 1u) { store_kc(base, lidx); } else { store_vc(base, lidx); }
        }
    }
"
        } else {
            ""
        };
        let write_back = if self.transforms() {
            format!("    if (kind < 2u || p.v_back == 1u) {{ for (var d = lidx; d < p.hd; d += {ROPE_WG}u) {{ x[base + d] = row[d]; }} }}\n")
        } else {
            String::new()
        };
        let body = format!(
            "    let nh = p.nh;
    let lt = wg_linear / nh;
    let h = wg_linear - lt * nh;
    let t = p.tok0 + lt;
    if (t >= p.tok_end) {{ return; }}
    var kind = 0u;
    var hh = h;
    var off = p.q_off;
    if (h >= p.n_q + p.n_kv) {{ kind = 2u; hh = h - p.n_q - p.n_kv; off = p.v_off; }} else if (h >= p.n_q) {{ kind = 1u; hh = h - p.n_q; off = p.k_off; }}
    let base = p.x_off + t * p.tok_stride + off + hh * p.hd;
    for (var d = lidx; d < p.hd; d += {ROPE_WG}u) {{ row[d] = x[base + d]; }}
    // A projection split over K left its other partial sums `part_off` apart.
    for (var z = 1u; z < p.parts; z++) {{ for (var d = lidx; d < p.hd; d += {ROPE_WG}u) {{ row[d] += x[base + z * p.part_off + d]; }} }}
    workgroupBarrier();
{norm}{rope}{write_back}{kv}"
        );
        let x_access = if self.transforms() { Access::ReadWrite } else { Access::Read };
        KernelBuilder::new(name, *env)
            .workgroup(ROPE_WG, 1, 1)
            .storage("x", x_access, "array<f32>")
            .storage("pos", Access::Read, "array<u32>")
            .storage("freqs", Access::Read, "array<f32>")
            .storage("qw", Access::Read, "array<f32>")
            .storage("kw", Access::Read, "array<f32>")
            .storage("kc", Access::ReadWrite, "array<u32>")
            .storage("vc", Access::ReadWrite, "array<u32>")
            .params(&[
                "tok0",
                "tok_end",
                "n_q",
                "n_kv",
                "hd",
                "rot",
                "tok_stride",
                "x_off",
                "part_off",
                "parts",
                "nh",
                "v_back",
                "q_off",
                "k_off",
                "v_off",
                "eps",
                "pos0",
                "pos_mode",
                "pos_base",
                "seg_start",
                "seg_len",
                "row_words",
            ])
            .prelude(&pre)
            .body(&body)
            .build()
    }

    /// CPU reference: transforms `x` in place (as the kernel does) and returns the K and V rows
    /// the cache would hold, `[n_tok][n_kv][head_dim]` each, rounded through the cache dtype
    /// (unrounded when `kv_write` is `None`). [`crate::ops_common::OpsError::BadArgs`] when `x`
    /// is shorter than the layout, `positions` does not hold one entry per token, or the norm
    /// weights are missing or short.
    #[allow(clippy::too_many_arguments)]
    pub fn reference(
        &self,
        x: &mut [f32],
        l: &QkvLayout,
        rope: &RopeParams,
        positions: &[u32],
        qw: Option<&[f32]>,
        kw: Option<&[f32]>,
        eps: f32,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let hd = l.head_dim;
        if l.n_tok > 0 && l.extent(true).is_none_or(|e| e > x.len()) {
            return Err(bad("QkvRope::reference", format!("x of {} values is shorter than the layout ({l})", x.len())));
        }
        if positions.len() != l.n_tok {
            return Err(bad("QkvRope::reference", format!("{} positions for {} tokens", positions.len(), l.n_tok)));
        }
        let (qw, kw) = match (self.qk_norm, qw, kw) {
            (false, _, _) => (&[][..], &[][..]),
            (true, Some(q), Some(k)) if q.len() >= hd && k.len() >= hd => (q, k),
            _ => return Err(bad("QkvRope::reference", format!("the QK norm needs q and k weights of {hd} values"))),
        };
        let freqs = rope.inv_freqs();
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for (t, &pos) in positions.iter().enumerate() {
            let row0 = l.x_off + t * l.tok_stride;
            for h in 0..l.n_q + l.n_kv {
                let (kind, hh) = if h < l.n_q { (0, h) } else { (1, h - l.n_q) };
                let base = row0 + if kind == 0 { l.q_off } else { l.k_off } + hh * hd;
                let head = &mut x[base..base + hd];
                if self.qk_norm {
                    let w = if kind == 0 { qw } else { kw };
                    let ss = head.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / hd as f64;
                    let inv = 1.0 / (ss + eps as f64).sqrt();
                    for (d, v) in head.iter_mut().enumerate() {
                        *v = (*v as f64 * inv * (w[d] as f64 + if self.norm_offset { 1.0 } else { 0.0 })) as f32;
                    }
                }
                if self.rope {
                    rope.rotate(head, pos, &freqs)?;
                }
                if kind == 1 {
                    ks.extend(self.kv_write.map_or(head.to_vec(), |dt| dt.round_row(head)));
                }
            }
            for hh in 0..l.n_kv {
                let base = row0 + l.v_off + hh * hd;
                let head = &x[base..base + hd];
                vs.extend(self.kv_write.map_or(head.to_vec(), |dt| dt.round_row(head)));
            }
        }
        Ok((ks, vs))
    }
}
