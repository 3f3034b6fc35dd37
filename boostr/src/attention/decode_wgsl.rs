//! The WGSL of [`DecodeAttnSg`], composed from named pieces in the order the kernel runs them
//! (see the [`super`] module docs for the algorithm and the bounds invariant): the workgroup
//! memory and helper functions, the slot's indices, the queries in registers, the key loop with
//! its online softmax per head, the merge of the slots, and the variants' outputs (the single
//! split's int8 output, the fused merge of the splits).

use super::super::{NEG, V8_DEFS, ld8_fn};
use super::{DECODE_SG_WG, DecodeAttnSg, SLOT};
use crate::ops_common::SAFE_TANH;

/// The variant and its derived shape: every piece reads it.
pub(super) struct SgWgsl {
    c: DecodeAttnSg,
    /// head_dim, group, heads per workgroup, keys per slot step.
    hd: u32,
    g: u32,
    h: u32,
    u: u32,
    /// Eight-value chunks a lane holds per head row (`head_dim / 64`).
    nv: u32,
    /// Slots per workgroup, and vec4s per head row.
    nslot: u32,
    hd4: u32,
}

impl SgWgsl {
    pub(super) fn new(c: &DecodeAttnSg) -> SgWgsl {
        let hd = c.head_dim;
        SgWgsl { c: *c, hd, g: c.group, h: c.heads, u: c.keys, nv: hd / 64, nslot: DECODE_SG_WG / SLOT, hd4: hd / 4 }
    }

    pub(super) fn name(&self) -> String {
        let (hd, g, h, u, c) = (self.hd, self.g, self.h, self.u, &self.c);
        format!(
            "attn_decode_sg_hd{hd}_g{g}_h{h}_k{u}_{:?}_c{}_n{}_f{}{}{}",
            c.dtype,
            c.softcap as u8,
            c.normalised as u8,
            c.fused as u8,
            if c.quantize { "_q8" } else { "" },
            if c.paged { "_paged" } else { "" }
        )
        .to_lowercase()
    }

    /// Module scope: the slots' merge arrays and the K/V/Q loaders, then the fused merge's and
    /// the int8 output's workgroup memory.
    pub(super) fn prelude(&self) -> String {
        let (c, h, hd4) = (&self.c, self.h, self.hd4);
        let mut pre = format!("var<workgroup> sml: array<f32, {}>;\nvar<workgroup> sacc: array<vec4<f32>, {}>;\n", self.nslot * h * 2, self.nslot * hd4);
        pre.push_str(V8_DEFS);
        pre.push_str(SAFE_TANH);
        pre.push_str(&ld8_fn(c.dtype, "kc", self.hd));
        pre.push_str(&ld8_fn(c.dtype, "vc", self.hd));
        pre.push_str(
            "fn ldq(i: u32, scale: f32) -> V8 {\n    return V8(vec4<f32>(q[i], q[i + 1u], q[i + 2u], q[i + 3u]) * scale, vec4<f32>(q[i + 4u], q[i + 5u], q[i + 6u], q[i + 7u]) * scale);\n}\n",
        );
        if c.fused {
            pre.push_str(&format!(
                "var<workgroup> s_last: u32;\nvar<workgroup> s_w: array<f32, {DECODE_SG_WG}>;\nvar<workgroup> s_r: array<f32, {}>;\n",
                DECODE_SG_WG / SLOT
            ));
        }
        if c.quantize {
            pre.push_str(&format!("var<workgroup> sq: array<vec4<f32>, {}>;\n{}", h * hd4, crate::quant::q8_activations::QUANT_BLOCK));
        }
        if c.paged {
            pre.push_str(
                "var<workgroup> s_tab: u32;
var<workgroup> s_pos: u32;
// The cache row of key position `kp` of KV head `kvh`, or 0xffffffff when its block lives in
// another buffer.
fn kv_row(tab: u32, kp: u32, kvh: u32) -> u32 {
    let local = tables[tab + kp / p.block_len] - p.blk_base;
    if (local >= p.blk_count) { return 0xffffffffu; }
    return (local * p.n_kv + kvh) * p.head_stride + kp % p.block_len;
}
",
            );
        }
        pre
    }

