//! The subgroup flash-decoding kernel.
//!
//! # [`DecodeAttnSg`]
//! One workgroup of [`DECODE_SG_WG`] invocations handles one split (a range of positions) of one
//! KV head for `heads` of the query heads that share it. Eight lanes (of one subgroup) form a
//! *slot* that owns one key at a time: lane `c` holds the values `8(c + 8j) .. 8(c + 8j) + 8`
//! (`j < head_dim / 64`) of every query head in registers, loads the same values of the key's K
//! and V rows (16-byte loads of packed f16, the eight lanes reading one contiguous row), dots them
//! with the queries and sums the dot across the eight lanes with three `subgroupShuffleXor`.
//! Each slot runs its own online softmax in registers over `KEYS_PER_STEP` keys per step; the
//! workgroup's 16 slots merge once at the end through workgroup memory. Nothing in the key loop
//! touches workgroup memory or barriers, and every K/V byte is read once per workgroup.
//!
//! Slots are made from the subgroup builtins only: slot `sg_idx * (sg_size / 8) + sg_id / 8`,
//! lane `sg_id % 8` (never `lidx / sg_size`, which neither WGSL nor Vulkan ties to the subgroup
//! index). That is a bijection onto the 16 slots when the workgroup's subgroups are full
//! (`sg_count * sg_size == 128`, which every driver we know gives a 128-wide workgroup with
//! subgroups of 8..=128); a workgroup whose subgroups are not writes NaN (never a silently wrong
//! value), and every slot index is clamped so workgroup memory stays in bounds regardless.
//!
//! # Bounds invariant (the plans compile this kernel without runtime checks)
//! - K/V: key positions are clamped into `seg_start .. min(split end, seg_start + seg_len)`
//!   before the row is formed (`rowb + min(p, hi - 1) - seg_start`, and the loop runs only when
//!   `hi > lo >= seg_start`), `kvh < n_kv` (grid y is `n_kv * group / heads`), and lane `c < 8`
//!   reads vec4 `c + 8j < head_dim / 8` of the row: inside the segment's `[n_kv][seg_len][row]`.
//! - q: reads `q_off + tok * tok_stride + n_q * head_dim` f32 at most (`tok < n_tok`); the plan
//!   checks the binding holds that for its largest step.
//! - o_part / ml: row `(split * rows + row)` with `split = split_base + wid.x` below the split
//!   count the plan sized the buffers for (at build, for the largest `kv_len`), `row < rows`;
//!   normalised: `o_base + row * head_dim / 4 + i` inside the output binding (checked).
//! - fused: `cnt[wid.y]` (one counter per grid row), `out[out_off + row * head_dim + ..]`
//!   (checked), merge reads of splits `< p.splits <=` [`DECODE_SG_WG`] (the plan caps it).
//!
//! # The fused merge and the memory model
//! Each workgroup stores its partial (`o_part`, `ml`), then `storageBarrier()`, then one
//! invocation bumps the row's arrival counter (`atomicAdd`, relaxed, device scope); the workgroup
//! that sees `splits - 1` runs `storageBarrier()` again and reads every split's partial. naga
//! lowers `storageBarrier()` to `OpControlBarrier(Workgroup, Device, AcquireRelease |
//! UniformMemory)`: a workgroup-wide execution barrier that is also a device-scope release (before
//! the counter) and acquire (after it) fence over storage-buffer memory. The counter's RMW chain
//! makes each earlier arrival's release fence synchronize with the last arrival's acquire fence
//! (fence-fence synchronization through an atomic, SPIR-V / Vulkan memory model), so every
//! partial store happens-before the merge's loads. The module uses the GLSL450 memory model, in
//! which stores and loads are only guaranteed to reach or see device-coherent memory when the
//! variable is `Coherent`: the fused variant therefore declares `o_part`, `ml` and `out`
//! `@coherent` and needs `env.coherent` ([`super::fused_merge_supported`]; plans without it merge
//! in a second dispatch, ordered by the barrier wgpu puts between dispatches). Limits: the
//! argument covers workgroups of one dispatch on one queue; nothing waits on another workgroup
//! (no forward-progress assumption); the counter is reset by the last arrival and read again only
//! by a later dispatch (ordered by the inter-dispatch barrier).

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::*;
use crate::ops_common::SAFE_TANH;

