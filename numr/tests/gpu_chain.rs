//! Chains (`numr::gpu::chain`): dependent dispatches fused into one give exactly the results of
//! the same dispatches recorded one after the other, over many recordings (the counters reset
//! themselves), with per-step parameters and grids, and with stages whose module-scope names
//! collide (renamed apart). On a CPU adapter (lavapipe in CI) chains are refused with a typed
//! error, which the tests assert instead.

use numr::gpu::{
    Access, Binding, ChainOptions, KernelBuilder, KernelEnv, Plan, PlanDispatch, Poll, StepValues, chain, chain_plan, chain_source, chain_with, chains_run_on,
};
use numr::testing::test_gpu;
use numr::{GpuContext, gpu::BufferKind};

const N: u32 = 64 * 1500;

/// Whether chains run on `ctx`; where they do not, asserts that `chain` refuses `stages`.
fn runs_chains(ctx: &GpuContext, stages: &[PlanDispatch]) -> bool {
    let caps = ctx.capabilities();
    if chains_run_on(caps) {
        return true;
    }
    let e = chain(ctx, stages).expect_err("an adapter that cannot run chains refuses them");
    if caps.device_type == "Cpu" {
        assert!(e.to_string().contains("CPU adapter"), "{e}");
    }
    numr::testing::skip_path(ctx, "chained dispatches", &format!("{} does not run chains ({e}); the refusal was tested", caps.adapter_name));
    false
}

/// Stage 0: `x[i] = 3 i + pos`.
fn fill(ctx: &GpuContext, x: &Binding, stepped_grid: bool) -> PlanDispatch {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let src = KernelBuilder::new("chain_fill", env)
        .storage("x", Access::ReadWrite, "array<u32>")
        .params(&["n", "pos"])
        .prelude("var<workgroup> tmp: array<u32, 64>;\nfn f(i: u32) -> u32 { return 3u * i; }\n")
        .body("    let i = wg_linear * 64u + lidx;\n    tmp[lidx] = f(i);\n    workgroupBarrier();\n    if (i < p.n) { x[i] = tmp[lidx] + p.pos; }\n")
        .build();
    let k = ctx.kernel(&src).unwrap();
    let g = ctx.bind(&k, std::slice::from_ref(x)).unwrap();
    let d = PlanDispatch::new(&k, g, [N / 64, 1, 1]).unwrap().set("n", N).unwrap().per_step("pos", |s| s.pos).unwrap();
    if stepped_grid { d.grid_per_step(|s| [if s.n_tok == 0 { 0 } else { N / 64 }, 1, 1]) } else { d }
}

/// Stage 1: `y[i] = x[n - 1 - i] + 1` (reads what other workgroups of stage 0 wrote), over a
/// 2-D grid.
fn reverse(ctx: &GpuContext, x: &Binding, y: &Binding) -> PlanDispatch {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let src = KernelBuilder::new("chain_rev", env)
        .storage("x", Access::Read, "array<u32>")
        .storage("y", Access::ReadWrite, "array<u32>")
        .params(&["n"])
        .prelude("var<workgroup> tmp: array<u32, 64>;\nfn f(i: u32) -> u32 { return i + 1u; }\n")
        .body("    let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;\n    if (i < p.n) { tmp[lidx] = f(x[p.n - 1u - i]); }\n    workgroupBarrier();\n    if (i < p.n) { y[i] = tmp[lidx]; }\n")
        .build();
    let k = ctx.kernel(&src).unwrap();
    let g = ctx.bind(&k, &[x.clone(), y.clone()]).unwrap();
    PlanDispatch::new(&k, g, [N / 64 / 4, 4, 1]).unwrap().set("n", N).unwrap()
}

