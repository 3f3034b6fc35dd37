//! [`Q8GemvPlan`]: the integer-dot GEMV ([`QuantGemvQ8`]) built once over a matrix and its
//! int8 activations, with its validated bindings and, optionally, an epilogue
//! ([`super::Q8Epilogue`]) or the RoPE + KV-cache store ([`super::rope_kv`]).

use numr::gpu::{Binding, BufferKind, GpuContext, Plan, Recorder, StepValues};

use super::gemv_output::{GemvOutput, out_cols};
use super::gemv_q8::QuantGemvQ8;
use super::kernel_common::grid_for;
use super::part_plan::PartKernel;
use super::q8_activations::Q8Activations;
use super::q8_epilogue::Q8Epilogue;
use super::rope_kv::RopeKv;
use super::validate::{check_binding, check_threads, env_of, mul};
use super::{QuantError, QuantMatrix, QuantPart, Result};

/// The integer-dot GEMV over every part of a matrix (one dispatch per part), reading a
/// [`Q8Activations`] (record that first). Built once; it depends on no step value (its
/// activation rows are the config's).
#[derive(Clone, Debug)]
pub struct Q8GemvPlan {
    plan: Plan,
}

impl Q8GemvPlan {
    /// Validates `cfg`, `w`, the activations (`xa` quantizes at least the config's activation
    /// rows of `w.cols` inputs) and the output(s) ([`GemvOutput::Qkv`] with `cfg.split_qkv`), each
    /// short binding a [`QuantError::BufferTooSmall`] naming it, then builds the dispatches.
    pub fn new(ctx: &GpuContext, cfg: &QuantGemvQ8, w: &QuantMatrix, xa: &Q8Activations, output: &GemvOutput) -> Result<Q8GemvPlan> {
        Self::build(ctx, cfg, w, xa, output, None, None)
    }

    /// The decode rows of a batched step (`cfg.step_rows`): the first
    /// [`StepValues::decode_rows`] rows of `xa` (which quantizes the step's rows, up to
    /// `xa.max_rows()`) into the same rows of `output` (which holds `xa.max_rows()` rows),
    /// `cfg.activation_rows` at a time inside one dispatch per part; a step without decode rows
    /// skips it. A row's numbers depend on that row alone.
    pub fn decode_rows(ctx: &GpuContext, cfg: &QuantGemvQ8, w: &QuantMatrix, xa: &Q8Activations, output: &GemvOutput) -> Result<Q8GemvPlan> {
        if !cfg.step_rows {
            return Err(QuantError::Config { what: "gemv_q8", reason: "Q8GemvPlan::decode_rows builds a step_rows config".into() });
        }
        Self::build(ctx, cfg, w, xa, output, None, None)
    }

    /// The decode Q/K/V projection with the RoPE + KV-cache epilogue (`cfg.rope_kv`, see
    /// [`super::rope_kv`]): `w` holds the Q, K and V rows of one token, `y` receives the packed
    /// row with Q and K rotated at the step's position, and the layer's cache receives K and V at
    /// slot `step.pos`.
    pub fn with_rope_kv(ctx: &GpuContext, cfg: &QuantGemvQ8, w: &QuantMatrix, xa: &Q8Activations, y: &Binding, rope: &RopeKv) -> Result<Q8GemvPlan> {
        Self::build(ctx, cfg, w, xa, &GemvOutput::Single(y.clone()), None, Some(rope))
    }

    /// [`Q8GemvPlan::new`] with the config's [`Q8Epilogue`]: the GEMV also quantizes its output
    /// into `target` (scratch from [`Q8Activations::written_by_producer`] of `w.rows` inputs, or
    /// `w.rows / 2` for the GLU), multiplied by `norm_weight` (`w.rows` f32) for
    /// [`Q8Epilogue::Quantize`] with `norm`. `target` must defer the RMSNorm exactly when the
    /// epilogue applies a norm weight. The arrival-counter epilogues need `@coherent` storage,
    /// 9 storage bindings per stage (8 without a norm) and rows per workgroup dividing 32;
    /// the local forms ([`Q8Epilogue::GluLocal`], [`Q8Epilogue::QuantizeLocal`]) one binding
    /// fewer and rows per workgroup a multiple of the block's rows (64, 32) dividing the
    /// matrix's; all need one activation row, one part and a [`GemvOutput::Single`] output
    /// ([`QuantError::Config`] / [`QuantError::Unsupported`] otherwise).
    pub fn with_epilogue(
        ctx: &GpuContext,
        cfg: &QuantGemvQ8,
        w: &QuantMatrix,
        xa: &Q8Activations,
        output: &GemvOutput,
        target: &Q8Activations,
        norm_weight: Option<&Binding>,
    ) -> Result<Q8GemvPlan> {
        Self::build(ctx, cfg, w, xa, output, Some((target, norm_weight)), None)
    }

