//! Attention over the KV cache: flash-decoding for one token, tiled flash attention for a
//! prefill chunk, and the pass that merges partial softmax results.
//!
//! Both kernels read K/V straight from the cache (`[kv_head][pos][row]`, f16 or q8_0, see
//! [`crate::kv_cache`]) and support GQA/MQA, a sliding window (Gemma 3), logit soft-capping
//! (`cap * tanh(s / cap)`) and head_dim 64, 128 or 256.
//!
//! Masking is aligned to the cache position: query `i` of a chunk whose first token sits at
//! position `p0` attends to keys `0 ..= p0 + i` (and, with a window `w`, only keys with
//! `p0 + i - key < w`), so a chunk prefilled on top of a non-empty cache is correct.
//!
//! # Decode ([`DecodeAttn`])
//! The cache is cut into splits of `chunk` positions; one workgroup of 128 invocations handles one
//! split of one KV head for all `group` query heads that share it (one K/V read for the group).
//! It stages K tiles in workgroup memory (f32), computes all scores of its split, takes the split's
//! max and sum, and accumulates `p · V` with each invocation owning 8 dimensions of a strided
//! subset of positions (coalesced 16-byte V loads), then reduces across invocations. It writes the
//! unnormalised partial output and `(max, sum)` per split; [`AttnCombine`] merges the splits.
//! Caches split across buffers ([`crate::kv_cache::KvSegment`]) run one dispatch per segment into
//! the same partial arrays.
//!
//! # Prefill ([`PrefillAttn`])
//! One workgroup handles 32 queries of one head: 4 invocations per query, each owning every
//! fourth dimension of the query and of the output accumulator. K and V tiles of 16 positions are
//! staged as f32 in workgroup memory; partial dot products are summed across the 4 invocations
//! through workgroup memory, then each invocation runs the online softmax for its query. Only
//! tiles at or below the causal diagonal (and inside the window) are visited.
//!
//! # Partial layout (both kernels)
//! `o_part[(split * rows + row) * head_dim + d]` (unnormalised) and
//! `ml[(split * rows + row) * 2 + {0: max, 1: sum}]`, `row = token * n_q + q_head`.

use std::sync::Arc;

use numr::gpu::{Access, Binding, BoundGroup, BufferKind, GpuContext, Kernel, KernelBuilder, KernelEnv, KernelSource, Recorder};
use numr::{DType, Tensor};

use crate::kv_cache::{KvCache, KvDtype};
use crate::ops_common::{env_of, fbits, grid_for, OpsError, Result, SAFE_TANH};

/// Score of a masked key.
const NEG: &str = "-1e30";

/// Options shared by prefill and decode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnOptions {
    /// Multiplies `q · k` (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Logit soft-capping: `cap * tanh(s / cap)` after the scale.
    pub softcap: Option<f32>,
    /// Sliding window: a query at position `p` sees keys `p - window + 1 ..= p`.
    pub window: Option<usize>,
}

impl AttnOptions {
    pub fn new(head_dim: usize) -> Self {
        AttnOptions { scale: 1.0 / (head_dim as f32).sqrt(), softcap: None, window: None }
    }
}

/// WGSL `struct V8` and `fn ld8_<name>(row: u32, c: u32) -> V8`: values `8c .. 8c + 8` of cache
/// row `row` of binding `name`.
fn ld8_fn(dtype: KvDtype, name: &str, hd: u32) -> String {
    match dtype {
        KvDtype::F16 => format!(
            "fn ld8_{name}(row: u32, c: u32) -> V8 {{\n    let w = {name}[row * {}u + c];\n    return V8(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));\n}}\n",
            hd / 8
        ),
        KvDtype::Q8_0 => format!(
            "fn ld8_{name}(row: u32, c: u32) -> V8 {{\n    let base = row * {rw}u + (c / 4u) * 9u;\n    let d = unpack2x16float({name}[base + 8u]).x;\n    let w0 = {name}[base + (c % 4u) * 2u];\n    let w1 = {name}[base + (c % 4u) * 2u + 1u];\n    return V8(i8x4(w0) * d, i8x4(w1) * d);\n}}\n",
            rw = KvDtype::Q8_0.row_words(hd as usize)
        ),
    }
}

