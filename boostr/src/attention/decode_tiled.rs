//! The portable flash-decoding kernel (no subgroups needed): K tiles staged in workgroup memory,
//! scores of a split in workgroup memory, tree reductions. Used where the adapter lacks subgroups
//! of at least 8 invocations.

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::*;
use crate::ops_common::SAFE_TANH;

/// The flash-decoding kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeAttn {
    /// Elements per head: 64, 128 or 256.
    pub head_dim: u32,
    /// Query heads per KV head (1..=16).
    pub group: u32,
    /// Element type of the KV cache.
    pub dtype: KvDtype,
    /// Apply logit soft-capping (`cap * tanh(s / cap)`, the cap a parameter).
    pub softcap: bool,
}

/// Invocations per decode workgroup.
pub const DECODE_WG: u32 = 128;

impl DecodeAttn {
    /// Positions per K tile.
    pub fn tile(&self) -> u32 {
        (DECODE_WG / self.group.max(1)).clamp(1, 4096 / self.head_dim.max(1)).max(1)
    }
    /// Most positions per split (the score buffer holds `group * max_chunk` floats).
    pub fn max_chunk(&self) -> u32 {
        (1024 / self.group.max(1)) / self.tile() * self.tile()
    }

    /// Checks the variant ([`Self::source`] calls it): head_dim 64, 128 or 256, group 1..=16.
    pub fn validate(&self) -> Result<()> {
        check_head_dim("DecodeAttn", self.head_dim)?;
        if !(1..=16).contains(&self.group) {
            return Err(OpsError::Unsupported { what: "DecodeAttn", reason: format!("group {} (1..=16)", self.group) });
        }
        Ok(())
    }

    /// Every head_dim, power-of-two group, dtype and softcap (the variants the tests validate with
    /// naga).
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

    /// WGSL. Bindings `q`, `kc`, `vc`, `o_part` (rw), `ml` (rw). Grid `[splits, n_kv]`: split
    /// `wid.x` of a dispatch covers positions `seg_start + wid.x * chunk ..` (at most
    /// [`Self::max_chunk`]) of the bound segment, below `kv_len`; its partial goes to split
    /// `split_base + wid.x`. Typed error for an invalid variant ([`Self::validate`]).
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        self.validate()?;
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
        Ok(KernelBuilder::new(name, *env)
            .workgroup(DECODE_WG, 1, 1)
            .storage("q", Access::Read, "array<f32>")
            .storage("kc", Access::Read, cache_ty(self.dtype))
            .storage("vc", Access::Read, cache_ty(self.dtype))
            .storage("o_part", Access::ReadWrite, "array<f32>")
            .storage("ml", Access::ReadWrite, "array<f32>")
            .params(&["kv_len", "q_pos", "seg_start", "seg_len", "chunk", "split_base", "q_off", "rows", "scale", "softcap", "window"])
            .prelude(&pre)
            .body(&body)
            .build())
    }
}