/// Stage 2: `z[w] = sum of y over the workgroup's grid-stride slice`.
fn sum(ctx: &GpuContext, y: &Binding, z: &Binding) -> PlanDispatch {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let src = KernelBuilder::new("chain_sum", env)
        .storage("y", Access::Read, "array<u32>")
        .storage("z", Access::ReadWrite, "array<u32>")
        .params(&["n"])
        .prelude("var<workgroup> tmp: array<u32, 64>;\n")
        .body(
            "    var s = 0u;\n    for (var i = wg_linear * 64u + lidx; i < p.n; i += nwg.x * 64u) { s += y[i]; }\n    tmp[lidx] = s;\n    workgroupBarrier();\n    if (lidx == 0u) { var t = 0u; for (var j = 0u; j < 64u; j++) { t += tmp[j]; } z[wg_linear] = t; }\n",
        )
        .build();
    let k = ctx.kernel(&src).unwrap();
    let g = ctx.bind(&k, &[y.clone(), z.clone()]).unwrap();
    PlanDispatch::new(&k, g, [37, 1, 1]).unwrap().set("n", N).unwrap()
}

fn expected(pos: u32) -> (Vec<u32>, Vec<u32>) {
    let y: Vec<u32> = (0..N).map(|i| 3 * (N - 1 - i) + pos + 1).collect();
    let z: Vec<u32> = (0..37u32).map(|w| (0..N).filter(|i| (i / 64) % 37 == w).map(|i| y[i as usize]).fold(0u32, |a, b| a.wrapping_add(b))).collect();
    (y, z)
}

fn read_u32(ctx: &GpuContext, b: &Binding) -> Vec<u32> {
    bytemuck::cast_slice(&ctx.read_bytes(&b.buffer, 0, b.size).unwrap()).to_vec()
}

fn run_chain(stepped_grid: bool, poll: Poll) {
    let Some(ctx) = test_gpu() else { return };
    let buf = |n: u32| Binding::whole(&ctx.alloc(4 * n as u64, BufferKind::Storage).unwrap());
    let (x, y, z) = (buf(N), buf(N), buf(37));
    let stages = [fill(&ctx, &x, stepped_grid), reverse(&ctx, &x, &y), sum(&ctx, &y, &z)];
    if !runs_chains(&ctx, &stages) {
        return;
    }
    let fused = Plan::from(chain_with(&ctx, &stages, poll).unwrap());
    assert_eq!(fused.dispatches().len(), 1);
    for pos in [0u32, 7, 1000, 5] {
        let mut rec = ctx.recorder();
        fused.record(&mut rec, &StepValues::decode(pos)).unwrap();
        rec.submit().unwrap();
        let (ey, ez) = expected(pos);
        assert_eq!(read_u32(&ctx, &y), ey, "y at pos {pos}");
        assert_eq!(read_u32(&ctx, &z), ez, "z at pos {pos}");
    }
    // Several recordings of the chain in one submit: each waits for the one before.
    let mut rec = ctx.recorder();
    for pos in [11u32, 12, 13] {
        fused.record(&mut rec, &StepValues::decode(pos)).unwrap();
    }
    rec.submit().unwrap();
    assert_eq!(read_u32(&ctx, &z), expected(13).1);
}

#[test]
fn chain_matches_separate_dispatches() {
    run_chain(false, Poll::Every);
}

#[test]
fn chain_with_a_per_step_grid() {
    run_chain(true, Poll::Every);
}

/// The chain's WGSL passes naga on every adapter, including the CPU adapters that refuse to run
/// it (so CI checks what the GPUs compile).
#[test]
fn chain_wgsl_validates() {
    let Some(ctx) = test_gpu() else { return };
    let buf = |n: u32| Binding::whole(&ctx.alloc(4 * n as u64, BufferKind::Storage).unwrap());
    let (x, y, z) = (buf(N), buf(N), buf(37));
    for stepped in [false, true] {
        let stages = [fill(&ctx, &x, stepped), reverse(&ctx, &x, &y), sum(&ctx, &y, &z)];
        for poll in [Poll::Every, Poll::First] {
            let src = chain_source(&ctx, &stages, poll).unwrap();
            numr::testing::validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{poll:?}: {e}\n{}", src.wgsl));
        }
    }
}

#[test]
fn chain_polled_by_one_invocation() {
    run_chain(false, Poll::First);
    run_chain(true, Poll::First);
}

