//! Chains: several dependent dispatches fused into one, so that the GPU never drains between
//! them.
//!
//! Between two dispatches that share a written buffer, wgpu records a barrier: every workgroup
//! of the first finishes, the GPU drains, and only then do the second's workgroups launch and
//! ramp up (about 4–6 µs on the H200 for a decode GEMV). A chain runs stages `0..S` (each a
//! builder kernel with its own grid, bindings and parameters) as one dispatch:
//! 1. Each workgroup takes a ticket (`atomicAdd` on a counter) when it starts; tickets
//!    `[start_k, end_k)` run stage `k`, with its own workgroup id recovered from the ticket.
//! 2. Every workgroup ends with `storageBarrier()` and adds itself to its stage's arrival
//!    counter; the one that completes the stage runs `storageBarrier()` again and raises the
//!    stage's completion flags (32 of them, one per 128-byte line, so that waiting workgroups do
//!    not all poll one address). A workgroup of stage `k > 0` first waits, every invocation
//!    spinning on flag `ticket % 32` of each earlier stage that has workgroups at this step, then
//!    runs `storageBarrier()`.
//! 3. Each stage's last workgroup, once its flags are stored, counts the stage as finished; the
//!    one that finishes the last stage (when every workgroup has arrived and none still waits)
//!    resets the counters and flags for the next dispatch.
//!
//! So stage `k` starts only after stage `k - 1` ended, as with the barrier, but its workgroups are
//! already resident and waiting when it does. **Forward progress**: tickets are taken in order,
//! so when a workgroup holds a ticket of stage `k`, every ticket of the stages before it has been
//! taken by a workgroup that is running or done, and those wait only on earlier stages; no
//! workgroup ever waits on one that has not started. **Memory model**: the waits and arrivals
//! are the release/acquire pattern of boostr's GEMV epilogues (a device-scope
//! `storageBarrier()` on each side of a relaxed atomic), and every buffer that one stage writes
//! and another touches is declared `@coherent`, so each stage sees everything the earlier stages
//! stored. Chains need [`super::Capabilities::coherent_memory`] and a GPU: CPU adapters are
//! refused (lavapipe gave wrong values in about one run in 40 under load).
//!
//! The stages' WGSL is renamed apart (`wgsl_names.rs`): module-scope names get a stage
//! prefix, bindings become one declaration per distinct buffer range (promoted to read-write
//! where any stage writes that buffer: wgpu rejects a buffer bound both read-only and
//! read-write in one dispatch), and each stage's parameters become the chain's (inlined as
//! constants when they do not fit [`super::kernel::MAX_PARAM_WORDS`]). All stages must share one
//! workgroup size.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::capabilities::Capabilities;
use super::context::GpuContext;
use super::kernel::{Access, KernelBuilder, KernelEnv, KernelParts, KernelSource, MAX_PARAM_WORDS, grid_2d};
use super::pipeline::Binding;
use super::plan::{Plan, PlanDispatch, StepValues};
use super::pool::BufferKind;
use super::wgsl_names::{Name, module_names, rewrite};
use crate::error::{NumrError, Result};

/// Completion flags per stage (waiting workgroups poll flag `ticket % FLAGS`).
const FLAGS: usize = 32;
/// Words between two flags (128 bytes: one cache line each).
const FLAG_STRIDE: usize = 32;

/// Why a set of dispatches cannot be chained.
fn refuse(message: String) -> NumrError {
    NumrError::Validation { context: "chaining dispatches".into(), message }
}

/// Why an adapter with capabilities `caps` cannot run chains (`None`: it can).
fn adapter_refusal(caps: &Capabilities) -> Option<NumrError> {
    if !caps.coherent_memory {
        return Some(refuse("the adapter has no @coherent storage".into()));
    }
    if caps.device_type == "Cpu" {
        // lavapipe gave wrong values (the first waiting workgroups saw partial data) in about one
        // run in 40 under load: workgroups that spin for others get no guarantee there.
        return Some(refuse(format!("{} is a CPU adapter: its workgroups are not guaranteed to see each other's progress", caps.adapter_name)));
    }
    None
}

/// Whether an adapter with capabilities `caps` runs chains (`@coherent` storage, not a CPU
/// adapter); elsewhere [`chain`] refuses and [`chain_plan`] leaves plans as they are.
pub fn chains_run_on(caps: &Capabilities) -> bool {
    adapter_refusal(caps).is_none()
}