    /// The body, piece by piece.
    pub(super) fn body(&self) -> String {
        let c = &self.c;
        let mut b = [self.slot_indices(), self.load_queries(), self.key_loop(), self.merge_slots()].concat();
        if c.normalised && c.quantize {
            // The single split's output, quantized as the fused merge does (the heads' loop
            // ended on a barrier, so `sq` is complete).
            b.push_str(&self.quantize_blocks("4u * p.o_base"));
        }
        if c.fused {
            b.push_str(&self.fused_merge());
        }
        b
    }

    /// The workgroup's KV head, head block, split and token; the split's key range; the slot and
    /// lane (from the subgroup builtins only, see the module docs).
    fn slot_indices(&self) -> String {
        let (g, h, hd) = (self.g, self.h, self.hd);
        let range = if self.c.paged {
            format!(
                "    let tok = wid.z;
    if (lidx == 0u) {{
        if (p.step_mode == 1u) {{ s_tab = 0u; s_pos = p.q_pos + tok; }} else {{ s_tab = tokinfo[2u * tok]; s_pos = tokinfo[2u * tok + 1u]; }}
    }}
    let tab = workgroupUniformLoad(&s_tab);
    let q_pos = workgroupUniformLoad(&s_pos);
    // The token's own split count: `splits`, or with `split_keys` one per that many keys
    // (at most `splits`); the workgroups past it find no keys and leave empty partials.
    let sp = select(p.splits, min(p.splits, (q_pos + p.split_keys) / max(p.split_keys, 1u)), p.split_keys > 0u);
    let chunk = ((q_pos + sp) / sp + {st1}u) / {st}u * {st}u;
    let lo0 = wid.x * chunk;
    let hi = min(lo0 + chunk, q_pos + 1u);
",
                st = self.nslot * self.u,
                st1 = self.nslot * self.u - 1
            )
        } else {
            "    let tok = p.n_tok - 1u - wid.z;
    let q_pos = p.q_pos + tok;
    let lo0 = p.seg_start + wid.x * p.chunk;
    let hi = min(min(lo0 + p.chunk, p.seg_start + p.seg_len), q_pos + 1u);
"
            .to_string()
        };
        format!(
            "    let nhb = {g}u / {h}u;
    let kvh = wid.y / nhb;
    let hb = wid.y - kvh * nhb;
    let split = p.split_base + wid.x;
{range}    var lo = lo0;
    if (p.window > 0u && q_pos + 1u > p.window) {{ lo = max(lo, q_pos + 1u - p.window); }}
    let c = sg_id % {SLOT}u;
    // Full subgroups (the only layout where the slots below cover the workgroup).
    let full = sg_count * sg_size == {DECODE_SG_WG}u;
    let nanv = bitcast<f32>(0x7fc00000u + min(sg_size, 0u));
    let slot = min(sg_idx * (sg_size / {SLOT}u) + sg_id / {SLOT}u, {nslot1}u);
    let scale = bitcast<f32>(p.scale);
    let qb = p.q_off + tok * p.tok_stride + (kvh * {g}u + hb * {h}u) * {hd}u;
    let rowb = kvh * p.seg_len;
",
            nslot1 = self.nslot - 1
        )
    }

    /// Per head: the running max and sum, the lane's query values (scaled) and its output
    /// accumulators.
    fn load_queries(&self) -> String {
        let mut b = String::new();
        for gi in 0..self.h {
            b.push_str(&format!("    var m{gi} = {NEG}; var l{gi} = 0.0;\n"));
            for j in 0..self.nv {
                b.push_str(&format!(
                    "    let q{gi}_{j} = ldq(qb + {o}u + 8u * (c + {j8}u), scale); var a{gi}_{j} = vec4<f32>(0.0); var b{gi}_{j} = vec4<f32>(0.0);\n",
                    o = gi * self.hd,
                    j8 = 8 * j
                ));
            }
        }
        b
    }

