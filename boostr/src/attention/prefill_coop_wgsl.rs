//! The WGSL of [`PrefillAttnCoop`], composed from named pieces in the order the kernel runs them
//! (see the [`super`] module docs for the algorithm): the workgroup memory, the Q fragments, the
//! softmax rows' roles, the key loop (stage K/V, `S = Q Kᵀ`, mask and row max, the lazy
//! rescale, `P`, `O += P V`) and the normalised output.

use super::{LAZY_RESCALE, PrefillAttnCoop};

/// The variant's shape, derived once: every piece reads it.
pub(super) struct CoopWgsl {
    hd: u32,
    h: u32,
    bk: u32,
    /// Query rows per workgroup (16 per subgroup) and invocations.
    rows: u32,
    threads: u32,
    /// Row strides in vec4 units: f16 rows of hd + 8 (K, V, Q) and bk + 8 (P) halves, f32 rows
    /// of bk + 4 (S) floats. The cooperative loads and stores count offsets and strides in the
    /// array's element type, so the staging stores whole vec4s.
    hs: u32,
    ss: u32,
    ps: u32,
    /// Fragments of 16 along head_dim and along a key tile.
    nd: u32,
    nk: u32,
    /// Scores per lane of a softmax row (two lanes per row).
    half: u32,
    /// vec4s per head row, and per lane of a subgroup's 16 Q rows.
    c4: u32,
    qper: u32,
    /// vec4s of a K (or V) tile, each invocation's share of them (at most 8 at a time), and
    /// whether the next tile's share is prefetched into registers (a share of at most 8).
    nv: u32,
    per: u32,
    prefetch: bool,
    /// Output fragments passed through a subgroup's `Ss` rows at a time.
    fit: u32,
}

impl CoopWgsl {
    pub(super) fn new(c: &PrefillAttnCoop) -> CoopWgsl {
        let (hd, h, bk) = (c.head_dim, c.heads, c.bk);
        let threads = 32 * h;
        let (hs, ss, ps) = ((hd + 8) / 4, (bk + 4) / 4, (bk + 8) / 4);
        let c4 = hd / 4;
        let nv = bk * c4;
        let share = nv.div_ceil(threads);
        CoopWgsl {
            hd,
            h,
            bk,
            rows: 16 * h,
            threads,
            hs,
            ss,
            ps,
            nd: hd / 16,
            nk: bk / 16,
            half: bk / 2,
            c4,
            qper: 16 * c4 / 32,
            nv,
            per: share.min(8),
            prefetch: share <= 8,
            fit: (16 * ss / 64).max(1),
        }
    }

    pub(super) fn name(&self) -> String {
        format!("attn_prefill_coop_hd{}_h{}_k{}", self.hd, self.h, self.bk)
    }

    /// Module scope: the staged Q (then K) rows, V rows, S, P, the rescale factors and the
    /// subgroups' rescale flags.
    pub(super) fn workgroup_memory(&self) -> String {
        let (rows, bk, hs) = (self.rows, self.bk, self.hs);
        format!(
            "var<workgroup> KQ: array<vec4<f16>, {kq}>;
var<workgroup> Vs: array<vec4<f16>, {vn}>;
var<workgroup> Ss: array<vec4<f32>, {sn}>;
var<workgroup> Ps: array<vec4<f16>, {pn}>;
var<workgroup> al: array<f32, {rows}>;
var<workgroup> flags: array<u32, 4>;
",
            kq = rows.max(bk) * hs,
            vn = bk * hs,
            sn = rows * self.ss,
            pn = rows * self.ps,
        )
    }

    /// The body, piece by piece.
    pub(super) fn body(&self) -> String {
        [
            self.q_fragments(),
            self.row_roles(),
            self.kv_prefetch(),
            self.key_loop_open(),
            self.stage_kv(),
            self.scores(),
            self.mask_and_max(),
            self.rescale_output(),
            self.probabilities(),
            self.accumulate_pv(),
            self.write_output(),
        ]
        .concat()
    }