    /// Whether the adapter runs a GEMV with `epilogue` (`@coherent` storage, enough storage
    /// bindings per stage).
    pub fn epilogue_supported(ctx: &GpuContext, epilogue: Q8Epilogue) -> bool {
        let caps = ctx.capabilities();
        (caps.coherent_memory || !epilogue.uses_arrivals()) && caps.limits.max_storage_buffers_per_shader_stage as usize >= 5 + epilogue.extra_bindings()
    }

    fn build(
        ctx: &GpuContext,
        cfg: &QuantGemvQ8,
        w: &QuantMatrix,
        xa: &Q8Activations,
        output: &GemvOutput,
        ep: Option<(&Q8Activations, Option<&Binding>)>,
        rope: Option<&RopeKv>,
    ) -> Result<Q8GemvPlan> {
        const OP: &str = "gemv_q8";
        if cfg.kind != w.kind() || !QuantGemvQ8::supports(cfg.kind) {
            return Err(QuantError::Shape { what: OP, reason: format!("kernel for {} given {}", cfg.kind.name(), w.kind().name()) });
        }
        w.validate()?;
        let m = cfg.activation_rows as usize;
        if !(1..=8).contains(&m) {
            return Err(QuantError::Shape { what: OP, reason: format!("{m} activation rows (1..=8)") });
        }
        if cfg.step_rows
            && (cfg.epilogue.is_some() || cfg.rms_scale || cfg.split_qkv || cfg.rope_kv || cfg.row_groups > 1 || cfg.per_subgroup(&env_of(ctx.capabilities())))
        {
            return Err(QuantError::Config {
                what: OP,
                reason: "step_rows with an epilogue, rms_scale, split_qkv, rope_kv, row groups or subgroup rows".into(),
            });
        }
        // The rows the bindings hold: the config's, or with `step_rows` all the activations'.
        let held = if cfg.step_rows { xa.max_rows() } else { m };
        // A step_rows GEMV clamps its rows to the step's, which the activations hold.
        if xa.k() != w.cols || (!cfg.step_rows && xa.max_rows() < m) {
            return Err(QuantError::Shape { what: OP, reason: format!("activations of {} rows x {} for {m} rows x {} inputs", xa.max_rows(), xa.k(), w.cols) });
        }
        let r = cfg.rows_per_workgroup;
        if !(1..=128).contains(&r)
            || !(1..=64).contains(&cfg.row_groups)
            || !(1..=8).contains(&cfg.unroll)
            || (cfg.subgroup_rows > 0 && !r.is_multiple_of(cfg.subgroup_rows))
        {
            return Err(QuantError::Config {
                what: OP,
                reason: format!(
                    "{r} rows per workgroup in groups of {}, {} row groups, unroll {} (1..=128 rows, 1..=64 row groups, 1..=8 unroll)",
                    cfg.subgroup_rows, cfg.row_groups, cfg.unroll
                ),
            });
        }
        let caps = ctx.capabilities();
        let env = env_of(caps);
        // Subgroup-rows mode reduces inside each subgroup; the workgroup reduction needs one
        // invocation per sum (with `rms_scale`, also one per activation row's sum of squares,
        // read back by the invocations past the row sums).
        let m_rows = cfg.activation_rows;
        let sums = if cfg.per_subgroup(&env) { 1 } else { r * m_rows + if cfg.rms_scale { m_rows } else { 0 } };
        check_threads(OP, caps, cfg.threads, sums)?;
        let cpr = w.chunks_per_row();
        // What the kernel reads of the activations: blocks `m * cpr + c`, `c < cpr`, of the
        // config's rows (xq two vec4 words per block, xs one vec4).
        let blocks = mul("activation blocks", held, cpr)?;
        check_binding(OP, "xq", &xa.xq_binding(), mul("xq words", blocks, 2)?, 16)?;
        check_binding(OP, "xs", &xa.xs_binding(), blocks, 16)?;
        if cfg.accumulate && cfg.split_qkv {
            return Err(QuantError::Config { what: OP, reason: "accumulate with split_qkv".into() });
        }
        let (outputs, qkv) = output.checked(OP, cfg.split_qkv, held, w.rows)?;
        let max = u32::try_from(held).map_err(|_| QuantError::Shape { what: OP, reason: format!("{held} activation rows") })?;
        if cfg.rms_scale != xa.deferred_rms().is_some() {
            return Err(QuantError::Config {
                what: OP,
                reason: format!("rms_scale = {} for activations that defer an RMSNorm: {}", cfg.rms_scale, xa.deferred_rms().is_some()),
            });
        }
        let eps = xa.deferred_rms().unwrap_or(0.0);
        let ep_bind = Self::check_epilogue(ctx, cfg, w, output, ep)?;
        let rope = match rope {
            _ if cfg.rope_kv != rope.is_some() => return Err(QuantError::Config { what: OP, reason: "rope_kv is built with Q8GemvPlan::with_rope_kv".into() }),
            Some(_) if cfg.split_qkv || cfg.accumulate || cfg.epilogue.is_some() => {
                return Err(QuantError::Config { what: OP, reason: "rope_kv with split_qkv, accumulate or an epilogue".into() });
            }
            Some(rk) => Some(super::rope_kv::check(ctx, OP, w, cfg.activation_rows, r, if cfg.per_subgroup(&env) { cfg.subgroup_rows } else { 0 }, rk)?),
            None => None,
        };
        let kernel = PartKernel {
            src: cfg.source(&env),
            unchecked: cfg.unchecked,
            before: vec![xa.xq_binding(), xa.xs_binding()],
            after: outputs.iter().chain(&ep_bind).cloned().chain(rope.iter().flat_map(|c| c.bindings().iter().cloned())).collect(),
            cols: out_cols(output, w.rows),
        };
        let n_wg = |part: &QuantPart| part.rows.div_ceil(r as usize).div_ceil(cfg.row_groups as usize);
        // SAFETY: the integer-dot GEMV's indices are bounded as follows, by what was
        // validated above.
        // - `xq[(m * cpr + c) * 2 + {0, 1}]` and `xs[m * cpr + c]` with `m < activation_rows`
        //   and `c = min(k, cpr - 1) < cpr` (every chunk index, the prefetched ones included,
        //   is clamped to the row); `xq` holds `2 * activation_rows * cpr` vec4 and `xs`
        //   `activation_rows * cpr` vec4 (checked). With `step_rows`, `m = min(g0 + i, p.m - 1)`
        //   with `1 <= p.m = min(decode_rows, max_rows)` (the grid is empty at 0), and both
        //   hold `max_rows` rows of blocks (checked).
        // - Weight chunk `rb + c` with `rb = min(row0 + r, rows - 1) * cpr` (`rows >= 1`) is
        //   below the part's `rows * cpr` chunks (with row groups, `row0 = (wg + g * n_wg) * r`
        //   and the group is skipped unless `row0 < rows`); `w.validate()` checked the part's sections
        //   against its rows and its buffer, so every decoder read is inside it.
        // - Stores: `y[m * n_out + g]`, `g = row0 + row` with `row < rows` tested first, so
        //   `g < N` (with `GemvOutput::Columns`, `g < offset + N <= stride = n_out`, and `y`
        //   holds `activation_rows * stride`, checked); with `split_qkv` `g < nq`, `g - nq < nk`, `g - nq - nk < nv`, `nq + nk +
        //   nv = N`; each output holds `activation_rows` of its rows (checked). With `step_rows`,
        //   stores need `m < p.m <= max_rows`, and each output holds `max_rows` rows (checked).
        // - The workgroup reduction: tree indices below `threads * v`; subgroup slots
        //   `sg_idx < min(sg_count, slots)`. Subgroup-rows mode uses no workgroup array.
        // - The RoPE + KV epilogue (`rope_kv::check`): `y[g]`, `y[g + 1]` with even `g < rows
        //   = N`; `freqs[d / 2]` with `d < rot`; cache word `(hh * seg_len + slot) * rw + d / 2`
        //   with `hh < n_kv`, `slot < seg_len` (tested), `d < hd`, inside the checked segment;
        //   `rkv[lidx]` under `lidx < rows per workgroup`.
        //   Every product above fits 32 bits (checked).
        let plan = unsafe {
            kernel.plan(
                ctx,
                w,
                |_, part| grid_for(ctx, n_wg(part)),
                |_, part, d| {
                    let d = d.set_usize("nq", qkv[0])?.set_usize("nk", qkv[1])?.set_usize("nv", qkv[2])?.set_f32("eps", eps)?.set_usize("epf", w.rows / 2)?;
                    let d = if cfg.row_groups > 1 { d.set_usize("n_wg", n_wg(part))? } else { d };
                    let d = if cfg.step_rows {
                        let grid = grid_for(ctx, n_wg(part))?;
                        d.per_step("m", move |s| s.decode_rows.min(max))?.grid_per_step(move |s| if s.decode_rows == 0 { [0, 0, 0] } else { grid })
                    } else {
                        d
                    };
                    match &rope {
                        Some(c) => c.set(d),
                        None => Ok(d),
                    }
                },
            )?
        };
        Ok(Q8GemvPlan { plan })
    }