    /// The key loop: each slot loads its `keys` K and V rows (all loads before any math), then
    /// per head the scores (dot across the slot's lanes, soft-capped, masked past `hi`) and the
    /// online softmax update of its sum and accumulators.
    fn key_loop(&self) -> String {
        let (u, nv) = (self.u, self.nv);
        let mut b = format!("    for (var t = lo; t < hi; t += {}u) {{\n", self.nslot * u);
        for k in 0..u {
            if self.c.paged {
                b.push_str(&format!(
                    "        let p{k} = t + slot * {u}u + {k}u;\n        let g{k} = kv_row(tab, min(p{k}, hi - 1u), kvh);\n        let ok{k} = g{k} != 0xffffffffu;\n        let r{k} = select(0u, g{k}, ok{k});\n"
                ));
            } else {
                b.push_str(&format!("        let p{k} = t + slot * {u}u + {k}u;\n        let r{k} = rowb + min(p{k}, hi - 1u) - p.seg_start;\n"));
            }
            for j in 0..nv {
                b.push_str(&format!("        let k{k}_{j} = ld8_kc(r{k}, c + {j8}u);\n", j8 = 8 * j));
            }
        }
        for k in 0..u {
            for j in 0..nv {
                b.push_str(&format!("        let v{k}_{j} = ld8_vc(r{k}, c + {j8}u);\n", j8 = 8 * j));
            }
        }
        for gi in 0..self.h {
            b.push_str(&self.online_softmax(gi));
        }
        b.push_str("    }\n");
        b
    }

    /// One head's scores for the step's keys and its online softmax update.
    fn online_softmax(&self, gi: u32) -> String {
        let (u, nv) = (self.u, self.nv);
        let cap = |x: String| if self.c.softcap { format!("bitcast<f32>(p.softcap) * tanh_s({x} / bitcast<f32>(p.softcap))") } else { x };
        let mut b = String::from("        {\n");
        for k in 0..u {
            let dots: Vec<String> = (0..nv).map(|j| format!("dot(q{gi}_{j}.a, k{k}_{j}.a) + dot(q{gi}_{j}.b, k{k}_{j}.b)")).collect();
            b.push_str(&format!(
                "            var x{k} = {};
            x{k} += subgroupShuffleXor(x{k}, 1u); x{k} += subgroupShuffleXor(x{k}, 2u); x{k} += subgroupShuffleXor(x{k}, 4u);
            let s{k} = select({NEG}, {}, p{k} < hi{ok});
",
                dots.join(" + "),
                cap(format!("x{k}")),
                ok = if self.c.paged { format!(" && ok{k}") } else { String::new() }
            ));
        }
        let smax = (0..u).fold(format!("m{gi}"), |acc, k| format!("max({acc}, s{k})"));
        b.push_str(&format!("            let mn = {smax};\n            let corr = exp(m{gi} - mn);\n"));
        for k in 0..u {
            b.push_str(&format!("            let e{k} = select(0.0, exp(s{k} - mn), s{k} > -1e29);\n"));
        }
        let esum = (0..u).map(|k| format!("e{k}")).collect::<Vec<_>>().join(" + ");
        b.push_str(&format!("            l{gi} = l{gi} * corr + {esum};\n            m{gi} = mn;\n"));
        for j in 0..nv {
            let (mut ea, mut eb) = (format!("a{gi}_{j} * corr"), format!("b{gi}_{j} * corr"));
            for k in 0..u {
                ea = format!("fma(vec4<f32>(e{k}), v{k}_{j}.a, {ea})");
                eb = format!("fma(vec4<f32>(e{k}), v{k}_{j}.b, {eb})");
            }
            b.push_str(&format!("            a{gi}_{j} = {ea};\n            b{gi}_{j} = {eb};\n"));
        }
        b.push_str("        }\n");
        b
    }

