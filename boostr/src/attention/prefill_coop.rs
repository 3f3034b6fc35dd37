//! [`PrefillAttnCoop`]: causal flash attention of a prefill chunk on cooperative matrices (f16
//! 16x16x16 tiles, f32 accumulate).
//!
//! One workgroup takes [`COOP_BQ`] queries and `heads` query heads that share one KV head, one
//! subgroup of 32 per head (so every subgroup walks the same keys, and each K/V tile is staged
//! once for all of them). Per subgroup, 16 query rows:
//! - Q is loaded once (f32 -> f16, pre-multiplied by `scale * log2(e)`) through workgroup memory
//!   into `head_dim / 16` A fragments that stay in registers.
//! - Keys go in tiles of `bk`: the workgroup stages the tile's K and V rows in workgroup memory
//!   as `vec4<f16>` (the next tile's share loaded into registers while this one is used; the
//!   fragments read straight from the cache measured slower than the subgroup kernel, about one
//!   load latency per fragment, and scalar f16 stores cost half the speed). `S = Q Kᵀ` (`Kᵀ` is the staged rows read column-major)
//!   is stored row-major to workgroup memory, where two lanes per row mask it (causal, window,
//!   past `kv_len`) and take the row max.
//! - The online softmax rescales lazily: the running max `m` moves only when some row's tile
//!   max exceeds it by more than [`LAZY_RESCALE`] (in log2 units), so `p = exp2(s - m)` stays
//!   below 2^8 and fits f16. Only then is the output rescaled, through workgroup memory (an
//!   accumulator's elements cannot be addressed); with real scores that happens in the first
//!   tiles and rarely after. The decision is workgroup-uniform (`workgroupUniformLoad` of the
//!   subgroups' flags) so that its barriers are too.
//! - `P` (f16) goes to workgroup memory, and `O += P V` reads the staged V rows row-major.
//!
//! At the end each row is divided by its sum and written as f32 (`[n_tok, n_q, head_dim]`).
//!
//! A tile's rows past the cache's end are staged as copies of its last row; with the rows past
//! `kv_len` they are masked (zero weight; the cache's rows are zeroed or stale, always finite).
//!
//! Needs an unsegmented f16 cache, head_dim 64 or 128, no soft-capping, and cooperative matrices
//! with subgroups of 32 ([`PrefillAttnCoop::supported`]); the plan falls back to the other
//! kernels elsewhere.

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::*;

/// Queries per workgroup (one 16-row fragment per subgroup).
pub const COOP_BQ: u32 = 16;

/// How far (log2 units) a row's tile max may exceed the running max before the output is
/// rescaled: probabilities stay below `2^LAZY_RESCALE`.
pub const LAZY_RESCALE: f32 = 8.0;

/// The cooperative-matrix prefill kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefillAttnCoop {
    /// Elements per head: 64 or 128.
    pub head_dim: u32,
    /// Query heads per workgroup (1..=4, dividing the GQA group): one subgroup each.
    pub heads: u32,
    /// Keys per tile: 32 or 64.
    pub bk: u32,
}

impl PrefillAttnCoop {
    /// The variant for a GQA `group`: the most heads per workgroup (up to 4) that divide it,
    /// tiles of 32 keys (64 for head_dim 64), which fit 48 KiB of workgroup memory.
    pub fn for_group(head_dim: u32, group: u32) -> PrefillAttnCoop {
        let heads = [4, 3, 2, 1].into_iter().find(|h| group.is_multiple_of(*h)).unwrap_or(1);
        PrefillAttnCoop { head_dim, heads, bk: if head_dim <= 64 { 64 } else { 32 } }
    }

    /// Every variant the tests validate with naga.
    pub fn all() -> Vec<PrefillAttnCoop> {
        let mut v = Vec::new();
        for head_dim in [64, 128] {
            for heads in 1..=4 {
                for bk in [32, 64] {
                    v.push(PrefillAttnCoop { head_dim, heads, bk });
                }
            }
        }
        v
    }