const V8_DEFS: &str = "struct V8 { a: vec4<f32>, b: vec4<f32> }
fn i8x4(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u) >> 24u, bitcast<i32>(w << 16u) >> 24u, bitcast<i32>(w << 8u) >> 24u, bitcast<i32>(w) >> 24u));
}
";

fn cache_ty(dtype: KvDtype) -> &'static str {
    match dtype {
        KvDtype::F16 => "array<vec4<u32>>",
        KvDtype::Q8_0 => "array<u32>",
    }
}

fn softcap_expr(on: bool) -> &'static str {
    if on { "s = bitcast<f32>(p.softcap) * tanh_s(s / bitcast<f32>(p.softcap));" } else { "" }
}

/// The flash-decoding kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeAttn {
    pub head_dim: u32,
    /// Query heads per KV head (1..=16).
    pub group: u32,
    pub dtype: KvDtype,
    pub softcap: bool,
}

/// Invocations per decode workgroup.
pub const DECODE_WG: u32 = 128;

impl DecodeAttn {
    /// Positions per K tile.
    pub fn tile(&self) -> u32 {
        (DECODE_WG / self.group).clamp(1, 4096 / self.head_dim)
    }
    /// Most positions per split (the score buffer holds `group * max_chunk` floats).
    pub fn max_chunk(&self) -> u32 {
        (1024 / self.group) / self.tile() * self.tile()
    }

    pub fn all() -> Vec<DecodeAttn> {
        let mut v = Vec::new();
        for head_dim in [64, 128, 256] {
            for group in [1, 2, 4, 8, 16] {
                for dtype in [KvDtype::F16, KvDtype::Q8_0] {
                    for softcap in [false, true] {
                        v.push(DecodeAttn { head_dim, group, dtype, softcap });
                    }
                }
            }
        }
        v
    }

