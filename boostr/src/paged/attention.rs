//! [`PagedAttn`]: causal attention of a step's tokens (decode rows and prefill chunks of several
//! sequences mixed) over the paged cache; [`super::PagedAttnPlan`] builds and records it.
//!
//! One workgroup handles one token, `heads` query heads sharing one KV head, and one split of the
//! token's keys: the token's `pos + 1` keys are cut into `splits` chunks (whole tiles each; with
//! `split_keys`, one chunk per `split_keys` keys, at most `splits`), so a long sequence spreads over several workgroups and short ones leave their extra splits empty.
//! Keys are visited in tiles of `tile` positions: K rows are gathered through the block table into
//! workgroup memory, the tile's scores go through an online softmax per head, then V rows are
//! gathered into the same memory and accumulated. Each invocation keeps up to 8 of the
//! `heads * head_dim` output values in registers. With one split and one buffer the kernel writes
//! the normalised output; otherwise it writes partials (`o_part`, `ml`: the layout of
//! [`crate::attention`]) for split `split_base + split` and [`AttnCombine`] merges them. Keys
//! whose block lives in another buffer count as masked in this dispatch (another dispatch, with
//! that buffer bound, covers them).
//!
//! Per-token values read from storage (`tok`, the table) are made uniform with
//! `workgroupUniformLoad` before they bound the loops that hold barriers.

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::PagedKvConfig;
use crate::kv_cache::KvDtype;
use crate::ops_common::{OpsError, Result, SAFE_TANH};

/// Invocations per workgroup.
pub const PAGED_ATTN_WG: u32 = 128;
/// Workgroup-memory floats for the queries (`heads * head_dim`) and for one K/V tile.
const SMEM: u32 = 1024;
/// Most query heads per workgroup.
const MAX_HEADS: u32 = 8;
/// Score of a masked key.
const NEG: &str = "-1e30";

/// The paged attention kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedAttn {
    /// Values per head (see [`PagedKvConfig::supports_head_dim`]).
    pub head_dim: u32,
    /// Query heads per workgroup (a divisor of the GQA group; see [`Self::heads_for`]).
    pub heads: u32,
    /// Storage of the cache.
    pub dtype: KvDtype,
    /// Logit soft-capping (`cap * tanh(s / cap)`, the cap a parameter).
    pub softcap: bool,
    /// Write the normalised output (one split, one buffer) instead of partials.
    pub normalised: bool,
}

impl PagedAttn {
    /// Query heads per workgroup for a head size and GQA group: the largest divisor of the group
    /// with at most 8 heads and `heads * head_dim <= 1024`.
    pub fn heads_for(head_dim: u32, group: u32) -> u32 {
        (1..=group.min(MAX_HEADS)).rev().find(|h| group.is_multiple_of(*h) && h * head_dim <= SMEM).unwrap_or(1)
    }

    /// Key positions per tile.
    pub fn tile(&self) -> u32 {
        (SMEM / (self.head_dim + 1)).min(64)
    }

    /// Every variant the tests validate with naga.
    pub fn all() -> Vec<PagedAttn> {
        let mut v = Vec::new();
        for dtype in [KvDtype::F16, KvDtype::Q8_0] {
            for head_dim in (8..=256).step_by(8).filter(|&h| PagedKvConfig::supports_head_dim(dtype, h)) {
                let head_dim = head_dim as u32;
                for heads in [1, 2, 3, 4, 8].into_iter().filter(|h| h * head_dim <= SMEM) {
                    for (softcap, normalised) in [(false, false), (true, true), (false, true)] {
                        v.push(PagedAttn { head_dim, heads, dtype, softcap, normalised });
                    }
                }
            }
        }
        v
    }

    fn validate(&self) -> Result<()> {
        if !PagedKvConfig::supports_head_dim(self.dtype, self.head_dim as usize) {
            return Err(OpsError::Unsupported { what: "paged attention", reason: format!("head size {} as {}", self.head_dim, self.dtype) });
        }
        if !(1..=MAX_HEADS).contains(&self.heads) || self.heads * self.head_dim > SMEM {
            return Err(OpsError::Unsupported { what: "paged attention", reason: format!("{} heads of size {} per workgroup", self.heads, self.head_dim) });
        }
        Ok(())
    }