#[test]
fn chain_plan_fuses_runs_and_keeps_the_rest() {
    let Some(ctx) = test_gpu() else { return };
    let buf = |n: u32| Binding::whole(&ctx.alloc(4 * n as u64, BufferKind::Storage).unwrap());
    let (x, y, z) = (buf(N), buf(N), buf(37));
    if !runs_chains(&ctx, &[fill(&ctx, &x, false), reverse(&ctx, &x, &y)]) {
        return;
    }
    let mut plan = Plan::new();
    for d in [fill(&ctx, &x, false), reverse(&ctx, &x, &y), sum(&ctx, &y, &z)] {
        plan.push(d);
    }
    // Only the first two may be stages.
    let opts = ChainOptions { filter: std::sync::Arc::new(|d: &PlanDispatch| d.kernel().name() != "chain_sum"), ..ChainOptions::default() };
    let (fused, refused) = chain_plan(&ctx, &plan, &opts);
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(fused.dispatches().len(), 2);
    let mut rec = ctx.recorder();
    fused.record(&mut rec, &StepValues::decode(9)).unwrap();
    rec.submit().unwrap();
    assert_eq!(read_u32(&ctx, &z), expected(9).1);
}

/// Stage 0 adds into `y` (two outputs per workgroup, read-modify-write); stage 1 reads all of
/// `y` through a `vec4` view of the same buffer (another declaration of the same range).
#[test]
fn chain_over_a_buffer_seen_through_two_types() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    const R: u32 = 1024;
    let y = Binding::whole(&ctx.alloc(4 * R as u64, BufferKind::Storage).unwrap());
    let z = Binding::whole(&ctx.alloc(4 * 64, BufferKind::Storage).unwrap());
    let add = KernelBuilder::new("chain_add", env)
        .storage("y", Access::ReadWrite, "array<f32>")
        .params(&["rows"])
        .body("    let o = wg_linear * 2u + lidx;\n    if (lidx < 2u && o < p.rows) { y[o] = y[o] + f32(o % 7u); }\n")
        .build();
    let norm = KernelBuilder::new("chain_norm", env)
        .storage("x", Access::Read, "array<vec4<f32>>")
        .storage("z", Access::ReadWrite, "array<f32>")
        .params(&["k4"])
        .prelude("var<workgroup> red: array<f32, 64>;\n")
        .body("    var s = 0.0;\n    for (var i = lidx; i < p.k4; i += 64u) { s += dot(x[i], vec4<f32>(1.0)); }\n    red[lidx] = s;\n    workgroupBarrier();\n    if (lidx == 0u) { var t = 0.0; for (var j = 0u; j < 64u; j++) { t += red[j]; } z[wg_linear] = t; }\n")
        .build();
    let (ka, kn) = (ctx.kernel(&add).unwrap(), ctx.kernel(&norm).unwrap());
    let da = PlanDispatch::new(&ka, ctx.bind(&ka, std::slice::from_ref(&y)).unwrap(), [R / 2, 1, 1]).unwrap().set("rows", R).unwrap();
    let dn = PlanDispatch::new(&kn, ctx.bind(&kn, &[y.clone(), z.clone()]).unwrap(), [64, 1, 1]).unwrap().set("k4", R / 4).unwrap();
    if !runs_chains(&ctx, &[da.clone(), dn.clone()]) {
        return;
    }
    let fused = Plan::from(chain(&ctx, &[da, dn]).unwrap());
    ctx.write(&y.buffer, 0, &vec![0u8; 4 * R as usize]).unwrap();
    let one: f32 = (0..R).map(|o| (o % 7) as f32).sum();
    for step in 1..=20u32 {
        let mut rec = ctx.recorder();
        fused.record(&mut rec, &StepValues::decode(0)).unwrap();
        rec.submit().unwrap();
        let zs: Vec<f32> = bytemuck::cast_slice(&ctx.read_bytes(&z.buffer, 0, z.size).unwrap()).to_vec();
        let cnt = fused.dispatches()[0].group().bindings().last().unwrap().clone();
        let c: Vec<u32> = bytemuck::cast_slice(&ctx.read_bytes(&cnt.buffer, 0, cnt.size).unwrap()).to_vec();
        assert!(c.iter().all(|&w| w == 0), "step {step}: counters left set");
        assert!(zs.iter().all(|&v| v == one * step as f32), "step {step}: {zs:?}");
    }
}