/// Invocations per subgroup decode workgroup.
pub const DECODE_SG_WG: u32 = 128;
/// Lanes per slot (one key at a time per slot).
const SLOT: u32 = 8;
/// Keys a slot takes per step by default (their loads are all issued before any math).
pub const KEYS_PER_STEP: u32 = 2;
/// Keys per slot step the decode plans use (1 token: 4 measured ~1 us better than 2 at 32K on
/// the H200 with the fused merge; prefill keeps [`KEYS_PER_STEP`]).
pub const DECODE_KEYS_PER_STEP: u32 = 4;

/// Variant of the subgroup decode kernel (needs subgroups of at least 8 invocations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeAttnSg {
    /// Elements per head: 64, 128 or 256.
    pub head_dim: u32,
    /// Query heads per KV head.
    pub group: u32,
    /// Query heads per workgroup (divides `group`); the others go to sibling workgroups.
    pub heads: u32,
    /// Element type of the KV cache.
    pub dtype: KvDtype,
    /// Apply logit soft-capping (`cap * tanh(s / cap)`, the cap a parameter).
    pub softcap: bool,
    /// Keys a slot takes per step (1..=4).
    pub keys: u32,
    /// Write the normalised output (`[n_tok][n_q][head_dim]` f32 in the `o_part` binding) instead
    /// of a partial: for a single split over an unsegmented cache.
    pub normalised: bool,
    /// Merge the splits in the same dispatch (partials only, one query token): each workgroup
    /// writes its partial, then bumps a per-(KV head, head block) counter in `cnt`; the last one
    /// to arrive merges all splits of its heads into `out` and resets the counter to 0 (at most
    /// [`DECODE_SG_WG`] splits: one invocation per split computes the merge weights).
    pub fused: bool,
    /// With `fused` (or `normalised`: a single split): the merge also writes its output
    /// quantized to int8 per block of 32
    /// (`xq`/`xs`, the layout of [`crate::quant::Q8Activations`], block `out index / 32`), the
    /// input of an integer-dot output projection, so no quantizer dispatch runs between them.
    pub quantize: bool,
}

impl DecodeAttnSg {
    /// The variant for a shape: as many heads per workgroup as keep about 64 floats of queries
    /// and accumulators per lane (more heads per workgroup re-read K/V less but hold more
    /// registers, so fewer workgroups fit; measured best on the H200 at head_dim 128: 2 heads,
    /// 2 keys per step).
    /// Typed error for a head_dim other than 64, 128, 256 or a group outside 1..=16.
    pub fn new(head_dim: u32, group: u32, dtype: KvDtype, softcap: bool) -> Result<Self> {
        check_head_dim("DecodeAttnSg", head_dim)?;
        if !(1..=16).contains(&group) {
            return Err(OpsError::Unsupported { what: "DecodeAttnSg", reason: format!("group {group} (1..=16)") });
        }
        let nv = head_dim / 64;
        let mut heads = (4 / nv).clamp(1, group);
        while !group.is_multiple_of(heads) {
            heads -= 1;
        }
        Ok(DecodeAttnSg { head_dim, group, heads, dtype, softcap, keys: KEYS_PER_STEP, normalised: false, fused: false, quantize: false })
    }

    /// Checks the variant (every field; [`Self::source`] calls it): head_dim 64, 128 or 256,
    /// group 1..=16, heads dividing group, keys 1..=4, not both normalised and fused.
    pub fn validate(&self) -> Result<()> {
        check_head_dim("DecodeAttnSg", self.head_dim)?;
        let bad = |reason: String| Err(OpsError::Unsupported { what: "DecodeAttnSg", reason });
        if !(1..=16).contains(&self.group) || self.heads == 0 || !self.group.is_multiple_of(self.heads) {
            return bad(format!("group {} (1..=16), heads {} (must divide it)", self.group, self.heads));
        }
        if !(1..=4).contains(&self.keys) {
            return bad(format!("keys {} (1..=4)", self.keys));
        }
        if self.normalised && self.fused {
            return bad("normalised and fused together".into());
        }
        if self.quantize && !self.fused && !self.normalised {
            return bad("a quantized output needs the fused merge or the normalised output".into());
        }
        Ok(())
    }

    /// Positions one workgroup step covers (splits are multiples of it).
    pub fn step_keys(&self) -> u32 {
        DECODE_SG_WG / SLOT * self.keys
    }