    /// Checks the epilogue against the config, the matrix and the adapter, and returns its
    /// bindings (`cnt`, zeroed, then the target's `xq`/`xs`, then the norm weight).
    fn check_epilogue(
        ctx: &GpuContext,
        cfg: &QuantGemvQ8,
        w: &QuantMatrix,
        output: &GemvOutput,
        ep: Option<(&Q8Activations, Option<&Binding>)>,
    ) -> Result<Vec<Binding>> {
        const OP: &str = "gemv_q8 epilogue";
        let config = |reason: String| QuantError::Config { what: OP, reason };
        let Some((target, norm)) = ep else {
            return if cfg.epilogue.is_some() { Err(config("the config has an epilogue: build with Q8GemvPlan::with_epilogue".into())) } else { Ok(vec![]) };
        };
        if !cfg.epilogue.is_some() {
            return Err(config("an epilogue target for a config without an epilogue".into()));
        }
        if !Self::epilogue_supported(ctx, cfg.epilogue) {
            return Err(QuantError::Unsupported {
                name: w.name.clone(),
                reason: format!("a GEMV epilogue needs @coherent storage and {} storage bindings per stage", 5 + cfg.epilogue.extra_bindings()),
            });
        }
        let r = cfg.rows_per_workgroup;
        if cfg.activation_rows != 1 || cfg.split_qkv || w.parts.len() != 1 || !matches!(output, GemvOutput::Single(_)) {
            return Err(config(format!("an epilogue needs one activation row ({}), one part ({}) and a single output", cfg.activation_rows, w.parts.len())));
        }
        if cfg.epilogue.uses_arrivals() && !32u32.is_multiple_of(r) {
            return Err(config(format!("an epilogue with arrival counters needs rows per workgroup dividing 32 ({r})")));
        }
        // The local forms: every workgroup owns whole blocks (its rows a multiple of the block's
        // rows, every workgroup's rows inside the matrix).
        let br = cfg.epilogue.block_rows();
        if cfg.epilogue.is_local() && (!r.is_multiple_of(br) || !w.rows.is_multiple_of(r as usize)) {
            return Err(config(format!("a workgroup-local epilogue needs rows per workgroup a multiple of {br} dividing the {} rows ({r})", w.rows)));
        }
        // Eight invocations quantize a block, a vec4 each (module q8_epilogue).
        if cfg.threads < Q8Epilogue::QUANT_LANES {
            return Err(config(format!("an epilogue needs at least {} invocations per workgroup ({})", Q8Epilogue::QUANT_LANES, cfg.threads)));
        }
        let glu = cfg.epilogue.is_glu();
        let k = if glu { w.rows / 2 } else { w.rows };
        if !w.rows.is_multiple_of(cfg.epilogue.block_rows() as usize) || target.k() != k || target.max_rows() != 1 {
            return Err(QuantError::Shape { what: OP, reason: format!("{} output rows into activations of {} x {}", w.rows, target.max_rows(), target.k()) });
        }
        if cfg.epilogue.has_norm() != norm.is_some() || target.deferred_rms().is_some() != cfg.epilogue.has_norm() {
            return Err(config(format!(
                "an epilogue that applies a norm weight: {}, given one: {}, into activations deferring an RMSNorm: {}",
                cfg.epilogue.has_norm(),
                norm.is_some(),
                target.deferred_rms().is_some()
            )));
        }
        let mut b = Vec::new();
        if cfg.epilogue.uses_arrivals() {
            let blocks = k / 32;
            let cnt = ctx.alloc(4 * blocks as u64, BufferKind::Storage)?;
            ctx.write(&cnt, 0, &vec![0u8; 4 * blocks])?;
            b.push(Binding::whole(&cnt));
        }
        b.extend([target.xq_binding(), target.xs_binding()]);
        if let Some(nw) = norm {
            check_binding(OP, "norm weight", nw, k, 4)?;
            b.push(nw.clone());
        }
        Ok(b)
    }

    /// The fused Q/K/V projection: `w` holds Q, K and V rows (`rows[0] + rows[1] + rows[2]`),
    /// written to `outputs` (`m x rows[i]` f32 each); `cfg.split_qkv` must be set. The same as
    /// [`Q8GemvPlan::new`] with [`GemvOutput::Qkv`].
    pub fn new_qkv(ctx: &GpuContext, cfg: &QuantGemvQ8, w: &QuantMatrix, xa: &Q8Activations, outputs: [&Binding; 3], rows: [usize; 3]) -> Result<Q8GemvPlan> {
        let [q, k, v] = outputs.map(|b| b.clone());
        Self::new(ctx, cfg, w, xa, &GemvOutput::Qkv { q, k, v, rows })
    }

    /// The dispatches, for an engine to append to its own plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Records the GEMV dispatches (one per part); record the [`Q8Activations`] first.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        Ok(self.plan.record(rec, step)?)
    }

    /// Records into the context's implicit stream (the eager path).
    pub fn run(&self, ctx: &GpuContext, step: &StepValues) -> Result<()> {
        Ok(self.plan.run(ctx, step)?)
    }
}