    /// Workgroup memory in bytes: the staged Q rows (then K rows), V rows, S (f32) and P (f16).
    pub fn shared_bytes(&self) -> u32 {
        let (rows, hs) = (16 * self.heads, self.head_dim + 8);
        2 * rows.max(self.bk) * hs + 2 * self.bk * hs + 4 * rows * (self.bk + 4) + 2 * rows * (self.bk + 8) + 4 * rows + 16
    }

    /// Whether `env` runs this variant: f16, subgroups of exactly 32 and cooperative matrices
    /// (the caller checks the adapter's f16 16x16x16 support), and the workgroup memory fits.
    pub fn supported(&self, env: &KernelEnv, coopmat: bool, max_shared: u32) -> bool {
        coopmat && env.f16 && env.subgroups && env.subgroup_min_size == 32 && self.valid() && self.shared_bytes() <= max_shared
    }

    fn valid(&self) -> bool {
        [64, 128].contains(&self.head_dim) && (1..=4).contains(&self.heads) && [32, 64].contains(&self.bk)
    }

    /// WGSL. Bindings `q` (f32), `kc`, `vc` (the cache's f16 rows), `out` (f32). Grid
    /// `[ceil(n_tok / 16), n_kv * group / heads]`. A typed error for a variant outside
    /// [`PrefillAttnCoop::all`] or an `env` without f16 and subgroups.
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        if !self.valid() {
            return Err(OpsError::Unsupported {
                what: "coopmat prefill attention",
                reason: format!(
                    "head size {}, {} heads per workgroup, {} keys per tile (head size 64 or 128, 1 to 4 heads, 32 or 64 keys)",
                    self.head_dim, self.heads, self.bk
                ),
            });
        }
        if !(env.f16 && env.subgroups) {
            return Err(OpsError::Unsupported { what: "coopmat prefill attention", reason: "needs f16 and subgroups".into() });
        }
        let (hd, h, bk) = (self.head_dim, self.heads, self.bk);
        let (rows, threads) = (16 * h, 32 * h);
        // Row strides in vec4 units: f16 rows of hd + 8 (K, V, Q) and bk + 8 (P) halves, f32
        // rows of bk + 4 (S) floats. The cooperative loads and stores count offsets and strides
        // in the array's element type, so the staging stores whole vec4s.
        let (hs, ss, ps) = ((hd + 8) / 4, (bk + 4) / 4, (bk + 8) / 4);
        let (nd, nk) = (hd / 16, bk / 16);
        let half = bk / 2;
        let name = format!("attn_prefill_coop_hd{hd}_h{h}_k{bk}");
        let pre = format!(
            "var<workgroup> KQ: array<vec4<f16>, {kq}>;
var<workgroup> Vs: array<vec4<f16>, {vn}>;
var<workgroup> Ss: array<vec4<f32>, {sn}>;
var<workgroup> Ps: array<vec4<f16>, {pn}>;
var<workgroup> al: array<f32, {rows}>;
var<workgroup> flags: array<u32, 4>;
",
            kq = rows.max(bk) * hs,
            vn = bk * hs,
            sn = rows * ss,
            pn = rows * ps,
        );
        // Q: each subgroup stages its 16 rows (f16, scaled into log2 units), 4 values per vec4;
        // a lane's loads are all issued before its stores.
        let c4 = hd / 4;
        let qper = 16 * c4 / 32;
        let mut b = format!(
            "    let sg = sg_idx;
    let lane = sg_id;
    let hg = p.group / {h}u;
    let kvh = wid.y / hg;
    let head = kvh * p.group + (wid.y % hg) * {h}u + sg;
    let t0 = wid.x * 16u;
    let kvb = kvh * p.seg_len;
    let qscale = bitcast<f32>(p.scale) * 1.4426950408889634;
"
        );
        for u in 0..qper {
            b.push_str(&format!(
                "    let qu{u} = lane + {}u;\n    let qb{u} = p.q_off + min(t0 + qu{u} / {c4}u, p.n_tok - 1u) * p.tok_stride + head * {hd}u + (qu{u} % {c4}u) * 4u;\n",
                32 * u
            ));
            b.push_str(&format!("    let qa_{u} = vec4<f32>(q[qb{u}], q[qb{u} + 1u], q[qb{u} + 2u], q[qb{u} + 3u]);\n"));
        }
        for u in 0..qper {
            b.push_str(&format!("    KQ[(sg * 16u + qu{u} / {c4}u) * {hs}u + qu{u} % {c4}u] = vec4<f16>(qa_{u} * qscale);\n"));
        }
        b.push_str("    workgroupBarrier();\n");
        for kk in 0..nd {
            b.push_str(&format!("    let iq{kk} = sg * {}u + {}u;\n    let qa{kk} = coopLoadT<coop_mat16x16<f16, A>>(&KQ[iq{kk}], {hs}u);\n", 16 * hs, 4 * kk));
        }
        for n in 0..nd {
            b.push_str(&format!("    var o{n} = coop_mat16x16<f32, C>();\n"));
        }
        b.push_str(&format!(
            "    // Lane roles in the softmax: row r = lane / 2, columns (lane % 2) * {half} ...
    let r = lane / 2u;
    let c0 = (lane % 2u) * {half}u;
    let tq = t0 + r;
    let qpos = p.p0 + min(tq, p.n_tok - 1u);
    var m = -1.0e30;
    var lp = 0.0;
    var sv: array<f32, {half}>;
    let first_q = p.p0 + t0;
    let k_hi = min(p.p0 + min(t0 + 16u, p.n_tok), p.kv_len);
    var k_lo = 0u;
    if (p.window > 0u && first_q + 1u > p.window) {{ k_lo = ((first_q + 1u - p.window) / {bk}u) * {bk}u; }}
    let sb = sg * {sbs}u;
    let pb = sg * {pbs}u;
    for (var k0 = k_lo; k0 < k_hi; k0 += {bk}u) {{
        workgroupBarrier();
",
            sbs = 16 * ss,
            pbs = 16 * ps,
        ));
        // Stage the tile's K and V rows (one vec4 of 4 halves per load and store). Where each
        // invocation's share of a tile is at most 8 vec4s of each, the next tile's share is
        // loaded into registers right after this one is published, so its latency overlaps this
        // tile's math; else in batches of 8, loads before stores.
        let nv = bk * c4;
        let share = nv.div_ceil(threads);
        let prefetch = share <= 8;
        let per = share.min(8);
        let load = |tile: &str, decl: bool| {
            let mut l = String::new();
            for u in 0..per {
                let (kw, vw) = if decl { (format!("let kw{u}"), format!("let vw{u}")) } else { (format!("kw{u}"), format!("vw{u}")) };
                l.push_str(&format!(
                    "            let vr{u} = (kvb + min({tile} + vi{u} / {c4}u, p.seg_len - 1u)) * {c4}u + vi{u} % {c4}u;\n            {kw} = kc[vr{u}];\n            {vw} = vc[vr{u}];\n"
                ));
            }
            l
        };
        let mut store = String::new();
        for u in 0..per {
            store.push_str(&format!(
                "            let so{u} = (vi{u} / {c4}u) * {hs}u + vi{u} % {c4}u;\n            KQ[so{u}] = kw{u};\n            Vs[so{u}] = vw{u};\n"
            ));
        }
        let index = |base: &str| (0..per).map(|u| format!("            let vi{u} = min({base}lidx + {}u, {}u);\n", u * threads, nv - 1)).collect::<String>();
        if prefetch {
            let mut head = index("");
            for u in 0..per {
                head.push_str(&format!("            var kw{u}: vec4<f16>;\n            var vw{u}: vec4<f16>;\n"));
            }
            head.push_str(&load("k_lo", false));
            let at = b.find("    for (var k0 = k_lo;").expect("the key loop");
            b.insert_str(at, &head.replace("            ", "    "));
            b.push_str(&store);
            b.push_str("        workgroupBarrier();\n");
            b.push_str(&load(&format!("(k0 + {bk}u)"), false));
        } else {
            b.push_str(&format!("        for (var v0 = 0u; v0 < {nv}u; v0 += {}u) {{\n", per * threads));
            b.push_str(&index("v0 + "));
            b.push_str(&load("k0", true));
            b.push_str(&store);
            b.push_str("        }\n        workgroupBarrier();\n");
        }
        // S = Q K^T, nk fragments of 16 keys.
        for j in 0..nk {
            b.push_str(&format!("        var s{j} = coop_mat16x16<f32, C>();\n"));
        }
        for kk in 0..nd {
            for j in 0..nk {
                b.push_str(&format!(
                    "        let ik{kk}_{j} = {}u;\n        let kt{kk}_{j} = coopLoad<coop_mat16x16<f16, B>>(&KQ[ik{kk}_{j}], {hs}u);\n        s{j} = coopMultiplyAdd(qa{kk}, kt{kk}_{j}, s{j});\n",
                    16 * j * hs + 4 * kk
                ));
            }
        }
        for j in 0..nk {
            b.push_str(&format!("        let is{j} = sb + {}u;\n        coopStoreT(s{j}, &Ss[is{j}], {ss}u);\n", 4 * j));
        }
        // Mask and take the row max, four scores per workgroup-memory load.
        b.push_str(&format!(
            "        workgroupBarrier();
        var mt = -3.0e38;
        for (var i4 = 0u; i4 < {h4}u; i4++) {{
            let s4 = Ss[sb + r * {ss}u + c0 / 4u + i4];
            for (var e = 0u; e < 4u; e++) {{
                let i = i4 * 4u + e;
                let kp = k0 + c0 + i;
                let ok = kp < k_hi && kp <= qpos && (p.window == 0u || qpos - kp < p.window);
                let s = select(-3.0e38, s4[e], ok);
                sv[i] = s;
                mt = max(mt, s);
            }}
        }}
        mt = max(mt, subgroupShuffleXor(mt, 1u));
        let need = subgroupAny(mt > m + {lazy:.1});
        if (lane == 0u) {{ flags[sg] = u32(need); }}
        let fl = workgroupUniformLoad(&flags);
        if ((fl[0] | fl[1] | fl[2] | fl[3]) != 0u) {{
            let mn = max(m, mt);
            let alpha = exp2(m - mn);
            m = mn;
            lp *= alpha;
            if (c0 == 0u) {{ al[sg * 16u + r] = alpha; }}
            workgroupBarrier();
",
            h4 = half / 4,
            lazy = LAZY_RESCALE,
        ));
        // Rescale the output accumulators through Ss.
        let fit = (16 * ss / 64).max(1);
        b.push_str(&through_ss(
            nd,
            fit,
            "            ",
            "ir",
            |_, ge| format!("            for (var e = lane; e < {ge}u; e += 32u) {{ Ss[sb + e] *= al[sg * 16u + (e % 64u) / 4u]; }}\n"),
            true,
        ));
        // P = exp2(s - m) as f16, four per vec4 store.
        b.push_str(&format!(
            "        }}
        for (var i4 = 0u; i4 < {h4}u; i4++) {{
            let pv = exp2(vec4<f32>(sv[i4 * 4u], sv[i4 * 4u + 1u], sv[i4 * 4u + 2u], sv[i4 * 4u + 3u]) - vec4<f32>(m));
            lp += pv.x + pv.y + pv.z + pv.w;
            Ps[pb + r * {ps}u + c0 / 4u + i4] = vec4<f16>(pv);
        }}
        workgroupBarrier();
",
            h4 = half / 4
        ));
        for kk in 0..nk {
            b.push_str(&format!("        let ip{kk} = pb + {}u;\n        let pa{kk} = coopLoadT<coop_mat16x16<f16, A>>(&Ps[ip{kk}], {ps}u);\n", 4 * kk));
            for n in 0..nd {
                b.push_str(&format!(
                    "        let iv{kk}_{n} = {}u;\n        let vt{kk}_{n} = coopLoadT<coop_mat16x16<f16, B>>(&Vs[iv{kk}_{n}], {hs}u);\n        o{n} = coopMultiplyAdd(pa{kk}, vt{kk}_{n}, o{n});\n",
                    16 * kk * hs + 4 * n
                ));
            }
        }
        b.push_str("    }\n");
        // Normalise and write, through Ss (a vec4 of one row per lane step).
        b.push_str(
            "    let l = lp + subgroupShuffleXor(lp, 1u);
    if (c0 == 0u) { al[sg * 16u + r] = select(0.0, 1.0 / l, l > 0.0); }
    workgroupBarrier();
",
        );
        b.push_str(&through_ss(
            nd,
            fit,
            "    ",
            "iw",
            |n, ge| {
                format!(
                    "    for (var e = lane; e < {ge}u; e += 32u) {{
        let rr = (e % 64u) / 4u;
        let t = t0 + rr;
        let d = {n}u * 16u + (e / 64u) * 16u + (e % 4u) * 4u;
        if (t < p.n_tok) {{
            let v = Ss[sb + e] * al[sg * 16u + rr];
            let o = p.out_off + (t * p.n_q + head) * {hd}u + d;
            out[o] = v.x; out[o + 1u] = v.y; out[o + 2u] = v.z; out[o + 3u] = v.w;
        }}
    }}
"
                )
            },
            false,
        ));
        Ok(KernelBuilder::new(name, *env)
            .enable_f16()
            .enable("wgpu_cooperative_matrix")
            .workgroup(threads, 1, 1)
            .subgroup_builtins()
            .storage("q", Access::Read, "array<f32>")
            .storage("kc", Access::Read, "array<vec4<f16>>")
            .storage("vc", Access::Read, "array<vec4<f16>>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["n_tok", "n_q", "group", "p0", "kv_len", "seg_len", "q_off", "tok_stride", "out_off", "scale", "window"])
            .prelude(&pre)
            .body(&b)
            .build())
    }
}

/// WGSL passing the `nd` output accumulators `o0..` through the subgroup's `Ss` rows, `fit`
/// fragments at a time (16x16 f32, 64 vec4s each, row stride 4): store them, a barrier,
/// `body(first fragment, vec4s in the group)`, a barrier, and with `reload` load them back and
/// a barrier before the next group overwrites them. `tag` names the offsets.
fn through_ss(nd: u32, fit: u32, ind: &str, tag: &str, body: impl Fn(u32, u32) -> String, reload: bool) -> String {
    let mut b = String::new();
    let mut n = 0;
    while n < nd {
        let g = fit.min(nd - n);
        for i in 0..g {
            b.push_str(&format!("{ind}let {tag}{n}_{i} = sb + {}u;\n{ind}coopStoreT(o{}, &Ss[{tag}{n}_{i}], 4u);\n", 64 * i, n + i));
        }
        b.push_str(&format!("{ind}workgroupBarrier();\n"));
        b.push_str(&body(n, 64 * g));
        b.push_str(&format!("{ind}workgroupBarrier();\n"));
        if reload {
            for i in 0..g {
                b.push_str(&format!("{ind}o{} = coopLoadT<coop_mat16x16<f32, C>>(&Ss[{tag}{n}_{i}], 4u);\n", n + i));
            }
            b.push_str(&format!("{ind}workgroupBarrier();\n"));
        }
        n += g;
    }
    b
}
