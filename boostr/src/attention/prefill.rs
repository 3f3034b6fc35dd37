//! Tiled flash prefill (portable SIMT path).

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::*;
use crate::ops_common::SAFE_TANH;

/// The prefill kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefillAttn {
    /// Elements per head: 64, 128 or 256.
    pub head_dim: u32,
    /// Element type of the KV cache.
    pub dtype: KvDtype,
    /// Apply logit soft-capping (`cap * tanh(s / cap)`, the cap a parameter).
    pub softcap: bool,
    /// Write partial results (for caches split across segments) instead of the final output.
    pub partial: bool,
}

/// Queries per prefill workgroup (4 invocations each).
pub const PREFILL_BQ: u32 = 32;
/// Keys per prefill tile.
pub const PREFILL_BK: u32 = 16;

impl PrefillAttn {
    /// Every head_dim, dtype, softcap and partial flag (the variants the tests validate with naga).
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
    /// `[ceil(n_tok / 32), n_q]`. Typed error for a head_dim other than 64, 128 or 256.
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        check_head_dim("PrefillAttn", self.head_dim)?;
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
        Ok(KernelBuilder::new(name, *env)
            .workgroup(128, 1, 1)
            .storage("q", Access::Read, "array<f32>")
            .storage("kc", Access::Read, cache_ty(self.dtype))
            .storage("vc", Access::Read, cache_ty(self.dtype))
            .storage("out", Access::ReadWrite, "array<f32>")
            .storage("ml", Access::ReadWrite, "array<f32>")
            .params(&[
                "n_tok",
                "n_q",
                "group",
                "p0",
                "kv_len",
                "seg_start",
                "seg_len",
                "q_off",
                "tok_stride",
                "rows",
                "split_base",
                "out_off",
                "scale",
                "softcap",
                "window",
            ])
            .prelude(&pre)
            .body(&body)
            .build())
    }
}
