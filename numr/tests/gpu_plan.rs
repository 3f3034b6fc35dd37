//! Plans, queue order and submission-scoped readback.
//!
//! - A plan's parameters are filled by name, per-step parameters and grids follow the step values,
//!   and recording it several times with different values gives each step's result without
//!   rebuilding anything (no buffer, no bind group).
//! - Work recorded into the implicit stream (a `Tensor::zeros` clear) runs before an explicit
//!   recording submitted after it (the queue-order bug: the clear used to run last).
//! - A readback waits for the submission that wrote its bytes, and `is_ready` never blocks.

use numr::gpu::{Access, Binding, KernelBuilder, KernelEnv, Plan, PlanDispatch, StepValues};
use numr::testing::{test_gpu, test_gpu_private};
use numr::{DType, Device, NumrError, Tensor};

/// `x[i] = a * i + step.pos` for `i < n`, over a grid of `ceil(n / 64)` workgroups.
fn affine_kernel(ctx: &numr::GpuContext) -> std::sync::Arc<numr::gpu::Kernel> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let src = KernelBuilder::new("plan_affine", env)
        .storage("x", Access::ReadWrite, "array<u32>")
        .params(&["n", "a", "pos", "off"])
        .body("    let i = wg_linear * 64u + lidx;\n    if (i < p.n) { x[p.off + i] = p.a * i + p.pos; }\n")
        .build();
    ctx.kernel(&src).unwrap()
}

#[test]
fn explicit_recorder_sees_stream_clears_first() {
    let Some(ctx) = test_gpu() else { return };
    let dev = Device::Gpu(ctx.clone());
    let env = KernelEnv::from_caps(ctx.capabilities());
    let src = KernelBuilder::new("plan_sevens", env)
        .storage("x", Access::ReadWrite, "array<f32>")
        .params(&["n"])
        .body("    let i = wg_linear * 64u + lidx;\n    if (i < p.n) { x[i] = 7.0; }\n")
        .build();
    let k = ctx.kernel(&src).unwrap();
    // Recorded and submitted.
    let t = Tensor::zeros(&[100], DType::F32, &dev).unwrap();
    let (b, _) = t.gpu_binding(4).unwrap();
    let mut rec = ctx.recorder();
    rec.dispatch_with(&k, &[b], &[100], [2, 1, 1]).unwrap();
    rec.submit().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![7.0; 100]);
    // Finished ahead, submitted later.
    let t = Tensor::zeros(&[100], DType::F32, &dev).unwrap();
    let (b, _) = t.gpu_binding(4).unwrap();
    let mut rec = ctx.recorder();
    rec.dispatch_with(&k, &[b], &[100], [2, 1, 1]).unwrap();
    let ready = rec.finish().unwrap();
    ready.submit().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![7.0; 100]);
}

#[test]
fn plan_parameters_by_name_and_per_step() {
    // A context of its own: the tests of this file run in parallel, and the counters below must
    // move only for this test's work.
    let Some(ctx) = test_gpu_private() else { return };
    let k = affine_kernel(&ctx);
    let buf = ctx.upload(&vec![0u8; 3 * 64 * 4]).unwrap();
    let group = ctx.bind(&k, &[Binding::whole(&buf)]).unwrap();
    // Unknown names are typed errors, not silent no-ops.
    let bad = PlanDispatch::new(&k, group.clone(), [1, 1, 1]).unwrap().set("nope", 1);
    assert!(matches!(bad, Err(NumrError::Validation { .. })), "{bad:?}");
    let d = PlanDispatch::new(&k, group, [1, 1, 1])
        .unwrap()
        .set("a", 3)
        .unwrap()
        .per_step("pos", |s| s.pos)
        .unwrap()
        .per_step("off", |s| s.token * 64)
        .unwrap()
        .per_step("n", |s| s.n_tok)
        .unwrap();
    assert_eq!(d.param("a"), Some(3));
    let plan = Plan::from(d);
    // One warm-up submit (a context without immediates makes its parameter arena here).
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::chunk(0, 0)).unwrap();
    rec.submit().unwrap();
    let created = ctx.bind_groups_created();
    let pool = ctx.pool_stats().created;
    let mut rec = ctx.recorder();
    let steps = [StepValues::chunk(5, 64).with_token(0), StepValues::chunk(6, 10).with_token(1), StepValues::chunk(7, 64).with_token(2)];
    for s in &steps {
        plan.record(&mut rec, s).unwrap();
    }
    assert_eq!(rec.dispatch_count(), 3);
    assert_eq!(rec.pass_count(), 1);
    rec.submit().unwrap();
    assert_eq!(ctx.bind_groups_created(), created, "recording a plan created a bind group");
    assert_eq!(ctx.pool_stats().created, pool, "recording a plan allocated a buffer");
    let got: Vec<u32> = bytemuck::cast_slice(&ctx.read_bytes(&buf, 0, 3 * 64 * 4).unwrap()).to_vec();
    for s in &steps {
        for i in 0..64u32 {
            let want = if i < s.n_tok { 3 * i + s.pos } else { 0 };
            assert_eq!(got[(s.token * 64 + i) as usize], want, "step {s:?} element {i}");
        }
    }
}

