//! The Q/K/V GEMV's RoPE + KV-cache epilogue (decode): the GEMV producing a token's packed
//! `[q heads | k heads | v heads]` row also rotates its Q and K rows and stores K and V into the
//! layer's f16 cache, so the separate [`crate::rope::QkvRope`] dispatch (and its dependent
//! launch) is gone from every decode layer.
//!
//! Why no synchronisation is needed: with RoPE's "normal" pairs `(2i, 2i + 1)` a rotated pair is
//! two adjacent output rows, and a workgroup owns an even number of consecutive rows starting at
//! an even row, so both values of every pair are reduced by the same workgroup. The rotation is
//! the rope kernel's own f32 expression (`th = f32(pos) * inv_freq[i]`, then `cos`/`sin`), and an
//! f16 cache word holds exactly one pair (`pack2x16float(vec2(a, b))`), so one invocation stores
//! one word. The packed row is written as the rope kernel leaves it (Q and K rotated in place, V
//! as is), so any reader of the activation slot sees the same values.
//!
//! Limits (the plans refuse anything else with a typed error): one activation row, one matrix part
//! of exactly `(n_q + 2 n_kv) * head_dim` rows, a plain output, rows per workgroup even (and rows per
//! subgroup even in that mode), `rot_dim` even and at most `head_dim`, an f16 cache of one segment
//! for the layer. NEOX pairs `(i, i + rot / 2)`, the per-head QK-norm and the q8_0 cache (whose
//! 32-value blocks span workgroups) keep the separate rope dispatch.

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, PlanDispatch};

use super::validate::{check_binding, mul, to_u32};
use super::{QuantError, QuantMatrix, Result};
use crate::kv_cache::{KvCache, KvDtype};

/// What the epilogue needs besides the GEMV's own bindings.
#[derive(Clone, Copy, Debug)]
pub struct RopeKv<'a> {
    /// Query heads.
    pub n_q: usize,
    /// KV heads.
    pub n_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Rotated dimensions of each Q/K head (even, at most `head_dim`; the rest pass unrotated).
    pub rot_dim: usize,
    /// `rot_dim / 2` inverse frequencies, f32 ([`crate::rope::RopeParams::inv_freqs`]).
    pub freqs: &'a Binding,
    /// The cache whose `layer` receives K and V at the step's position.
    pub cache: &'a KvCache,
    /// The layer.
    pub layer: usize,
}

/// The epilogue's parameter words (added to the GEMV's own).
pub(crate) const PARAMS: &[&str] = &["hd", "rot", "pos", "seg_start", "seg_len", "rw"];

