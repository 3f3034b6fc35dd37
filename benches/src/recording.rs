//! The CPU cost of recording plans, now on the critical path of every decode token: an engine
//! records a whole token from plans built at load, so this is wall-clock CPU time, not GPU time.

use std::time::Instant;

use numr::Result;
use numr::gpu::{Access, Binding, BufferKind, GpuContext, KernelBuilder, KernelEnv, Plan, PlanDispatch, StepValues};

use crate::Measurement;

/// Dispatches of a 30-layer decode step at the engine's budget (12 per layer).
pub const DECODE_STEP_DISPATCHES: usize = 30 * 12;

/// A plan shaped like a decode step: `n` dispatches, each with a bind group of its own over five
/// buffers (as a layer's GEMVs, norms and attention have) and two per-step parameters.
fn step_plan(ctx: &GpuContext, n: usize) -> Result<Plan> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut b = KernelBuilder::new("record_probe", env).workgroup(64, 1, 1);
    for name in ["a", "b", "c", "d"] {
        b = b.storage(name, Access::Read, "array<u32>");
    }
    let src = b
        .storage("out", Access::ReadWrite, "array<u32>")
        .params(&["n", "pos", "kv_len", "layer"])
        .body("    if (lidx == 0u && p.n > 0u) { out[p.layer] = a[0] + b[0] + c[0] + d[0] + p.pos + p.kv_len; }\n")
        .build();
    let k = ctx.kernel(&src)?;
    let out = ctx.alloc(n as u64 * 4 + 4, BufferKind::Storage)?;
    let mut plan = Plan::new();
    for i in 0..n {
        let bufs: Vec<Binding> = (0..4).map(|_| ctx.alloc(256, BufferKind::Storage).map(|b| Binding::whole(&b))).collect::<Result<_>>()?;
        let mut bind = bufs;
        bind.push(Binding::whole(&out));
        let group = ctx.bind(&k, &bind)?;
        plan.push(PlanDispatch::new(&k, group, [1, 1, 1])?.set("n", 1)?.set_usize("layer", i)?.per_step("pos", |s| s.pos)?.per_step("kv_len", |s| s.kv_len())?);
    }
    Ok(plan)
}

/// Recording cost rows: one plan dispatch recorded (no encoding), one recorded and encoded, and
/// a whole 30-layer decode step's recording (record + encode, [`DECODE_STEP_DISPATCHES`]).
pub fn recording_cost(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let n = DECODE_STEP_DISPATCHES;
    let plan = step_plan(ctx, n)?;
    let reps = if quick { 5 } else { 200 };
    // Warm-up (first recordings touch cold caches and grow vectors).
    for r in 0..3 {
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &StepValues::decode(r))?;
        drop(rec.finish()?);
    }
    let (mut record, mut total) = (Vec::new(), Vec::new());
    for r in 0..reps {
        let step = StepValues::decode(100 + r as u32);
        let t0 = Instant::now();
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &step)?;
        let t1 = Instant::now();
        let ready = rec.finish()?;
        let t2 = Instant::now();
        drop(ready);
        record.push((t1 - t0).as_secs_f64());
        total.push((t2 - t0).as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (rec_s, tot_s) = (median(&mut record), median(&mut total));
    let row = |label: String, seconds: f64| Measurement { label, seconds, bytes: 0.0, flops: 0.0 };
    Ok(vec![
        row(format!("record one plan dispatch (CPU, median of {reps} steps of {n})"), rec_s / n as f64),
        row(format!("record + encode one plan dispatch (CPU, median of {reps})"), tot_s / n as f64),
        row(format!("30-layer decode step recording: {n} plan dispatches, record + encode (CPU)"), tot_s),
    ])
}