#[test]
fn plan_grid_per_step_skips_zero_grids() {
    let Some(ctx) = test_gpu() else { return };
    let k = affine_kernel(&ctx);
    let buf = ctx.upload(&vec![0u8; 256 * 4]).unwrap();
    let group = ctx.bind(&k, &[Binding::whole(&buf)]).unwrap();
    let d = PlanDispatch::new(&k, group, [0, 1, 1])
        .unwrap()
        .set("a", 1)
        .unwrap()
        .per_step("n", |s| s.n_tok)
        .unwrap()
        .grid_per_step(|s| [s.n_tok.div_ceil(64), 1, 1]);
    let plan = Plan::from(d);
    assert_eq!(plan.dispatch_count(&StepValues::chunk(0, 0)), 0);
    assert_eq!(plan.dispatch_count(&StepValues::chunk(0, 200)), 1);
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::chunk(0, 0)).unwrap();
    assert_eq!(rec.dispatch_count(), 0);
    plan.record(&mut rec, &StepValues::chunk(0, 200)).unwrap();
    rec.submit().unwrap();
    let got: Vec<u32> = bytemuck::cast_slice(&ctx.read_bytes(&buf, 0, 256 * 4).unwrap()).to_vec();
    assert_eq!(&got[..200], &(0..200).collect::<Vec<u32>>()[..]);
    assert!(got[200..].iter().all(|&v| v == 0));
}

#[test]
fn readback_waits_for_its_own_submission() {
    let Some(ctx) = test_gpu() else { return };
    let k = affine_kernel(&ctx);
    let a = ctx.upload(&vec![0u8; 64 * 4]).unwrap();
    let b = ctx.upload(&vec![0u8; 64 * 4]).unwrap();
    let ga = ctx.bind(&k, &[Binding::whole(&a)]).unwrap();
    let gb = ctx.bind(&k, &[Binding::whole(&b)]).unwrap();
    // Token n: write a, read it back.
    let mut rec = ctx.recorder();
    rec.dispatch(&k, &ga, &[64, 2, 1, 0], [1, 1, 1]).unwrap();
    let pending = rec.read(&a, 8, 12).unwrap();
    assert!(!pending.is_ready().unwrap(), "not submitted yet");
    let first = rec.submit().unwrap();
    // Token n+1 is submitted before token n is read.
    let mut rec = ctx.recorder();
    for _ in 0..50 {
        rec.dispatch(&k, &gb, &[64, 5, 9, 0], [1, 1, 1]).unwrap();
    }
    let second = rec.submit().unwrap();
    let words: Vec<u32> = pending.wait_u32().unwrap();
    assert_eq!(words, vec![2 * 2 + 1, 2 * 3 + 1, 2 * 4 + 1]);
    assert!(first.is_done().unwrap());
    second.wait().unwrap();
    assert!(second.is_done().unwrap());
    // A readback whose recording was dropped unsubmitted is an error, not a hang.
    let mut rec = ctx.recorder();
    let orphan = rec.read(&a, 0, 4).unwrap();
    drop(rec);
    assert!(matches!(orphan.wait(), Err(NumrError::Validation { .. })));
}