/// Whether `d` can be a stage of a chain on `ctx` (a builder kernel, an adapter that runs
/// chains).
pub fn chainable(ctx: &GpuContext, d: &PlanDispatch) -> bool {
    chains_run_on(ctx.capabilities()) && d.kernel.source().parts.is_some()
}

/// The storage bindings a chain of `stages` declares (distinct buffer ranges and types, plus
/// the counters): compare with the adapter's `max_storage_buffers_per_shader_stage`.
pub fn chain_bindings(stages: &[PlanDispatch]) -> usize {
    let mut seen = HashSet::new();
    for d in stages {
        let Some(parts) = &d.kernel.source().parts else { continue };
        for (b, (_, _, ty, _)) in d.group.bindings().iter().zip(&parts.bindings) {
            seen.insert((b.buffer.id(), b.offset, b.size, ty.clone()));
        }
    }
    seen.len() + 1
}

/// A stage's value of a chain parameter: fixed, or computed per step.
enum Value {
    Fixed(u32),
    Step(Arc<dyn Fn(&StepValues) -> u32 + Send + Sync>),
}

/// The grid of `d` at `step` (zero workgroups when it is skipped).
fn stage_grid(d: &PlanDispatch, step: &StepValues) -> [u32; 3] {
    let mut w = [0u32; MAX_PARAM_WORDS];
    d.resolve(step, &mut w).unwrap_or([0, 1, 1])
}

fn count(g: [u32; 3]) -> u32 {
    g[0] * g[1] * g[2]
}

/// Fuses `stages` (at least two, run in order, each depending on everything before it) into one
/// dispatch. Errors when the adapter lacks `@coherent` storage, a stage is not a builder kernel,
/// the workgroup sizes differ, or the fused module needs more bindings or parameter words than
/// the adapter has.
pub fn chain(ctx: &GpuContext, stages: &[PlanDispatch]) -> Result<PlanDispatch> {
    chain_with(ctx, stages, Poll::default())
}

/// Who polls a waiting workgroup's flags ([`chain_with`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Poll {
    /// Every invocation spins on the flag, then `storageBarrier()` (the default).
    #[default]
    Every,
    /// Invocation 0 spins while the others wait at `workgroupBarrier()`, then
    /// `storageBarrier()`: fewer loads in flight while a stage runs.
    First,
}

/// [`chain`], with the waiting workgroups polling as `poll` says.
pub fn chain_with(ctx: &GpuContext, stages: &[PlanDispatch], poll: Poll) -> Result<PlanDispatch> {
    if let Some(e) = adapter_refusal(ctx.capabilities()) {
        return Err(e);
    }
    build(ctx, stages, poll)?.dispatch(ctx, stages)
}

/// The WGSL of the chain of `stages` ([`chain_with`]), on any adapter: to validate it where
/// chains are refused.
pub fn chain_source(ctx: &GpuContext, stages: &[PlanDispatch], poll: Poll) -> Result<KernelSource> {
    Ok(build(ctx, stages, poll)?.src)
}

/// A chain's module and what its dispatch binds and sets.
struct Built {
    src: KernelSource,
    bindings: Vec<Binding>,
    values: Vec<(String, Value)>,
    inline: bool,
    stepped: bool,
    words: usize,
}