/// The bindings and fixed parameter words of a checked [`RopeKv`].
pub(crate) struct Checked {
    bindings: Vec<Binding>,
    words: [(&'static str, usize); 7],
}

/// WGSL: the `rope_kv(g, x0, x1)` store of rows `g` and `g + 1` (`g` even), and with `wg_rows`
/// the workgroup array the reduced rows meet in.
pub(crate) fn prelude(wg_rows: Option<usize>) -> String {
    let mut s = wg_rows.map(|v| format!("var<workgroup> rkv: array<f32, {v}>;\n")).unwrap_or_default();
    s.push_str(
        "fn rope_kv(g: u32, x0: f32, x1: f32) {
    let nqk = p.nq + p.nk;
    var l = g;
    if (g >= nqk) { l = g - nqk; } else if (g >= p.nq) { l = g - p.nq; }
    let hh = l / p.hd;
    let d = l - hh * p.hd;
    var a = x0;
    var b = x1;
    if (g < nqk && d < p.rot) {
        let th = f32(p.pos) * freqs[d / 2u];
        let c = cos(th);
        let s = sin(th);
        a = x0 * c - x1 * s;
        b = x0 * s + x1 * c;
    }
    y[g] = a;
    y[g + 1u] = b;
    if (g >= p.nq && p.pos >= p.seg_start && p.pos - p.seg_start < p.seg_len) {
        let w = (hh * p.seg_len + p.pos - p.seg_start) * p.rw + d / 2u;
        let word = pack2x16float(vec2<f32>(a, b));
        if (g < nqk) { kc[w] = word; } else { vc[w] = word; }
    }
}
",
    );
    s
}

/// WGSL replacing a workgroup-reduced GEMV's store: invocations `lidx < v` hold row
/// `row0 + lidx`'s value `val`; they meet in `rkv`, then each even row's invocation stores its
/// pair. Call from uniform control flow.
pub(crate) fn store_reduced(v: usize, val: &str) -> String {
    format!(
        "    if (lidx < {v}u) {{ rkv[lidx] = {val}; }}
    workgroupBarrier();
    if (lidx < {}u) {{
        let lr = 2u * lidx;
        if (row0 + lr < p.rows) {{ rope_kv(p.row0 + row0 + lr, rkv[lr], rkv[lr + 1u]); }}
    }}
",
        v / 2
    )
}

/// Adds the epilogue's bindings after the GEMV's: `freqs`, `kc`, `vc`.
pub(crate) fn bind(kb: KernelBuilder) -> KernelBuilder {
    kb.storage("freqs", Access::Read, "array<f32>").storage("kc", Access::ReadWrite, "array<u32>").storage("vc", Access::ReadWrite, "array<u32>")
}

/// Checks `rk` against the GEMV (`w`, `m` activation rows, `rows` per workgroup and, in rows per
/// subgroup mode, `sg_rows`) and the adapter; returns the bindings and parameter words.
pub(crate) fn check(ctx: &GpuContext, op: &'static str, w: &QuantMatrix, m: u32, rows: u32, sg_rows: u32, rk: &RopeKv) -> Result<Checked> {
    let config = |reason: String| QuantError::Config { what: op, reason };
    let hd = rk.head_dim;
    let total = mul("Q/K/V rows", rk.n_q + 2 * rk.n_kv, hd)?;
    if m != 1 || w.parts.len() != 1 || w.rows != total {
        return Err(QuantError::Shape {
            what: op,
            reason: format!(
                "the RoPE + KV epilogue takes one activation row ({m}) and one part ({}) of (n_q + 2 n_kv) * head_dim = {total} rows ({})",
                w.parts.len(),
                w.rows
            ),
        });
    }
    if !rows.is_multiple_of(2) || !sg_rows.is_multiple_of(2) {
        return Err(config(format!("the RoPE + KV epilogue needs even rows per workgroup ({rows}) and per subgroup ({sg_rows})")));
    }
    if hd == 0 || !hd.is_multiple_of(2) || !rk.rot_dim.is_multiple_of(2) || rk.rot_dim > hd {
        return Err(QuantError::Shape { what: op, reason: format!("head_dim {hd} and rot_dim {} (both even, rot_dim <= head_dim)", rk.rot_dim) });
    }
    let c = rk.cache.config();
    if c.dtype != KvDtype::F16 || c.head_dim != hd || c.n_kv_heads != rk.n_kv {
        return Err(QuantError::Unsupported {
            name: w.name.clone(),
            reason: format!("the RoPE + KV epilogue writes an f16 cache of {} KV heads of head size {hd} (the cache: {c})", rk.n_kv),
        });
    }
    let segs = rk.cache.segments(rk.layer).map_err(|e| config(e.to_string()))?;
    let [seg] = segs else {
        return Err(QuantError::Unsupported {
            name: w.name.clone(),
            reason: format!("the RoPE + KV epilogue writes one cache segment (layer {} has {})", rk.layer, segs.len()),
        });
    };
    if ctx.capabilities().limits.max_storage_buffers_per_shader_stage < 8 {
        return Err(QuantError::Unsupported { name: w.name.clone(), reason: "the RoPE + KV epilogue needs 8 storage bindings per stage".into() });
    }
    check_binding(op, "inverse frequencies", rk.freqs, rk.rot_dim / 2, 4)?;
    let rw = KvDtype::F16.row_words(hd);
    let words = mul("cache words", mul("cache rows", rk.n_kv, seg.len)?, rw)?;
    let (kb, vb) = (Binding::whole(&seg.k), Binding::whole(&seg.v));
    check_binding(op, "k cache", &kb, words, 4)?;
    check_binding(op, "v cache", &vb, words, 4)?;
    to_u32("cache segment end", seg.start + seg.len)?;
    Ok(Checked {
        bindings: vec![rk.freqs.clone(), kb, vb],
        words: [("nq", rk.n_q * hd), ("nk", rk.n_kv * hd), ("hd", hd), ("rot", rk.rot_dim), ("seg_start", seg.start), ("seg_len", seg.len), ("rw", rw)],
    })
}

impl Checked {
    /// The bindings to append after the GEMV's own.
    pub(crate) fn bindings(&self) -> &[Binding] {
        &self.bindings
    }

    /// Sets the fixed words and the step's position (`pos`: K/V go to cache slot `pos`).
    pub(crate) fn set(&self, mut d: PlanDispatch) -> Result<PlanDispatch> {
        for (name, v) in self.words {
            d = d.set_usize(name, v)?;
        }
        Ok(d.per_step("pos", |s| s.pos)?)
    }
}