#[test]
fn readback_past_the_end_is_a_typed_error() {
    let Some(ctx) = test_gpu() else { return };
    let a = ctx.upload(&[0u8; 64]).unwrap();
    let mut rec = ctx.recorder();
    assert!(matches!(rec.read(&a, a.capacity() - 4, 8), Err(NumrError::Validation { .. })));
}

/// `out[lidx] = x` after `p.n` steps of a dependent LCG per invocation: a dispatch that keeps
/// the GPU busy for a while.
fn spin_kernel(ctx: &numr::GpuContext) -> std::sync::Arc<numr::gpu::Kernel> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let src = KernelBuilder::new("plan_spin", env)
        .storage("out", Access::ReadWrite, "array<u32>")
        .params(&["n"])
        .body("    var x = lidx;\n    for (var i = 0u; i < p.n; i++) { x = x * 1664525u + 1013904223u; }\n    out[lidx] = x;\n")
        .build();
    ctx.kernel(&src).unwrap()
}

/// A readback of a submission the queue already reported done does not wait for work submitted
/// after it. It used to: the map was requested after the submission finished, so it resolved
/// only in a later poll, and the fallback waited for everything queued, which made a pipelined
/// decode loop wait for token t+1 while reading token t (its GPU then idled while the host
/// recorded: the H200's small-model decode ran at 0.65x its speed in those runs). The context is
/// the test's own, so no other thread's poll can take the map callback: the read must resolve
/// through its own poll, with no fallback. Whether the later work is still running when the
/// read returns is timing (a descheduled test thread could see it finish), so it is reported,
/// not asserted.
#[test]
fn readback_of_a_finished_submission_does_not_wait_for_later_work() {
    let Some(ctx) = test_gpu_private() else { return };
    let k = affine_kernel(&ctx);
    let spin = spin_kernel(&ctx);
    let a = ctx.upload(&vec![0u8; 64 * 4]).unwrap();
    let s = ctx.upload(&vec![0u8; 64 * 4]).unwrap();
    let ga = ctx.bind(&k, &[Binding::whole(&a)]).unwrap();
    let gs = ctx.bind(&spin, &[Binding::whole(&s)]).unwrap();
    let mut rec = ctx.recorder();
    rec.dispatch(&k, &ga, &[64, 3, 1, 0], [1, 1, 1]).unwrap();
    let pending = rec.read(&a, 0, 8).unwrap();
    let first = rec.submit().unwrap();
    first.wait().unwrap();
    assert!(first.is_done().unwrap());
    // Later work that keeps the GPU busy (tens of milliseconds on lavapipe, milliseconds on a
    // large GPU), submitted before the first recording is read.
    let mut rec = ctx.recorder();
    for _ in 0..SPIN_DISPATCHES {
        rec.dispatch(&spin, &gs, &[SPIN_STEPS], [1, 1, 1]).unwrap();
    }
    let second = rec.submit().unwrap();
    let fallbacks = ctx.read_wait_fallbacks();
    assert_eq!(pending.wait_u32().unwrap(), vec![1, 4]);
    assert_eq!(ctx.read_wait_fallbacks(), fallbacks, "reading the finished submission fell back to waiting for everything queued");
    eprintln!("later work still running when the read returned: {}", !second.is_done().unwrap());
    second.wait().unwrap();
    let mut x = 5u32;
    for _ in 0..SPIN_STEPS {
        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
    }
    assert_eq!(u32::from_le_bytes(ctx.read_bytes(&s, 20, 4).unwrap().try_into().unwrap()), x);
}

/// Steps of each spin dispatch (under 65,535, where a loop may be cut short by a driver's
/// loop bound) and dispatches of it, each starting from the invocation index again.
const SPIN_STEPS: u32 = 60_000;
const SPIN_DISPATCHES: usize = 40;
