//! Custom kernels on the tensor core alone: a WGSL body written by hand, compiled once, bound
//! once, and recorded many times into ONE command encoder and ONE submit with a parameter that
//! changes per step. This is the pattern every boostr op follows.
//!
//! `cargo run --release -p numr --example custom_kernel` prints the largest difference from the
//! CPU (0 expected) and how many dispatches went into the one submit.

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, Plan, PlanDispatch, StepValues, grid_2d};

/// Runs `steps` steps of `y = y * 0.5 + x * (step.pos + 1)` over `n` floats on the GPU and
/// returns `(gpu, cpu)` results.
pub fn run(n: usize, steps: u32) -> Result<(Vec<f32>, Vec<f32>), numr::NumrError> {
    let ctx = GpuContext::new()?;
    let env = KernelEnv::from_caps(ctx.capabilities());
    // The builder writes the bindings, the parameter block `p` (u32 words, by name) and the
    // entry point; `wg_linear` (the workgroup's index over a 2-D grid) and `lidx` come with it.
    let src = KernelBuilder::new("scaled_axpy", env)
        .workgroup(64, 1, 1)
        .storage("x", Access::Read, "array<f32>")
        .storage("y", Access::ReadWrite, "array<f32>")
        .params(&["n", "scale"])
        .body(
            "    let i = wg_linear * 64u + lidx;
    if (i >= p.n) { return; }
    y[i] = y[i] * 0.5 + x[i] * bitcast<f32>(p.scale);
",
        )
        .build();
    let kernel = ctx.kernel(&src)?; // compiled once, cached by source
    let x: Vec<f32> = (0..n).map(|i| (i % 17) as f32 - 8.0).collect();
    let (xb, yb) = (ctx.upload(bytemuck::cast_slice(&x))?, ctx.upload(bytemuck::cast_slice(&vec![0f32; n]))?);
    let group = ctx.bind(&kernel, &[Binding::whole(&xb), Binding::whole(&yb)])?; // bound once
    let limit = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
    let grid = grid_2d(n.div_ceil(64) as u64, limit).ok_or(numr::NumrError::GridTooLarge { workgroups: n.div_ceil(64) as u64, limit })?;
    // A plan holds dispatches whose parameters are fixed (`set`) or computed per step.
    let d = PlanDispatch::new(&kernel, group, grid)?.set("n", n as u32)?.per_step("scale", |s| (s.pos as f32 + 1.0).to_bits())?;
    let mut plan = Plan::new();
    plan.push(d);
    let mut rec = ctx.recorder();
    for t in 0..steps {
        plan.record(&mut rec, &StepValues::decode(t))?; // each dispatch sees the previous one's y
    }
    println!("{} dispatches in one submit", rec.dispatch_count());
    rec.submit()?;
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&yb, 0, 4 * n as u64)?);
    let mut want = vec![0f32; n];
    for t in 0..steps {
        want.iter_mut().zip(&x).for_each(|(y, x)| *y = *y * 0.5 + x * (t as f32 + 1.0));
    }
    Ok((got, want))
}

fn main() -> Result<(), numr::NumrError> {
    let (got, want) = run(100_000, 10)?;
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    println!("largest difference from the CPU: {worst}");
    Ok(())
}