fn build(ctx: &GpuContext, stages: &[PlanDispatch], poll: Poll) -> Result<Built> {
    let caps = ctx.capabilities();
    if stages.len() < 2 {
        return Err(refuse(format!("{} stages (at least 2)", stages.len())));
    }
    let parts: Vec<Arc<KernelParts>> = stages
        .iter()
        .map(|d| d.kernel.source().parts.clone().ok_or_else(|| refuse(format!("kernel {} is not a builder kernel", d.kernel.name()))))
        .collect::<Result<_>>()?;
    let wg = parts[0].workgroup;
    if let Some((d, p)) = stages.iter().zip(&parts).find(|(_, p)| p.workgroup != wg) {
        return Err(refuse(format!("kernel {} has workgroup size {:?}, the chain {wg:?}", d.kernel.name(), p.workgroup)));
    }
    let n = stages.len();

    // Bindings: one declaration per (buffer range, type); read-write for every range of a
    // buffer that any stage binds read-write; coherent where a written buffer is shared.
    let mut written: HashSet<u64> = HashSet::new();
    let mut users: HashMap<u64, HashSet<usize>> = HashMap::new();
    for (k, (d, p)) in stages.iter().zip(&parts).enumerate() {
        for (b, (_, access, _, _)) in d.group.bindings().iter().zip(&p.bindings) {
            if *access == Access::ReadWrite {
                written.insert(b.buffer.id());
            }
            users.entry(b.buffer.id()).or_default().insert(k);
        }
    }
    type Key = (u64, u64, u64, String);
    let mut globals: Vec<(Key, Binding, bool)> = Vec::new(); // key, range, coherent
    let mut names: Vec<HashMap<String, String>> = vec![HashMap::new(); n];
    for (k, (d, p)) in stages.iter().zip(&parts).enumerate() {
        for (b, (name, _, ty, coherent)) in d.group.bindings().iter().zip(&p.bindings) {
            let id = b.buffer.id();
            let key: Key = (id, b.offset, b.size, ty.clone());
            let shared = written.contains(&id) && users[&id].len() > 1;
            let j = match globals.iter().position(|g| g.0 == key) {
                Some(j) => j,
                None => {
                    globals.push((key, b.clone(), false));
                    globals.len() - 1
                }
            };
            globals[j].2 |= *coherent || shared;
            names[k].insert(name.clone(), format!("cb{j}"));
        }
    }
    let n_bind = globals.len() + 1;
    let limit = caps.limits.max_storage_buffers_per_shader_stage as usize;
    if n_bind > limit {
        return Err(NumrError::TooManyBindings { kernel: "chain".into(), needed: n_bind as u32, limit: limit as u32 });
    }

    // Parameters: each stage's reads, then the chain's own (per stage: end ticket, grid x, y).
    let mut values: Vec<(String, Value)> = Vec::new();
    let mut reads: Vec<HashMap<String, String>> = vec![HashMap::new(); n];
    for (k, (d, p)) in stages.iter().zip(&parts).enumerate() {
        let mut used: Vec<String> = Vec::new();
        for src in [&p.prelude, &p.body] {
            rewrite(src, &mut |nm| {
                if let Name::Param(x) = nm
                    && !used.iter().any(|u| u == x)
                {
                    used.push(x.to_string());
                }
                None
            });
        }
        for x in used {
            let idx = d.kernel.param_index(&x).ok_or_else(|| refuse(format!("kernel {} reads p.{x}, which it does not declare", d.kernel.name())))?;
            let v = match d.per_step.iter().find(|(i, _)| *i == idx) {
                Some(_) => {
                    let stage = d.clone();
                    Value::Step(Arc::new(move |s: &StepValues| {
                        let mut w = [0u32; MAX_PARAM_WORDS];
                        stage.resolve(s, &mut w);
                        w[idx]
                    }))
                }
                None => Value::Fixed(d.params[idx]),
            };
            let cname = format!("s{k}_{x}");
            reads[k].insert(x, cname.clone());
            values.push((cname, v));
        }
    }
    let stepped = stages.iter().any(|d| d.grid_fn.is_some());
    for k in 0..n {
        if stepped {
            let st: Vec<PlanDispatch> = stages[..=k].to_vec();
            values.push((format!("c_e{k}"), Value::Step(Arc::new(move |s: &StepValues| st.iter().map(|d| count(stage_grid(d, s))).sum()))));
            for (dim, tag) in [(0usize, "x"), (1, "y")] {
                let d = stages[k].clone();
                values.push((format!("c_{tag}{k}"), Value::Step(Arc::new(move |s: &StepValues| stage_grid(&d, s)[dim].max(1)))));
            }
        } else {
            values.push((format!("c_e{k}"), Value::Fixed(stages[..=k].iter().map(|d| count(d.grid)).sum())));
            values.push((format!("c_x{k}"), Value::Fixed(stages[k].grid[0].max(1))));
            values.push((format!("c_y{k}"), Value::Fixed(stages[k].grid[1].max(1))));
        }
    }
    // Inline the fixed values when the words do not fit.
    let inline = values.len() > MAX_PARAM_WORDS;
    let fixed: HashMap<String, u32> = values.iter().filter_map(|(nm, v)| if let Value::Fixed(x) = v { Some((nm.clone(), *x)) } else { None }).collect();
    let pv = |nm: &str| -> String { if inline && let Some(x) = fixed.get(nm) { format!("{x}u") } else { format!("p.{nm}") } };
    let param_names: Vec<String> = values.iter().filter(|(_, v)| !(inline && matches!(v, Value::Fixed(_)))).map(|(nm, _)| nm.clone()).collect();
    if param_names.len() > MAX_PARAM_WORDS {
        return Err(NumrError::ParamsTooLarge { kernel: "chain".into(), needed: param_names.len() * 4, limit: MAX_PARAM_WORDS * 4 });
    }

    // The module: each stage's prelude and body renamed apart, a function per stage, and main.
    let sg = parts.iter().any(|p| p.subgroup_builtins);
    let mut pre = String::from("var<workgroup> chain_t: u32;\n");
    let (wx, wy, wz) = (wg[0], wg[1], wg[2]);
    for (k, p) in parts.iter().enumerate() {
        let module: HashSet<String> = module_names(&p.prelude).into_iter().collect();
        let mut f = |nm: Name| -> Option<String> {
            match nm {
                Name::Param(x) => Some(pv(&reads[k][x])),
                Name::Ident(id) if module.contains(id) => Some(format!("s{k}_{id}")),
                Name::Ident(id) => names[k].get(id).cloned(),
            }
        };
        pre.push_str(&rewrite(&p.prelude, &mut f));
        pre.push('\n');
        let body = rewrite(&p.body, &mut f);
        let sg_args = if p.subgroup_builtins { ", sg_size: u32, sg_id: u32, sg_idx: u32, sg_count: u32" } else { "" };
        let start = if k == 0 { "0u".to_string() } else { pv(&format!("c_e{}", k - 1)) };
        let (end, gx, gy) = (pv(&format!("c_e{k}")), pv(&format!("c_x{k}")), pv(&format!("c_y{k}")));
        pre.push_str(&format!(
            "fn s{k}_main(lid: vec3<u32>, lidx: u32{sg_args}) {{
    let wg_linear = workgroupUniformLoad(&chain_t) - {start};
    let nwg = vec3<u32>({gx}, {gy}, ({end} - {start}) / ({gx} * {gy}));
    let wid = vec3<u32>(wg_linear % nwg.x, (wg_linear / nwg.x) % nwg.y, wg_linear / (nwg.x * nwg.y));
    let gid = wid * vec3<u32>({wx}u, {wy}u, {wz}u) + lid;
{body}
}}
"
        ));
    }
    // Counter words, each on its own 128-byte line: the ticket, per stage its arrivals, the
    // finished count (every workgroup adds to the ticket and to its stage's arrivals, and those
    // should not queue behind each other), then per stage FLAGS completion flags, so that the
    // waiting workgroups poll FLAGS lines instead of one.
    let fin = (n + 1) * FLAG_STRIDE;
    let flag0 = fin + FLAG_STRIDE;
    let words = flag0 + n * FLAGS * FLAG_STRIDE;
    let total = pv(&format!("c_e{}", n - 1));
    let start_of = |k: usize| if k == 0 { "0u".to_string() } else { pv(&format!("c_e{}", k - 1)) };
    let count_of = |k: usize| format!("({} - {})", pv(&format!("c_e{k}")), start_of(k));
    // The stages with workgroups at this step (an empty one has no last workgroup).
    let live = (0..n).map(|k| format!("select(0u, 1u, {} > 0u)", count_of(k))).collect::<Vec<_>>().join(" + ");
    let mut body = format!(
        "    if (wg_linear >= {total}) {{ return; }}
    if (lidx == 0u) {{ chain_t = atomicAdd(&chain_cnt[0], 1u); }}
    let t = workgroupUniformLoad(&chain_t);
    var stage = 0u;
    var n_stage = 0u;
"
    );
    for (k, p) in parts.iter().enumerate() {
        let args = if p.subgroup_builtins { "lid, lidx, sg_size, sg_id, sg_idx, sg_count" } else { "lid, lidx" };
        let cond = if k + 1 == n { String::new() } else { format!("if (t < {}) ", pv(&format!("c_e{k}"))) };
        // Wait for every earlier stage that has workgroups at this step (an empty one sets no
        // flag); a finished stage costs one load.
        let mut wait = String::new();
        for j in 0..k {
            wait.push_str(&format!(
                "if ({} > 0u) {{ loop {{ if (atomicLoad(&chain_cnt[{flag0}u + ({}u + t % {FLAGS}u) * {FLAG_STRIDE}u]) != 0u) {{ break; }} }} }} ",
                count_of(j),
                j * FLAGS
            ));
        }
        if k > 0 && poll == Poll::First {
            wait = format!("if (lidx == 0u) {{ {wait}}} workgroupBarrier(); ");
        }
        if k > 0 {
            wait.push_str("storageBarrier(); ");
        }
        let els = if k == 0 { "    " } else { " else " };
        body.push_str(&format!("{els}{cond}{{ {wait}s{k}_main({args}); stage = {k}u; n_stage = {}; }}", count_of(k)));
    }
    body.push_str(&format!(
        "
    storageBarrier();
    if (lidx == 0u) {{ chain_t = select(0u, 1u, atomicAdd(&chain_cnt[(1u + stage) * {FLAG_STRIDE}u], 1u) + 1u == n_stage); }}
    if (workgroupUniformLoad(&chain_t) != 0u) {{
        // The stage's last workgroup: acquire every arrival, then raise the stage's flags.
        storageBarrier();
        for (var f = lidx; f < {FLAGS}u; f += {}u) {{ atomicStore(&chain_cnt[{flag0}u + (stage * {FLAGS}u + f) * {FLAG_STRIDE}u], 1u); }}
        // Every flag of the stage is stored before the stage counts as finished; the last
        // stage to finish (every workgroup has arrived, none still waits) resets everything.
        storageBarrier();
        if (lidx == 0u && atomicAdd(&chain_cnt[{fin}u], 1u) + 1u == {live}) {{
            for (var i = 0u; i <= {fin}u; i += {FLAG_STRIDE}u) {{ atomicStore(&chain_cnt[i], 0u); }}
            for (var f = 0u; f < {}u; f++) {{ atomicStore(&chain_cnt[{flag0}u + f * {FLAG_STRIDE}u], 0u); }}
        }}
    }}
",
        wx * wy * wz,
        n * FLAGS
    ));

    let env = KernelEnv::from_caps(caps);
    let name = format!("chain[{}]", stages.iter().map(|d| d.kernel.name()).collect::<Vec<_>>().join("+"));
    let mut kb = KernelBuilder::new(name, env).workgroup(wx, wy, wz);
    if sg {
        kb = kb.subgroup_builtins();
    }
    if parts.iter().any(|p| p.f16) {
        kb = kb.enable_f16();
    }
    let mut enables: Vec<&String> = parts.iter().flat_map(|p| &p.enables).collect();
    enables.sort();
    enables.dedup();
    for e in enables {
        kb = kb.enable(e);
    }
    for (j, (key, b, coherent)) in globals.iter().enumerate() {
        let nm = format!("cb{j}");
        kb = if *coherent {
            kb.storage_coherent(&nm, &key.3)
        } else if written.contains(&b.buffer.id()) {
            kb.storage(&nm, Access::ReadWrite, &key.3)
        } else {
            kb.storage(&nm, Access::Read, &key.3)
        };
    }
    kb = kb.storage("chain_cnt", Access::ReadWrite, "array<atomic<u32>>");
    let refs: Vec<&str> = param_names.iter().map(|s| s.as_str()).collect();
    let src = kb.params(&refs).prelude(&pre).body(&body).build();
    let src = if stages.iter().all(|d| d.kernel.source().is_unchecked()) {
        // SAFETY: each stage indexes exactly as its own kernel does, over the same buffer ranges
        // (one declaration per range and type) with the same parameter values, and every stage
        // kernel was marked in bounds by the plan that validated those ranges and values. The
        // chain's own accesses are `chain_cnt[i * FLAG_STRIDE]`, `i <= S + 1`, or `chain_cnt[flag0
        // + (j * FLAGS + f) * FLAG_STRIDE]` with `j < S`, `f < FLAGS`, into a binding of `flag0 +
        // S * FLAGS * FLAG_STRIDE` words (`flag0 = (S + 2) * FLAG_STRIDE`).
        unsafe { src.assume_in_bounds() }
    } else {
        src
    };
    let bindings = globals.into_iter().map(|g| g.1).collect();
    Ok(Built { src, bindings, values, inline, stepped, words })
}