    /// The variants the tests validate with naga: every supported head_dim, group (up to 4, then
    /// multiples of 4), dtype and softcap as [`Self::new`] picks them, each partial, normalised
    /// and fused, plus a few other head/key splits.
    pub fn all() -> Vec<DecodeAttnSg> {
        let mut v = Vec::new();
        for head_dim in [64, 128, 256] {
            for group in 1..=16 {
                for dtype in [KvDtype::F16, KvDtype::Q8_0] {
                    for softcap in [false, true] {
                        let Ok(c) = DecodeAttnSg::new(head_dim, group, dtype, softcap) else { continue };
                        if !v.contains(&c) && (group <= 4 || group.is_multiple_of(4)) {
                            v.push(c);
                            v.push(DecodeAttnSg { normalised: true, ..c });
                            v.push(DecodeAttnSg { fused: true, ..c });
                            v.push(DecodeAttnSg { fused: true, keys: DECODE_KEYS_PER_STEP, ..c });
                            v.push(DecodeAttnSg { fused: true, quantize: true, keys: DECODE_KEYS_PER_STEP, ..c });
                            v.push(DecodeAttnSg { normalised: true, quantize: true, heads: 1, keys: DECODE_KEYS_PER_STEP, ..c });
                            if group == 4 && !softcap {
                                v.push(DecodeAttnSg { heads: 2, keys: 1, ..c });
                                v.push(DecodeAttnSg { heads: 1, keys: 4, ..c });
                            }
                        }
                    }
                }
            }
        }
        v
    }