    /// WGSL. Bindings `q`, `kc`, `vc`, `o_part` (rw), `ml` (rw). Grid `[splits, n_kv]`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let (hd, g, t) = (self.head_dim, self.group, self.tile());
        let cmax = self.max_chunk();
        let c8 = hd / 8; // 8-value groups per row
        let lanes = DECODE_WG / c8; // position lanes in the V pass
        let name = format!("attn_decode_hd{hd}_g{g}_{:?}_c{}", self.dtype, self.softcap as u8).to_lowercase();
        let mut pre = format!(
            "var<workgroup> qs: array<f32, {}>;\nvar<workgroup> kt: array<f32, {}>;\nvar<workgroup> sc: array<f32, 1024>;\nvar<workgroup> stat: array<f32, 32>;\n",
            g * hd,
            t * (hd + 1)
        );
        pre.push_str(V8_DEFS);
        pre.push_str(SAFE_TANH);
        pre.push_str(&ld8_fn(self.dtype, "kc", hd));
        pre.push_str(&ld8_fn(self.dtype, "vc", hd));
        pre.push_str(&crate::ops_common::tree_reduce_fns(DECODE_WG));
        // Per-head accumulators, unrolled so they stay in registers.
        let mut acc_decl = String::new();
        let mut acc_upd = String::new();
        let mut acc_out = String::new();
        for gi in 0..g {
            acc_decl.push_str(&format!("    var a{gi} = vec4<f32>(0.0); var b{gi} = vec4<f32>(0.0);\n"));
            acc_upd.push_str(&format!("            {{ let pr = sc[{gi}u * {cmax}u + j]; a{gi} += pr * v.a; b{gi} += pr * v.b; }}\n"));
            acc_out.push_str(&format!(
                "    {{
        let o = r * {hd}u + c * 8u;
        sc[o] = a{gi}.x; sc[o + 1u] = a{gi}.y; sc[o + 2u] = a{gi}.z; sc[o + 3u] = a{gi}.w;
        sc[o + 4u] = b{gi}.x; sc[o + 5u] = b{gi}.y; sc[o + 6u] = b{gi}.z; sc[o + 7u] = b{gi}.w;
        workgroupBarrier();
        let row = kvh * {g}u + {gi}u;
        for (var d = lidx; d < {hd}u; d += {DECODE_WG}u) {{
            var s = 0.0;
            for (var l = 0u; l < {lanes}u; l++) {{ s += sc[l * {hd}u + d]; }}
            o_part[(split * p.rows + row) * {hd}u + d] = s;
        }}
        if (lidx == 0u) {{ ml[(split * p.rows + row) * 2u] = stat[{gi}u]; ml[(split * p.rows + row) * 2u + 1u] = stat[16u + {gi}u]; }}
        workgroupBarrier();
    }}
"
            ));
        }
        let cap = softcap_expr(self.softcap);
        let body = format!(
            "    let kvh = wid.y;
    let split = p.split_base + wid.x;
    let lo = p.seg_start + wid.x * p.chunk;
    let hi = min(min(lo + p.chunk, p.seg_start + p.seg_len), p.kv_len);
    let n = select(0u, hi - lo, hi > lo);
    let scale = bitcast<f32>(p.scale);
    for (var i = lidx; i < {g}u * {hd}u; i += {DECODE_WG}u) {{ qs[i] = q[p.q_off + kvh * {g}u * {hd}u + i] * scale; }}
    let row0 = kvh * p.seg_len + lo - p.seg_start;
    for (var t0 = 0u; t0 < n; t0 += {t}u) {{
        workgroupBarrier();
        for (var i = lidx; i < {t}u * {c8}u; i += {DECODE_WG}u) {{
            let tt = i / {c8}u;
            let c = i - tt * {c8}u;
            var v = V8(vec4<f32>(0.0), vec4<f32>(0.0));
            if (t0 + tt < n) {{ v = ld8_kc(row0 + t0 + tt, c); }}
            let o = tt * {hd1}u + c * 8u;
            kt[o] = v.a.x; kt[o + 1u] = v.a.y; kt[o + 2u] = v.a.z; kt[o + 3u] = v.a.w;
            kt[o + 4u] = v.b.x; kt[o + 5u] = v.b.y; kt[o + 6u] = v.b.z; kt[o + 7u] = v.b.w;
        }}
        workgroupBarrier();
        for (var i = lidx; i < {g}u * {t}u; i += {DECODE_WG}u) {{
            let gi = i / {t}u;
            let tt = i - gi * {t}u;
            var s = 0.0;
            for (var d = 0u; d < {hd}u; d++) {{ s += qs[gi * {hd}u + d] * kt[tt * {hd1}u + d]; }}
            {cap}
            let kp = lo + t0 + tt;
            let ok = t0 + tt < n && (p.window == 0u || p.q_pos - kp < p.window);
            sc[gi * {cmax}u + t0 + tt] = select({NEG}, s, ok);
        }}
    }}
    workgroupBarrier();
    for (var gi = 0u; gi < {g}u; gi++) {{
        var m = {NEG};
        for (var j = lidx; j < n; j += {DECODE_WG}u) {{ m = max(m, sc[gi * {cmax}u + j]); }}
        m = red_max(m, lidx);
        var l = 0.0;
        for (var j = lidx; j < n; j += {DECODE_WG}u) {{
            let s = sc[gi * {cmax}u + j];
            let pr = select(0.0, exp(s - m), s > -1e29);
            sc[gi * {cmax}u + j] = pr;
            l += pr;
        }}
        l = red_sum(l, lidx);
        if (lidx == 0u) {{ stat[gi] = m; stat[16u + gi] = l; }}
    }}
    workgroupBarrier();
    let c = lidx % {c8}u;
    let r = lidx / {c8}u;
{acc_decl}    for (var j = r; j < n; j += {lanes}u) {{
        let v = ld8_vc(row0 + j, c);
{acc_upd}    }}
    workgroupBarrier();
{acc_out}",
            hd1 = hd + 1
        );
        KernelBuilder::new(name, *env)
            .workgroup(DECODE_WG, 1, 1)
            .storage("q", Access::Read, "array<f32>")
            .storage("kc", Access::Read, cache_ty(self.dtype))
            .storage("vc", Access::Read, cache_ty(self.dtype))
            .storage("o_part", Access::ReadWrite, "array<f32>")
            .storage("ml", Access::ReadWrite, "array<f32>")
            .params(&["kv_len", "q_pos", "seg_start", "seg_len", "chunk", "split_base", "q_off", "rows", "scale", "softcap", "window"])
            .prelude(&pre)
            .body(&body)
            .build()
    }
}