impl Built {
    /// The chain's dispatch: its kernel, its counters, its bindings and parameters.
    fn dispatch(self, ctx: &GpuContext, stages: &[PlanDispatch]) -> Result<PlanDispatch> {
        let Built { src, mut bindings, values, inline, stepped, words } = self;
        let kernel = ctx.kernel(&src)?;
        let cnt = ctx.alloc(4 * words as u64, BufferKind::Storage)?;
        ctx.write(&cnt, 0, &vec![0u8; 4 * words])?;
        bindings.push(Binding::whole(&cnt));
        let group = ctx.bind(&kernel, &bindings)?;
        let limit = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let grid_of = move |total: u32| grid_2d(total as u64, limit).unwrap_or([0, 1, 1]);
        let total_fixed: u32 = stages.iter().map(|d| count(d.grid)).sum();
        let grid = grid_2d(total_fixed as u64, limit).ok_or(NumrError::GridTooLarge { workgroups: total_fixed as u64, limit })?;
        let mut d = PlanDispatch::new(&kernel, group, grid)?;
        if stepped {
            let st: Vec<PlanDispatch> = stages.to_vec();
            d = d.grid_per_step(move |s| grid_of(st.iter().map(|x| count(stage_grid(x, s))).sum()));
        }
        for (nm, v) in values {
            if inline && matches!(v, Value::Fixed(_)) {
                continue;
            }
            d = match v {
                Value::Fixed(x) => d.set(&nm, x)?,
                Value::Step(f) => d.per_step(&nm, move |s| f(s))?,
            };
        }
        Ok(d)
    }
}