    /// WGSL. Bindings `q`, `kc`, `vc`, `o_part` (rw, vec4 rows), `ml` (rw); fused: `cnt` (rw,
    /// atomic), `out` (rw). Grid `[splits, n_kv * group / heads, n_tok]`: query token `t` (at
    /// `q_off + t * tok_stride`) sits at position `q_pos + t` and sees keys `..= q_pos + t`
    /// (decode: one token; prefill: a chunk, the longest rows scheduled first).
    ///
    /// Typed errors: an invalid variant ([`Self::validate`]), an environment without subgroups of
    /// at least 8, a fused variant without `env.coherent`. The module is checked (naga bounds
    /// checks); plans that validated their bindings compile it unchecked (see the module docs).
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        self.validate()?;
        if DecodeKernel::best(env) != DecodeKernel::Subgroup {
            return Err(OpsError::Unsupported { what: "DecodeAttnSg", reason: "needs subgroups of at least 8 invocations".into() });
        }
        if self.fused && !env.coherent {
            return Err(OpsError::Unsupported { what: "DecodeAttnSg fused merge", reason: "needs @coherent storage (MEMORY_DECORATION_COHERENT)".into() });
        }
        let (hd, g, h, u) = (self.head_dim, self.group, self.heads, self.keys);
        let nv = hd / 64;
        let nslot = DECODE_SG_WG / SLOT;
        let hd4 = hd / 4;
        let name = format!(
            "attn_decode_sg_hd{hd}_g{g}_h{h}_k{u}_{:?}_c{}_n{}_f{}{}",
            self.dtype,
            self.softcap as u8,
            self.normalised as u8,
            self.fused as u8,
            if self.quantize { "_q8" } else { "" }
        )
        .to_lowercase();
        let mut pre = format!("var<workgroup> sml: array<f32, {}>;\nvar<workgroup> sacc: array<vec4<f32>, {}>;\n", nslot * h * 2, nslot * hd4);
        pre.push_str(V8_DEFS);
        pre.push_str(SAFE_TANH);
        pre.push_str(&ld8_fn(self.dtype, "kc", hd));
        pre.push_str(&ld8_fn(self.dtype, "vc", hd));
        pre.push_str(
            "fn ldq(i: u32, scale: f32) -> V8 {\n    return V8(vec4<f32>(q[i], q[i + 1u], q[i + 2u], q[i + 3u]) * scale, vec4<f32>(q[i + 4u], q[i + 5u], q[i + 6u], q[i + 7u]) * scale);\n}\n",
        );
        let mut b = String::new();
        let w = |b: &mut String, s: String| b.push_str(&s);
        w(
            &mut b,
            format!(
                "    let nhb = {g}u / {h}u;
    let kvh = wid.y / nhb;
    let hb = wid.y - kvh * nhb;
    let split = p.split_base + wid.x;
    let tok = p.n_tok - 1u - wid.z;
    let q_pos = p.q_pos + tok;
    let lo0 = p.seg_start + wid.x * p.chunk;
    let hi = min(min(lo0 + p.chunk, p.seg_start + p.seg_len), q_pos + 1u);
    var lo = lo0;
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
                nslot1 = nslot - 1
            ),
        );
        for gi in 0..h {
            w(&mut b, format!("    var m{gi} = {NEG}; var l{gi} = 0.0;\n"));
            for j in 0..nv {
                w(
                    &mut b,
                    format!(
                        "    let q{gi}_{j} = ldq(qb + {o}u + 8u * (c + {j8}u), scale); var a{gi}_{j} = vec4<f32>(0.0); var b{gi}_{j} = vec4<f32>(0.0);\n",
                        o = gi * hd,
                        j8 = 8 * j
                    ),
                );
            }
        }
        w(&mut b, format!("    for (var t = lo; t < hi; t += {}u) {{\n", nslot * u));
        for k in 0..u {
            w(&mut b, format!("        let p{k} = t + slot * {u}u + {k}u;\n        let r{k} = rowb + min(p{k}, hi - 1u) - p.seg_start;\n"));
            for j in 0..nv {
                w(&mut b, format!("        let k{k}_{j} = ld8_kc(r{k}, c + {j8}u);\n", j8 = 8 * j));
            }
        }
        for k in 0..u {
            for j in 0..nv {
                w(&mut b, format!("        let v{k}_{j} = ld8_vc(r{k}, c + {j8}u);\n", j8 = 8 * j));
            }
        }
        let cap = |x: String| if self.softcap { format!("bitcast<f32>(p.softcap) * tanh_s({x} / bitcast<f32>(p.softcap))") } else { x };
        for gi in 0..h {
            w(&mut b, "        {\n".into());
            for k in 0..u {
                let dots: Vec<String> = (0..nv).map(|j| format!("dot(q{gi}_{j}.a, k{k}_{j}.a) + dot(q{gi}_{j}.b, k{k}_{j}.b)")).collect();
                w(
                    &mut b,
                    format!(
                        "            var x{k} = {};
            x{k} += subgroupShuffleXor(x{k}, 1u); x{k} += subgroupShuffleXor(x{k}, 2u); x{k} += subgroupShuffleXor(x{k}, 4u);
            let s{k} = select({NEG}, {}, p{k} < hi);
",
                        dots.join(" + "),
                        cap(format!("x{k}"))
                    ),
                );
            }
            let smax = (0..u).fold(format!("m{gi}"), |acc, k| format!("max({acc}, s{k})"));
            w(&mut b, format!("            let mn = {smax};\n            let corr = exp(m{gi} - mn);\n"));
            for k in 0..u {
                w(&mut b, format!("            let e{k} = select(0.0, exp(s{k} - mn), s{k} > -1e29);\n"));
            }
            let esum = (0..u).map(|k| format!("e{k}")).collect::<Vec<_>>().join(" + ");
            w(&mut b, format!("            l{gi} = l{gi} * corr + {esum};\n            m{gi} = mn;\n"));
            for j in 0..nv {
                let (mut ea, mut eb) = (format!("a{gi}_{j} * corr"), format!("b{gi}_{j} * corr"));
                for k in 0..u {
                    ea = format!("fma(vec4<f32>(e{k}), v{k}_{j}.a, {ea})");
                    eb = format!("fma(vec4<f32>(e{k}), v{k}_{j}.b, {eb})");
                }
                w(&mut b, format!("            a{gi}_{j} = {ea};\n            b{gi}_{j} = {eb};\n"));
            }
            w(&mut b, "        }\n".into());
        }
        w(&mut b, "    }\n".into());
        // Merge the slots: (max, sum) first, then one head's accumulators at a time.
        w(&mut b, "    if (c == 0u) {\n".into());
        for gi in 0..h {
            w(&mut b, format!("        sml[slot * {h2}u + {o}u] = m{gi}; sml[slot * {h2}u + {o1}u] = l{gi};\n", h2 = 2 * h, o = 2 * gi, o1 = 2 * gi + 1));
        }
        w(&mut b, "    }\n    workgroupBarrier();\n".into());
        for gi in 0..h {
            w(
                &mut b,
                format!(
                    "    {{
        var mx = {NEG};
        for (var s = 0u; s < {nslot}u; s++) {{ mx = max(mx, sml[s * {h2}u + {o}u]); }}
        let wt = select(0.0, exp(m{gi} - mx), m{gi} > -1e29);
",
                    h2 = 2 * h,
                    o = 2 * gi
                ),
            );
            for j in 0..nv {
                w(
                    &mut b,
                    format!(
                        "        sacc[slot * {hd4}u + 2u * (c + {j8}u)] = a{gi}_{j} * wt; sacc[slot * {hd4}u + 2u * (c + {j8}u) + 1u] = b{gi}_{j} * wt;\n",
                        j8 = 8 * j
                    ),
                );
            }
            w(
                &mut b,
                format!(
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
                    inv = if self.normalised { "select(0.0, 1.0 / l, l > 0.0)" } else { "1.0" },
                    partial = !self.normalised,
                    obase = if self.normalised { "p.o_base + " } else { "" },
                    nstore = if self.normalised && self.quantize { format!("            sq[{}u + i] = o;\n", gi * hd4) } else { String::new() },
                ),
            );
        }
        // Every block of the workgroup's heads at once, one invocation each (block j of head gi
        // is sq[(gi * hd / 32 + j) * 8 ..]); `off`: the output's first element.
        let quantize_blocks = |off: &str| {
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
        };
        if self.normalised && self.quantize {
            // The single split's output, quantized as the fused merge does (the heads' loop
            // ended on a barrier, so `sq` is complete).
            w(&mut b, quantize_blocks("4u * p.o_base"));
        }
        if self.fused {
            let nl = DECODE_SG_WG / hd4;
            pre.push_str(&format!(
                "var<workgroup> s_last: u32;\nvar<workgroup> s_w: array<f32, {DECODE_SG_WG}>;\nvar<workgroup> s_r: array<f32, {}>;\n",
                DECODE_SG_WG / SLOT
            ));
            w(
                &mut b,
                format!(
                    "    storageBarrier();
    if (lidx == 0u) {{ s_last = select(0u, 1u, atomicAdd(&cnt[wid.y], 1u) == p.splits - 1u); }}
    if (workgroupUniformLoad(&s_last) == 1u) {{
        storageBarrier();
        let d = lidx % {hd4}u;
        let sl = lidx / {hd4}u;
"
                ),
            );
            for gi in 0..h {
                let mut loads = String::new();
                let mut adds = String::new();
                for k in 0..4 {
                    loads.push_str(&format!("                let s{k} = s0 + {k}u * {nl}u; let i{k} = min(s{k}, p.splits - 1u); let o{k} = o_part[(i{k} * p.rows + row) * {hd4}u + d];\n"));
                    adds.push_str(&format!("                acc += select(0.0, s_w[i{k}], s{k} < p.splits) * o{k};\n"));
                }
                w(
                    &mut b,
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
                        qstore = if self.quantize { format!("                sq[{}u + lidx] = o;\n", gi * hd4) } else { String::new() },
                    ),
                );
            }
            if self.quantize {
                // From the merged values.
                w(&mut b, quantize_blocks("p.out_off"));
            }
            w(
                &mut b,
                "        if (lidx == 0u) { atomicStore(&cnt[wid.y], 0u); }
    }
"
                .into(),
            );
        }
        let mut kb = KernelBuilder::new(name, *env)
            .workgroup(DECODE_SG_WG, 1, 1)
            .subgroup_builtins()
            .storage("q", Access::Read, "array<f32>")
            .storage("kc", Access::Read, cache_ty(self.dtype))
            .storage("vc", Access::Read, cache_ty(self.dtype));
        // The fused merge reads other workgroups' partials: coherent storage (module docs).
        kb = if self.fused {
            kb.storage_coherent("o_part", "array<vec4<f32>>").storage_coherent("ml", "array<f32>")
        } else {
            kb.storage("o_part", Access::ReadWrite, "array<vec4<f32>>").storage("ml", Access::ReadWrite, "array<f32>")
        };
        let mut params =
            vec!["q_pos", "seg_start", "seg_len", "chunk", "split_base", "q_off", "rows", "scale", "softcap", "window", "tok_stride", "n_tok", "n_q"];
        if self.normalised {
            params.push("o_base");
        }
        if self.fused {
            kb = kb.storage("cnt", Access::ReadWrite, "array<atomic<u32>>").storage_coherent("out", "array<f32>");
            params.extend(["splits", "out_off"]);
        }
        if self.quantize {
            kb = kb.storage("xq", Access::ReadWrite, "array<vec4<u32>>").storage("xs", Access::ReadWrite, "array<vec4<f32>>");
            pre.push_str(&format!("var<workgroup> sq: array<vec4<f32>, {}>;\n{}", h * hd4, crate::quant::q8_activations::QUANT_BLOCK));
        }
        Ok(kb.params(&params).prelude(&pre).body(&b).build())
    }
}