/// Merges per-split partial results into the normalised output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnCombine {
    pub head_dim: u32,
}

impl AttnCombine {
    /// WGSL. Bindings `o_part`, `ml`, `out` (rw); params `rows, splits, out_off`. One workgroup
    /// of 64 invocations per row.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let hd = self.head_dim;
        let body = format!(
            "    let row = wg_linear;
    if (row >= p.rows) {{ return; }}
    var mx = {NEG};
    for (var s = 0u; s < p.splits; s++) {{ mx = max(mx, ml[(s * p.rows + row) * 2u]); }}
    var l = 0.0;
    for (var s = 0u; s < p.splits; s++) {{
        let m = ml[(s * p.rows + row) * 2u];
        l += select(0.0, exp(m - mx), m > -1e29) * ml[(s * p.rows + row) * 2u + 1u];
    }}
    let inv = select(0.0, 1.0 / l, l > 0.0);
    for (var d = lidx; d < {hd}u; d += 64u) {{
        var acc = 0.0;
        for (var s = 0u; s < p.splits; s++) {{
            let m = ml[(s * p.rows + row) * 2u];
            acc += select(0.0, exp(m - mx), m > -1e29) * o_part[(s * p.rows + row) * {hd}u + d];
        }}
        out[p.out_off + row * {hd}u + d] = acc * inv;
    }}
"
        );
        KernelBuilder::new(format!("attn_combine_hd{hd}"), *env)
            .workgroup(64, 1, 1)
            .storage("o_part", Access::Read, "array<f32>")
            .storage("ml", Access::Read, "array<f32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["rows", "splits", "out_off"])
            .body(&body)
            .build()
    }
}

/// The prefill kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefillAttn {
    pub head_dim: u32,
    pub dtype: KvDtype,
    pub softcap: bool,
    /// Write partial results (for caches split across segments) instead of the final output.
    pub partial: bool,
}

/// Queries per prefill workgroup (4 invocations each).
pub const PREFILL_BQ: u32 = 32;
/// Keys per prefill tile.
pub const PREFILL_BK: u32 = 16;

impl PrefillAttn {
    pub fn all() -> Vec<PrefillAttn> {
        let mut v = Vec::new();
        for head_dim in [64, 128, 256] {
            for dtype in [KvDtype::F16, KvDtype::Q8_0] {
                for softcap in [false, true] {
                    for partial in [false, true] {
                        v.push(PrefillAttn { head_dim, dtype, softcap, partial });
                    }
                }
            }
        }
        v
    }