    /// The workgroup's heads and tokens; Q: each subgroup stages its 16 rows (f16, scaled into
    /// log2 units), 4 values per vec4 (a lane's loads are all issued before its stores), then
    /// loads them as `nd` A fragments; the `nd` output accumulators.
    fn q_fragments(&self) -> String {
        let (h, hd, hs, c4) = (self.h, self.hd, self.hs, self.c4);
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
        for u in 0..self.qper {
            b.push_str(&format!(
                "    let qu{u} = lane + {}u;\n    let qb{u} = p.q_off + min(t0 + qu{u} / {c4}u, p.n_tok - 1u) * p.tok_stride + head * {hd}u + (qu{u} % {c4}u) * 4u;\n",
                32 * u
            ));
            b.push_str(&format!("    let qa_{u} = vec4<f32>(q[qb{u}], q[qb{u} + 1u], q[qb{u} + 2u], q[qb{u} + 3u]);\n"));
        }
        for u in 0..self.qper {
            b.push_str(&format!("    KQ[(sg * 16u + qu{u} / {c4}u) * {hs}u + qu{u} % {c4}u] = vec4<f16>(qa_{u} * qscale);\n"));
        }
        b.push_str("    workgroupBarrier();\n");
        for kk in 0..self.nd {
            b.push_str(&format!("    let iq{kk} = sg * {}u + {}u;\n    let qa{kk} = coopLoadT<coop_mat16x16<f16, A>>(&KQ[iq{kk}], {hs}u);\n", 16 * hs, 4 * kk));
        }
        for n in 0..self.nd {
            b.push_str(&format!("    var o{n} = coop_mat16x16<f32, C>();\n"));
        }
        b
    }

    /// Lane roles in the softmax (row `lane / 2`, half a tile's columns each), the running max
    /// and sum, the key range the 16 queries see, and the subgroup's `Ss` / `Ps` rows.
    fn row_roles(&self) -> String {
        let (half, bk) = (self.half, self.bk);
        format!(
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
",
            sbs = 16 * self.ss,
            pbs = 16 * self.ps,
        )
    }

    /// With prefetch: the registers that carry an invocation's share of the next tile, loaded
    /// with the first tile's before the key loop.
    fn kv_prefetch(&self) -> String {
        if !self.prefetch {
            return String::new();
        }
        let ind = "    ";
        let mut head = self.share_index(ind, "");
        for u in 0..self.per {
            head.push_str(&format!("{ind}var kw{u}: vec4<f16>;\n{ind}var vw{u}: vec4<f16>;\n"));
        }
        head.push_str(&self.load_share(ind, "k_lo", false));
        head
    }

    fn key_loop_open(&self) -> String {
        format!("    for (var k0 = k_lo; k0 < k_hi; k0 += {}u) {{\n        workgroupBarrier();\n", self.bk)
    }

    /// The indices of an invocation's share of a tile's vec4s (`base` + `lidx` + `u * threads`,
    /// clamped to the tile).
    fn share_index(&self, ind: &str, base: &str) -> String {
        (0..self.per).map(|u| format!("{ind}let vi{u} = min({base}lidx + {}u, {}u);\n", u * self.threads, self.nv - 1)).collect()
    }

    /// Loads an invocation's share of the K and V rows of the tile at `tile` (rows past the
    /// cache's end clamped to its last row) into `kw*` / `vw*` (declared here with `decl`).
    fn load_share(&self, ind: &str, tile: &str, decl: bool) -> String {
        let c4 = self.c4;
        let mut l = String::new();
        for u in 0..self.per {
            let (kw, vw) = if decl { (format!("let kw{u}"), format!("let vw{u}")) } else { (format!("kw{u}"), format!("vw{u}")) };
            l.push_str(&format!(
                "{ind}let vr{u} = (kvb + min({tile} + vi{u} / {c4}u, p.seg_len - 1u)) * {c4}u + vi{u} % {c4}u;\n{ind}{kw} = kc[vr{u}];\n{ind}{vw} = vc[vr{u}];\n"
            ));
        }
        l
    }

    /// Stage the tile's K and V rows (one vec4 of 4 halves per load and store). With prefetch,
    /// the share loaded before is stored and the next tile's share loaded right after this one
    /// is published, so its latency overlaps this tile's math; else in batches of 8, loads
    /// before stores.
    fn stage_kv(&self) -> String {
        let ind = "            ";
        let (c4, hs) = (self.c4, self.hs);
        let mut store = String::new();
        for u in 0..self.per {
            store.push_str(&format!("{ind}let so{u} = (vi{u} / {c4}u) * {hs}u + vi{u} % {c4}u;\n{ind}KQ[so{u}] = kw{u};\n{ind}Vs[so{u}] = vw{u};\n"));
        }
        if self.prefetch {
            [store, "        workgroupBarrier();\n".into(), self.load_share(ind, &format!("(k0 + {}u)", self.bk), false)].concat()
        } else {
            [
                format!("        for (var v0 = 0u; v0 < {}u; v0 += {}u) {{\n", self.nv, self.per * self.threads),
                self.share_index(ind, "v0 + "),
                self.load_share(ind, "k0", true),
                store,
                "        }\n        workgroupBarrier();\n".into(),
            ]
            .concat()
        }
    }