/// Which consecutive dispatches [`chain_plan`] may fuse.
#[derive(Clone)]
pub struct ChainOptions {
    /// Stages per chain at most.
    pub max_stages: usize,
    /// Whether a dispatch may be a stage (default: every builder kernel).
    pub filter: Arc<dyn Fn(&PlanDispatch) -> bool + Send + Sync>,
    /// Dispatch indices where a new chain starts (a chain never spans one).
    pub breaks: Vec<usize>,
    /// Who polls the flags in a waiting workgroup.
    pub poll: Poll,
}

impl Default for ChainOptions {
    fn default() -> Self {
        ChainOptions { max_stages: usize::MAX, filter: Arc::new(|_| true), breaks: Vec::new(), poll: Poll::default() }
    }
}

/// `plan` with runs of consecutive chainable dispatches of one workgroup size fused into chains
/// ([`chain`]), as long as each fits the adapter's bindings; a run whose chain does not build
/// stays as it was, and why is returned beside the plan. The result records the same work in
/// the same order.
pub fn chain_plan(ctx: &GpuContext, plan: &Plan, opts: &ChainOptions) -> (Plan, Vec<NumrError>) {
    let limit = ctx.capabilities().limits.max_storage_buffers_per_shader_stage as usize;
    let mut out = Plan::new();
    let mut run: Vec<PlanDispatch> = Vec::new();
    let mut refused = Vec::new();
    let mut flush = |run: &mut Vec<PlanDispatch>, out: &mut Plan| {
        if run.len() >= 2 {
            match chain_with(ctx, run, opts.poll) {
                Ok(d) => out.push(d),
                Err(e) => {
                    refused.push(e);
                    run.iter().for_each(|d| out.push(d.clone()));
                }
            }
        } else {
            run.iter().for_each(|d| out.push(d.clone()));
        }
        run.clear();
    };
    for (i, d) in plan.dispatches().iter().enumerate() {
        if opts.breaks.contains(&i) {
            flush(&mut run, &mut out);
        }
        let ok = chainable(ctx, d) && (opts.filter)(d);
        if !ok {
            flush(&mut run, &mut out);
            out.push(d.clone());
            continue;
        }
        let same_wg =
            run.first().is_none_or(|r| r.kernel.source().parts.as_ref().map(|p| p.workgroup) == d.kernel.source().parts.as_ref().map(|p| p.workgroup));
        let mut next = run.clone();
        next.push(d.clone());
        if !same_wg || run.len() >= opts.max_stages || chain_bindings(&next) > limit {
            flush(&mut run, &mut out);
        }
        run.push(d.clone());
    }
    flush(&mut run, &mut out);
    (out, refused)
}