    /// WGSL. Bindings `q`, `kc`, `vc`, `out` (rw; `o_part` when partial), `ml` (rw). Grid
    /// `[ceil(n_tok / 32), n_q]`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let (hd, bq, bk) = (self.head_dim, PREFILL_BQ, PREFILL_BK);
        let (nd, c8) = (hd / 4, hd / 8);
        let name = format!("attn_prefill_hd{hd}_{:?}_c{}_p{}", self.dtype, self.softcap as u8, self.partial as u8).to_lowercase();
        let mut pre = format!(
            "var<workgroup> kt: array<f32, {kts}>;\nvar<workgroup> vt: array<f32, {kts}>;\nvar<workgroup> xs: array<f32, {xs}>;\n",
            kts = bk * hd,
            xs = bq * 4 * bk
        );
        pre.push_str(V8_DEFS);
        pre.push_str(SAFE_TANH);
        pre.push_str(&ld8_fn(self.dtype, "kc", hd));
        pre.push_str(&ld8_fn(self.dtype, "vc", hd));
        let cap = softcap_expr(self.softcap);
        let write = if self.partial {
            format!(
                "    if (valid_q) {{
        let prow = p.split_base * p.rows + row;
        for (var i = 0u; i < {nd}u; i++) {{ out[prow * {hd}u + 4u * i + lane] = acc[i]; }}
        if (lane == 0u) {{ ml[prow * 2u] = m; ml[prow * 2u + 1u] = l; }}
    }}
"
            )
        } else {
            format!(
                "    if (valid_q) {{
        let inv = select(0.0, 1.0 / l, l > 0.0);
        for (var i = 0u; i < {nd}u; i++) {{ out[p.out_off + row * {hd}u + 4u * i + lane] = acc[i] * inv; }}
    }}
"
            )
        };
        let body = format!(
            "    let h = wid.y;
    let kvh = h / p.group;
    let qi = lidx / 4u;
    let lane = lidx % 4u;
    let tok = wid.x * {bq}u + qi;
    let valid_q = tok < p.n_tok;
    let qpos = p.p0 + min(tok, p.n_tok - 1u);
    let row = tok * p.n_q + h;
    let scale = bitcast<f32>(p.scale);
    var qv: array<f32, {nd}>;
    var acc: array<f32, {nd}>;
    let qb = p.q_off + min(tok, p.n_tok - 1u) * p.tok_stride + h * {hd}u;
    for (var i = 0u; i < {nd}u; i++) {{ qv[i] = q[qb + 4u * i + lane] * scale; acc[i] = 0.0; }}
    var m = {NEG};
    var l = 0.0;
    // Keys this tile of queries can see, inside this segment.
    let last_q = p.p0 + min(wid.x * {bq}u + {bq}u, p.n_tok) - 1u;
    let first_q = p.p0 + wid.x * {bq}u;
    var k_lo = p.seg_start;
    if (p.window > 0u && first_q + 1u > p.window) {{ k_lo = max(k_lo, first_q + 1u - p.window); }}
    let k_hi = min(min(last_q + 1u, p.kv_len), p.seg_start + p.seg_len);
    var s: array<f32, {bk}>;
    for (var t0 = k_lo; t0 < k_hi; t0 += {bk}u) {{
        workgroupBarrier();
        for (var i = lidx; i < {bk}u * {c8}u; i += 128u) {{
            let tt = i / {c8}u;
            let c = i - tt * {c8}u;
            var kv = V8(vec4<f32>(0.0), vec4<f32>(0.0));
            var vv = kv;
            if (t0 + tt < k_hi) {{
                let r = kvh * p.seg_len + t0 + tt - p.seg_start;
                kv = ld8_kc(r, c);
                vv = ld8_vc(r, c);
            }}
            let o = tt * {hd}u + c * 8u;
            kt[o] = kv.a.x; kt[o + 1u] = kv.a.y; kt[o + 2u] = kv.a.z; kt[o + 3u] = kv.a.w;
            kt[o + 4u] = kv.b.x; kt[o + 5u] = kv.b.y; kt[o + 6u] = kv.b.z; kt[o + 7u] = kv.b.w;
            vt[o] = vv.a.x; vt[o + 1u] = vv.a.y; vt[o + 2u] = vv.a.z; vt[o + 3u] = vv.a.w;
            vt[o + 4u] = vv.b.x; vt[o + 5u] = vv.b.y; vt[o + 6u] = vv.b.z; vt[o + 7u] = vv.b.w;
        }}
        workgroupBarrier();
        for (var k = 0u; k < {bk}u; k++) {{
            var d = 0.0;
            for (var i = 0u; i < {nd}u; i++) {{ d += qv[i] * kt[k * {hd}u + 4u * i + lane]; }}
            xs[lidx * {bk}u + k] = d;
        }}
        workgroupBarrier();
        var mt = {NEG};
        for (var k = 0u; k < {bk}u; k++) {{
            let b = qi * 4u * {bk}u + k;
            var sv = xs[b] + xs[b + {bk}u] + xs[b + {bk2}u] + xs[b + {bk3}u];
            {{ var s = sv; {cap} sv = s; }}
            let kp = t0 + k;
            let ok = kp < k_hi && kp <= qpos && (p.window == 0u || qpos - kp < p.window);
            s[k] = select({NEG}, sv, ok);
            mt = max(mt, s[k]);
        }}
        let mn = max(m, mt);
        let corr = exp(m - mn);
        var ps = 0.0;
        for (var k = 0u; k < {bk}u; k++) {{
            let pr = select(0.0, exp(s[k] - mn), s[k] > -1e29);
            s[k] = pr;
            ps += pr;
        }}
        l = l * corr + ps;
        m = mn;
        for (var i = 0u; i < {nd}u; i++) {{
            var a = acc[i] * corr;
            for (var k = 0u; k < {bk}u; k++) {{ a += s[k] * vt[k * {hd}u + 4u * i + lane]; }}
            acc[i] = a;
        }}
    }}
{write}",
            bk2 = 2 * bk,
            bk3 = 3 * bk
        );
        KernelBuilder::new(name, *env)
            .workgroup(128, 1, 1)
            .storage("q", Access::Read, "array<f32>")
            .storage("kc", Access::Read, cache_ty(self.dtype))
            .storage("vc", Access::Read, cache_ty(self.dtype))
            .storage("out", Access::ReadWrite, "array<f32>")
            .storage("ml", Access::ReadWrite, "array<f32>")
            .params(&["n_tok", "n_q", "group", "p0", "kv_len", "seg_start", "seg_len", "q_off", "tok_stride", "rows", "split_base", "out_off", "scale", "softcap", "window"])
            .prelude(&pre)
            .body(&body)
            .build()
    }
}