    /// `S = Q Kᵀ`, `nk` fragments of 16 keys, stored row-major to the subgroup's `Ss` rows.
    fn scores(&self) -> String {
        let (hs, ss) = (self.hs, self.ss);
        let mut b = String::new();
        for j in 0..self.nk {
            b.push_str(&format!("        var s{j} = coop_mat16x16<f32, C>();\n"));
        }
        for kk in 0..self.nd {
            for j in 0..self.nk {
                b.push_str(&format!(
                    "        let ik{kk}_{j} = {}u;\n        let kt{kk}_{j} = coopLoad<coop_mat16x16<f16, B>>(&KQ[ik{kk}_{j}], {hs}u);\n        s{j} = coopMultiplyAdd(qa{kk}, kt{kk}_{j}, s{j});\n",
                    16 * j * hs + 4 * kk
                ));
            }
        }
        for j in 0..self.nk {
            b.push_str(&format!("        let is{j} = sb + {}u;\n        coopStoreT(s{j}, &Ss[is{j}], {ss}u);\n", 4 * j));
        }
        b
    }

    /// Mask (causal, window, past `kv_len`) and take the row max, four scores per
    /// workgroup-memory load; then the workgroup-uniform decision to rescale, opening its block
    /// with the new max and the rows' factors in `al`.
    fn mask_and_max(&self) -> String {
        format!(
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
            h4 = self.half / 4,
            ss = self.ss,
            lazy = LAZY_RESCALE,
        )
    }

    /// Rescale the output accumulators through `Ss`, closing the rescale block.
    fn rescale_output(&self) -> String {
        let mut b = through_ss(
            self.nd,
            self.fit,
            "            ",
            "ir",
            |_, ge| format!("            for (var e = lane; e < {ge}u; e += 32u) {{ Ss[sb + e] *= al[sg * 16u + (e % 64u) / 4u]; }}\n"),
            true,
        );
        b.push_str("        }\n");
        b
    }

    /// `P = exp2(s - m)` as f16 to the subgroup's `Ps` rows, four per vec4 store, summed into
    /// the lane's share of the row sum.
    fn probabilities(&self) -> String {
        format!(
            "        for (var i4 = 0u; i4 < {h4}u; i4++) {{
            let pv = exp2(vec4<f32>(sv[i4 * 4u], sv[i4 * 4u + 1u], sv[i4 * 4u + 2u], sv[i4 * 4u + 3u]) - vec4<f32>(m));
            lp += pv.x + pv.y + pv.z + pv.w;
            Ps[pb + r * {ps}u + c0 / 4u + i4] = vec4<f16>(pv);
        }}
        workgroupBarrier();
",
            h4 = self.half / 4,
            ps = self.ps,
        )
    }

    /// `O += P V` (the staged V rows read row-major), closing the key loop.
    fn accumulate_pv(&self) -> String {
        let (hs, ps) = (self.hs, self.ps);
        let mut b = String::new();
        for kk in 0..self.nk {
            b.push_str(&format!("        let ip{kk} = pb + {}u;\n        let pa{kk} = coopLoadT<coop_mat16x16<f16, A>>(&Ps[ip{kk}], {ps}u);\n", 4 * kk));
            for n in 0..self.nd {
                b.push_str(&format!(
                    "        let iv{kk}_{n} = {}u;\n        let vt{kk}_{n} = coopLoadT<coop_mat16x16<f16, B>>(&Vs[iv{kk}_{n}], {hs}u);\n        o{n} = coopMultiplyAdd(pa{kk}, vt{kk}_{n}, o{n});\n",
                    16 * kk * hs + 4 * n
                ));
            }
        }
        b.push_str("    }\n");
        b
    }

    /// Normalise (each row by its sum) and write f32 `[n_tok, n_q, head_dim]`, through `Ss` (a
    /// vec4 of one row per lane step).
    fn write_output(&self) -> String {
        let hd = self.hd;
        let mut b = String::from(
            "    let l = lp + subgroupShuffleXor(lp, 1u);
    if (c0 == 0u) { al[sg * 16u + r] = select(0.0, 1.0 / l, l > 0.0); }
    workgroupBarrier();
",
        );
        b.push_str(&through_ss(
            self.nd,
            self.fit,
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
        b
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