    /// Merge the slots through workgroup memory: (max, sum) first, then one head's accumulators
    /// at a time, written as the split's partial (with `ml`) or, normalised, as the output (and
    /// staged in `sq` for the int8 output).
    fn merge_slots(&self) -> String {
        let (h, c) = (self.h, &self.c);
        let mut b = String::from("    if (c == 0u) {\n");
        for gi in 0..h {
            b.push_str(&format!("        sml[slot * {h2}u + {o}u] = m{gi}; sml[slot * {h2}u + {o1}u] = l{gi};\n", h2 = 2 * h, o = 2 * gi, o1 = 2 * gi + 1));
        }
        b.push_str("    }\n    workgroupBarrier();\n");
        for gi in 0..h {
            let (g, hd4, nslot) = (self.g, self.hd4, self.nslot);
            b.push_str(&format!(
                "    {{
        var mx = {NEG};
        for (var s = 0u; s < {nslot}u; s++) {{ mx = max(mx, sml[s * {h2}u + {o}u]); }}
        let wt = select(0.0, exp(m{gi} - mx), m{gi} > -1e29);
",
                h2 = 2 * h,
                o = 2 * gi
            ));
            for j in 0..self.nv {
                b.push_str(&format!(
                    "        sacc[slot * {hd4}u + 2u * (c + {j8}u)] = a{gi}_{j} * wt; sacc[slot * {hd4}u + 2u * (c + {j8}u) + 1u] = b{gi}_{j} * wt;\n",
                    j8 = 8 * j
                ));
            }
            b.push_str(&format!(
                "        workgroupBarrier();
        let row = split * p.rows + tok * p.n_q + kvh * {g}u + hb * {h}u + {gi}u;
        var l = 0.0;
        for (var s = 0u; s < {nslot}u; s++) {{
            let ms = sml[s * {h2}u + {o}u];
            l += select(0.0, exp(ms - mx), ms > -1e29) * sml[s * {h2}u + {o1}u];
        }}
        let inv = {inv};
        for (var i = lidx; i < {hd4}u; i += {DECODE_SG_WG}u) {{
            var acc = vec4<f32>(0.0);
            for (var s = 0u; s < {nslot}u; s++) {{ acc += sacc[s * {hd4}u + i]; }}
            let o = select(vec4<f32>(nanv), acc * inv, full);
            o_part[{obase}row * {hd4}u + i] = o;
{nstore}        }}
        if (lidx == 0u && {partial}) {{
            ml[row * 2u] = select(nanv, mx, full);
            ml[row * 2u + 1u] = l;
        }}
        workgroupBarrier();
    }}
",
                h2 = 2 * h,
                o = 2 * gi,
                o1 = 2 * gi + 1,
                inv = if c.normalised { "select(0.0, 1.0 / l, l > 0.0)" } else { "1.0" },
                partial = !c.normalised,
                obase = if c.normalised { "p.o_base + " } else { "" },
                nstore = if c.normalised && c.quantize { format!("            sq[{}u + i] = o;\n", gi * hd4) } else { String::new() },
            ));
        }
        b
    }

    /// Every block of the workgroup's heads at once, one invocation each (block j of head gi is
    /// `sq[(gi * hd / 32 + j) * 8 ..]`), quantized to int8; `off`: the output's first element.
    fn quantize_blocks(&self, off: &str) -> String {
        let (g, h, hd) = (self.g, self.h, self.hd);
        let nb = hd / 32;
        let loads = (0..8).map(|i| format!("sq[lidx * 8u + {i}u]")).collect::<Vec<_>>().join(", ");
        format!(
            "    if (lidx < {}u) {{
        let row = tok * p.n_q + kvh * {g}u + hb * {h}u + lidx / {nb}u;
        quant_block(array<vec4<f32>, 8>({loads}), ({off} + row * {hd}u) / 32u + lidx % {nb}u, 0.0);
    }}