/// One recorded dispatch of a plan.
struct Step {
    kernel: Arc<Kernel>,
    group: BoundGroup,
    params: Vec<u32>,
    grid: [u32; 3],
}

/// Attention dispatches prepared once (kernels compiled, bind groups and partial buffers made),
/// recordable any number of times. Built by [`DecodePlan::new`] or [`PrefillPlan::new`].
pub struct AttnPlan {
    steps: Vec<Step>,
    /// The output, `[n_tok, n_q, head_dim]` f32.
    pub out: Tensor,
}

/// Flash-decoding plan (see [`decode`]).
pub type DecodePlan = AttnPlan;
/// Prefill plan (see [`prefill`]).
pub type PrefillPlan = AttnPlan;

impl AttnPlan {
    fn step(ctx: &GpuContext, src: &KernelSource, bindings: &[Binding], params: Vec<u32>, grid: [u32; 3]) -> Result<Step> {
        let kernel = ctx.kernel(src)?;
        let group = ctx.bind(&kernel, bindings)?;
        Ok(Step { kernel, group, params, grid })
    }

    /// Records the plan's dispatches.
    pub fn record(&self, rec: &mut Recorder) -> numr::Result<()> {
        for s in &self.steps {
            rec.dispatch(&s.kernel, &s.group, &s.params, s.grid)?;
        }
        Ok(())
    }

    /// Dispatches per recording.
    pub fn dispatches(&self) -> usize {
        self.steps.len()
    }