    /// WGSL. Bindings `q`, `tok`, `tables`, `kc`, `vc`, `out` (rw; the output, or `o_part`) and
    /// `ml` (rw; partials' max and sum). Grid `[splits, n_kv * group / heads, n_tok]`. Key `kp`
    /// of KV head `h` lives in block `tables[table offset + kp / block_len]`, at row
    /// `(local block * n_kv + h) * head_stride + kp % block_len` of the bound buffer
    /// (`head_stride = block_len` in a paged cache). With `step_mode = 1`, token `t` sits at
    /// `q_pos + t` with table offset 0 (one sequence, nothing read from `tok`).
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        self.validate()?;
        let (hd, h, t) = (self.head_dim, self.heads, self.tile());
        let c8 = hd / 8;
        let np = (h * hd).div_ceil(PAGED_ATTN_WG);
        let mut pre = format!(
            "var<workgroup> qs: array<f32, {}>;
var<workgroup> kt: array<f32, {}>;
var<workgroup> sc: array<f32, {}>;
var<workgroup> sm: array<f32, {h}>;
var<workgroup> sl: array<f32, {h}>;
var<workgroup> scorr: array<f32, {h}>;
var<workgroup> s_tab: u32;
var<workgroup> s_pos: u32;
",
            h * hd,
            t * (hd + 1),
            h * t
        );
        pre.push_str(crate::attention::V8_DEFS);
        pre.push_str(SAFE_TANH);
        pre.push_str(&crate::attention::ld8_fn(self.dtype, "kc", hd));
        pre.push_str(&crate::attention::ld8_fn(self.dtype, "vc", hd));
        pre.push_str(&format!(
            "// The cache row of key position `kp` of KV head `kvh`, or 0xffffffff when its block lives in
// another buffer.
fn kv_row(tab: u32, kp: u32, kvh: u32) -> u32 {{
    let local = tables[tab + kp / p.block_len] - p.blk_base;
    if (local >= p.blk_count) {{ return 0xffffffffu; }}
    return (local * p.n_kv + kvh) * p.head_stride + kp % p.block_len;
}}
// Gathers the tile's rows at `t0 ..` (below `hi`) into `kt`; `which` 0: K, 1: V.
fn load_tile(tab: u32, t0: u32, hi: u32, kvh: u32, lidx: u32, which: u32) {{
    for (var i = lidx; i < {t}u * {c8}u; i += {wg}u) {{
        let tt = i / {c8}u;
        let c = i - tt * {c8}u;
        var v = V8(vec4<f32>(0.0), vec4<f32>(0.0));
        let kp = t0 + tt;
        if (kp < hi) {{
            let r = kv_row(tab, kp, kvh);
            if (r != 0xffffffffu) {{ if (which == 0u) {{ v = ld8_kc(r, c); }} else {{ v = ld8_vc(r, c); }} }}
        }}
        let o = tt * {hd1}u + c * 8u;
        kt[o] = v.a.x; kt[o + 1u] = v.a.y; kt[o + 2u] = v.a.z; kt[o + 3u] = v.a.w;
        kt[o + 4u] = v.b.x; kt[o + 5u] = v.b.y; kt[o + 6u] = v.b.z; kt[o + 7u] = v.b.w;
    }}
}}
",
            wg = PAGED_ATTN_WG,
            hd1 = hd + 1
        ));
        let cap = if self.softcap { "s = bitcast<f32>(p.softcap) * tanh_s(s / bitcast<f32>(p.softcap));" } else { "" };
        let out = if self.normalised {
            format!("out[p.out_off + row * {hd}u + d] = acc[j] * select(0.0, 1.0 / sl[gi], sl[gi] > 0.0);")
        } else {
            format!(
                "let sidx = p.split_base + wid.x;
            out[(sidx * p.rows + row) * {hd}u + d] = acc[j];
            if (d == 0u) {{ ml[(sidx * p.rows + row) * 2u] = sm[gi]; ml[(sidx * p.rows + row) * 2u + 1u] = sl[gi]; }}"
            )
        };
        let body = format!(
            "    let nhb = p.group / {h}u;
    let kvh = wid.y / nhb;
    let hb = wid.y - kvh * nhb;
    let t = wid.z;
    if (lidx == 0u) {{
        if (p.step_mode == 1u) {{ s_tab = 0u; s_pos = p.q_pos + t; }} else {{ s_tab = tok[2u * t]; s_pos = tok[2u * t + 1u]; }}
    }}
    let tab = workgroupUniformLoad(&s_tab);
    let kv_len = workgroupUniformLoad(&s_pos) + 1u;
    // The token's own split count: `splits`, or with `split_keys` one per that many keys (at
    // most `splits`); the workgroups past it find no keys and leave empty partials.
    let sp = select(p.splits, min(p.splits, (kv_len + p.split_keys - 1u) / max(p.split_keys, 1u)), p.split_keys > 0u);
    let chunk = (kv_len + sp - 1u) / sp;
    let chunk_t = (chunk + {t}u - 1u) / {t}u * {t}u;
    var lo = wid.x * chunk_t;
    let hi = min(lo + chunk_t, kv_len);
    if (p.window > 0u && kv_len > p.window) {{ lo = max(lo, kv_len - p.window); }}
    let scale = bitcast<f32>(p.scale);
    let q0 = p.q_off + t * p.tok_stride + (kvh * p.group + hb * {h}u) * {hd}u;
    for (var i = lidx; i < {h}u * {hd}u; i += {wg}u) {{ qs[i] = q[q0 + i] * scale; }}
    if (lidx < {h}u) {{ sm[lidx] = {NEG}; sl[lidx] = 0.0; }}
    var acc: array<f32, {np}>;
    for (var t0 = lo; t0 < hi; t0 += {t}u) {{
        workgroupBarrier();
        load_tile(tab, t0, hi, kvh, lidx, 0u);
        workgroupBarrier();
        for (var i = lidx; i < {h}u * {t}u; i += {wg}u) {{
            let gi = i / {t}u;
            let tt = i - gi * {t}u;
            let kp = t0 + tt;
            var s = 0.0;
            for (var d = 0u; d < {hd}u; d++) {{ s += qs[gi * {hd}u + d] * kt[tt * {hd1}u + d]; }}
            {cap}
            var ok = kp < hi;
            if (ok) {{ ok = kv_row(tab, kp, kvh) != 0xffffffffu; }}
            sc[i] = select({NEG}, s, ok);
        }}
        workgroupBarrier();
        if (lidx < {h}u) {{
            var mt = {NEG};
            for (var tt = 0u; tt < {t}u; tt++) {{ mt = max(mt, sc[lidx * {t}u + tt]); }}
            let mo = sm[lidx];
            let mn = max(mo, mt);
            scorr[lidx] = select(0.0, exp(mo - mn), mo > -1e29);
            sm[lidx] = mn;
        }}
        workgroupBarrier();
        for (var i = lidx; i < {h}u * {t}u; i += {wg}u) {{
            let s = sc[i];
            sc[i] = select(0.0, exp(s - sm[i / {t}u]), s > -1e29);
        }}
        load_tile(tab, t0, hi, kvh, lidx, 1u);
        workgroupBarrier();
        if (lidx < {h}u) {{
            var l = sl[lidx] * scorr[lidx];
            for (var tt = 0u; tt < {t}u; tt++) {{ l += sc[lidx * {t}u + tt]; }}
            sl[lidx] = l;
        }}
        for (var j = 0u; j < {np}u; j++) {{
            let k = lidx + j * {wg}u;
            if (k < {h}u * {hd}u) {{
                let gi = k / {hd}u;
                let d = k - gi * {hd}u;
                var a = acc[j] * scorr[gi];
                for (var tt = 0u; tt < {t}u; tt++) {{ a += sc[gi * {t}u + tt] * kt[tt * {hd1}u + d]; }}
                acc[j] = a;
            }}
        }}
    }}
    workgroupBarrier();
    for (var j = 0u; j < {np}u; j++) {{
        let k = lidx + j * {wg}u;
        if (k < {h}u * {hd}u) {{
            let gi = k / {hd}u;
            let d = k - gi * {hd}u;
            let row = t * p.n_q + kvh * p.group + hb * {h}u + gi;
            {out}
        }}
    }}
",
            wg = PAGED_ATTN_WG,
            hd1 = hd + 1
        );
        let name = format!("paged_attn_hd{hd}_h{h}_{}_c{}_n{}", self.dtype, self.softcap as u8, self.normalised as u8);
        Ok(KernelBuilder::new(name, *env)
            .workgroup(PAGED_ATTN_WG, 1, 1)
            .storage("q", Access::Read, "array<f32>")
            .storage("tok", Access::Read, "array<u32>")
            .storage("tables", Access::Read, "array<u32>")
            .storage("kc", Access::Read, crate::attention::cache_ty(self.dtype))
            .storage("vc", Access::Read, crate::attention::cache_ty(self.dtype))
            .storage("out", Access::ReadWrite, "array<f32>")
            .storage("ml", Access::ReadWrite, "array<f32>")
            .params(&[
                "q_off",
                "tok_stride",
                "n_q",
                "group",
                "n_kv",
                "block_len",
                "head_stride",
                "blk_base",
                "blk_count",
                "splits",
                "split_keys",
                "split_base",
                "rows",
                "out_off",
                "scale",
                "softcap",
                "window",
                "step_mode",
                "q_pos",
            ])
            .prelude(&pre)
            .body(&body)
            .build())
    }
}