",
            h * nb
        )
    }

    /// The fused merge (module docs, "The fused merge and the memory model"): publish the
    /// partial, count the arrival; the last workgroup of the row merges every split of its heads
    /// into `out` (and the int8 output), then resets the counter.
    fn fused_merge(&self) -> String {
        let hd4 = self.hd4;
        let mut b = format!(
            "    storageBarrier();
    if (lidx == 0u) {{ s_last = select(0u, 1u, atomicAdd(&cnt[wid.y], 1u) == p.splits - 1u); }}
    if (workgroupUniformLoad(&s_last) == 1u) {{
        storageBarrier();
        let d = lidx % {hd4}u;
        let sl = lidx / {hd4}u;
"
        );
        for gi in 0..self.h {
            b.push_str(&self.merge_splits(gi));
        }
        if self.c.quantize {
            // From the merged values.
            b.push_str(&self.quantize_blocks("p.out_off"));
        }
        b.push_str(
            "        if (lidx == 0u) { atomicStore(&cnt[wid.y], 0u); }
    }
",
        );
        b
    }

    /// One head's merge of every split: the weights from the splits' (max, sum), one invocation
    /// per split, then the weighted sum of the partials, four splits per step.
    fn merge_splits(&self, gi: u32) -> String {
        let (g, h, hd, hd4) = (self.g, self.h, self.hd, self.hd4);
        let nl = DECODE_SG_WG / hd4;
        let mut loads = String::new();
        let mut adds = String::new();
        for k in 0..4 {
            loads.push_str(&format!(
                "                let s{k} = s0 + {k}u * {nl}u; let i{k} = min(s{k}, p.splits - 1u); let o{k} = o_part[(i{k} * p.rows + row) * {hd4}u + d];\n"
            ));
            adds.push_str(&format!("                acc += select(0.0, s_w[i{k}], s{k} < p.splits) * o{k};\n"));
        }
        format!(
            "        {{
            let row = tok * p.n_q + kvh * {g}u + hb * {h}u + {gi}u;
            let si = min(lidx, p.splits - 1u);
            let ms = select({NEG}, ml[(si * p.rows + row) * 2u], lidx < p.splits);
            let ls = ml[(si * p.rows + row) * 2u + 1u];
            let rm = subgroupMax(ms);
            if (sg_id == 0u) {{ s_r[min(sg_idx, {nsr1}u)] = rm; }}
            workgroupBarrier();
            var mx = {NEG};
            for (var i = 0u; i < min(sg_count, {nsr}u); i++) {{ mx = max(mx, s_r[i]); }}
            let wt = select(0.0, exp(ms - mx), ms > -1e29);
            s_w[lidx] = wt;
            let rl = subgroupAdd(wt * ls);
            workgroupBarrier();
            if (sg_id == 0u) {{ s_r[min(sg_idx, {nsr1}u)] = rl; }}
            workgroupBarrier();
            var l = 0.0;
            for (var i = 0u; i < min(sg_count, {nsr}u); i++) {{ l += s_r[i]; }}
            var acc = vec4<f32>(0.0);
            for (var s0 = sl; s0 < p.splits; s0 += {nl4}u) {{
{loads}{adds}            }}
            sacc[lidx] = acc;
            workgroupBarrier();
            if (lidx < {hd4}u) {{
                for (var i = 1u; i < {nl}u; i++) {{ acc += sacc[i * {hd4}u + lidx]; }}
                let o = acc * select(0.0, 1.0 / l, l > 0.0);
                let ob = p.out_off + row * {hd}u + 4u * lidx;
                out[ob] = o.x; out[ob + 1u] = o.y; out[ob + 2u] = o.z; out[ob + 3u] = o.w;
{qstore}            }}
            workgroupBarrier();
        }}
",
            nl4 = 4 * nl,
            nsr = DECODE_SG_WG / SLOT,
            nsr1 = DECODE_SG_WG / SLOT - 1,
            qstore = if self.c.quantize { format!("                sq[{}u + lidx] = o;\n", gi * hd4) } else { String::new() },
        )
    }
}