    /// Flash-decoding of one token: see [`decode`].
    #[allow(clippy::too_many_arguments)]
    pub fn decode(ctx: &GpuContext, q: &Binding, q_off: usize, n_q: usize, cache: &KvCache, layer: usize, kv_len: usize, opts: &AttnOptions) -> Result<AttnPlan> {
        let (hd, group) = check_heads(cache, layer, n_q)?;
        if kv_len == 0 || kv_len > cache.capacity() {
            return Err(OpsError::ContextOverflow { needed: kv_len, capacity: cache.capacity() });
        }
        let cfg = DecodeAttn { head_dim: hd as u32, group: group as u32, dtype: cache.config().dtype, softcap: opts.softcap.is_some() };
        let n_kv = cache.config().n_kv_heads;
        // Enough splits for about 1024 workgroups, within the score buffer.
        let t = cfg.tile() as usize;
        let want = (kv_len * n_kv).div_ceil(1024).div_ceil(t) * t;
        let chunk = want.clamp(t, cfg.max_chunk() as usize);
        let segs: Vec<_> = cache.segments(layer).iter().filter(|s| s.start < kv_len).collect();
        let splits: Vec<usize> = segs.iter().map(|s| (s.len.min(kv_len - s.start)).div_ceil(chunk)).collect();
        let total: usize = splits.iter().sum();
        let dev = numr::Device::Gpu(ctx.clone());
        let o_part = ctx.alloc((total * n_q * hd * 4) as u64, BufferKind::Storage)?;
        let ml = ctx.alloc((total * n_q * 2 * 4) as u64, BufferKind::Storage)?;
        let src = cfg.source(&env_of(ctx));
        let mut steps = Vec::new();
        let mut base = 0;
        for (seg, &ns) in segs.iter().zip(&splits) {
            let params = vec![
                kv_len as u32,
                (kv_len - 1) as u32,
                seg.start as u32,
                seg.len as u32,
                chunk as u32,
                base as u32,
                q_off as u32,
                n_q as u32,
                fbits(opts.scale),
                fbits(opts.softcap.unwrap_or(0.0)),
                opts.window.unwrap_or(0) as u32,
            ];
            let b = [q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), Binding::whole(&o_part), Binding::whole(&ml)];
            steps.push(Self::step(ctx, &src, &b, params, [ns as u32, n_kv as u32, 1])?);
            base += ns;
        }
        let out = Tensor::zeros(&[1, n_q, hd], DType::F32, &dev)?;
        let comb = AttnCombine { head_dim: hd as u32 }.source(&env_of(ctx));
        let b = [Binding::whole(&o_part), Binding::whole(&ml), out.gpu_binding(4)?.0];
        steps.push(Self::step(ctx, &comb, &b, vec![n_q as u32, total as u32, 0], grid_for(ctx, n_q as u64)?)?);
        Ok(AttnPlan { steps, out })
    }

    /// Causal prefill of a chunk: see [`prefill`].
    pub fn prefill(ctx: &GpuContext, q: &Binding, ql: &QueryLayout, cache: &KvCache, layer: usize, p0: usize, opts: &AttnOptions) -> Result<AttnPlan> {
        let (hd, group) = check_heads(cache, layer, ql.n_q)?;
        let kv_len = p0 + ql.n_tok;
        if ql.n_tok == 0 || kv_len > cache.capacity() {
            return Err(OpsError::ContextOverflow { needed: kv_len, capacity: cache.capacity() });
        }
        let segs: Vec<_> = cache.segments(layer).iter().filter(|s| s.start < kv_len).collect();
        let partial = segs.len() > 1;
        let cfg = PrefillAttn { head_dim: hd as u32, dtype: cache.config().dtype, softcap: opts.softcap.is_some(), partial };
        let rows = ql.n_tok * ql.n_q;
        let dev = numr::Device::Gpu(ctx.clone());
        let out = Tensor::zeros(&[ql.n_tok, ql.n_q, hd], DType::F32, &dev)?;
        let (o_bind, ml) = if partial {
            let o = ctx.alloc((segs.len() * rows * hd * 4) as u64, BufferKind::Storage)?;
            let ml = ctx.alloc((segs.len() * rows * 2 * 4) as u64, BufferKind::Storage)?;
            (Binding::whole(&o), Binding::whole(&ml))
        } else {
            (out.gpu_binding(4)?.0, crate::ops_common::dummy(ctx)?)
        };
        let src = cfg.source(&env_of(ctx));
        let grid = [(ql.n_tok as u32).div_ceil(PREFILL_BQ), ql.n_q as u32, 1];
        let mut steps = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let params = vec![
                ql.n_tok as u32,
                ql.n_q as u32,
                group as u32,
                p0 as u32,
                kv_len as u32,
                seg.start as u32,
                seg.len as u32,
                ql.q_off as u32,
                ql.tok_stride as u32,
                rows as u32,
                i as u32,
                0,
                fbits(opts.scale),
                fbits(opts.softcap.unwrap_or(0.0)),
                opts.window.unwrap_or(0) as u32,
            ];
            let b = [q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), o_bind.clone(), ml.clone()];
            steps.push(Self::step(ctx, &src, &b, params, grid)?);
        }
        if partial {
            let comb = AttnCombine { head_dim: hd as u32 }.source(&env_of(ctx));
            let b = [o_bind, ml, out.gpu_binding(4)?.0];
            steps.push(Self::step(ctx, &comb, &b, vec![rows as u32, segs.len() as u32, 0], grid_for(ctx, rows as u64)?)?);
        }
        Ok(AttnPlan { steps, out })
    }
}

fn check_heads(cache: &KvCache, layer: usize, n_q: usize) -> Result<(usize, usize)> {
    let c = cache.config();
    if layer >= c.n_layers || n_q == 0 || n_q % c.n_kv_heads != 0 || n_q / c.n_kv_heads > 16 || ![64, 128, 256].contains(&c.head_dim) {
        return Err(OpsError::Unsupported { what: "attention shape", reason: format!("n_q {n_q}, cache {c:?} (head_dim 64/128/256, group <= 16)") });
    }
    Ok((c.head_dim, n_q / c.n_kv_heads))
}

/// Flash-decoding of one token. `q` holds `n_q` heads of `head_dim` f32 at element `q_off`; the
/// cache holds `kv_len` positions of `layer` (the current token's K/V included; the query sits
/// at position `kv_len - 1`). Records into the context's stream; returns `[1, n_q, head_dim]` f32.
/// Engines build an [`AttnPlan`] once per shape instead.
#[allow(clippy::too_many_arguments)]
pub fn decode(ctx: &GpuContext, q: &Binding, q_off: usize, n_q: usize, cache: &KvCache, layer: usize, kv_len: usize, opts: &AttnOptions) -> Result<Tensor> {
    let plan = AttnPlan::decode(ctx, q, q_off, n_q, cache, layer, kv_len, opts)?;
    ctx.with_stream(|rec| plan.record(rec))?;
    Ok(plan.out)
}

/// Where a prefill chunk's queries live: token `t`, head `h` at element
/// `q_off + t * tok_stride + h * head_dim` of the binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLayout {
    pub n_tok: usize,
    pub n_q: usize,
    pub q_off: usize,
    pub tok_stride: usize,
}

/// Causal attention of a chunk of `n_tok` queries whose first token sits at position `p0`; the
/// cache must already hold positions `0 .. p0 + n_tok` of `layer`. Returns `[n_tok, n_q, head_dim]`.
pub fn prefill(ctx: &GpuContext, q: &Binding, ql: &QueryLayout, cache: &KvCache, layer: usize, p0: usize, opts: &AttnOptions) -> Result<Tensor> {
    let plan = AttnPlan::prefill(ctx, q, ql, cache, layer, p0, opts)?;
    ctx.with_stream(|rec| plan.record(rec))?;
    Ok(plan.out)
}

/// Naive O(n²) CPU reference. `q` is `[n_tok][n_q][hd]`, `k`/`v` are `[n_kv][kv_len][hd]`
/// (as the cache reads back), query `t` sits at position `p0 + t`. Returns `[n_tok][n_q][hd]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_ref(q: &[f32], k: &[f32], v: &[f32], n_tok: usize, n_q: usize, n_kv: usize, hd: usize, kv_len: usize, p0: usize, opts: &AttnOptions) -> Vec<f32> {
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
    out
}
