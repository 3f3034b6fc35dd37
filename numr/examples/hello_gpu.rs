//! The first thing to run on a new machine: lists the adapters, prints the capabilities of the one
//! numr picks, runs an f16 matmul on it, checks it against the CPU, and reports its speed.
//!
//! `cargo run --release -p numr --example hello_gpu`; `NUMR_ADAPTER` (name substring or index)
//! and `NUMR_BACKEND` (vulkan/metal/dx12/gl) choose the adapter.

use std::time::Instant;

use numr::testing::check_close;
use numr::{DType, Device, GpuContext, Tensor};

fn main() -> Result<(), numr::NumrError> {
    println!("adapters:");
    for a in GpuContext::list_adapters() {
        println!("  {a}");
    }
    let ctx = GpuContext::new()?;
    println!("\n{}", ctx.capabilities());

    let n = if ctx.capabilities().device_type == "Cpu" { 256 } else { 2048 };
    let v: Vec<f32> = (0..n * n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
    let a = Tensor::from_slice(&v, &[n, n], &Device::Cpu)?.cast(DType::F16)?;
    let gpu = Device::Gpu(ctx.clone());
    let (ag, bt) = (a.to_device(&gpu)?, a.transpose(0, 1)?);
    let bg = ag.transpose(0, 1)?;
    ag.matmul(&bg)?.to_vec::<half::f16>()?; // warm-up: compiles the kernel
    let t = Instant::now();
    let c = ag.matmul(&bg)?;
    let got = c.to_f64_vec()?;
    let secs = t.elapsed().as_secs_f64();
    let want = a.matmul(&bt)?.to_f64_vec()?;
    let verdict = match check_close(&got, &want, DType::F16) {
        Ok(()) => "matches the CPU".to_string(),
        Err(e) => format!("DIFFERS from the CPU: {e}"),
    };
    println!(
        "f16 matmul {n}x{n}x{n} (A·Aᵀ through a transposed view): {:.2} ms incl. readback, {:.2} TFLOP/s, {verdict}",
        secs * 1e3,
        2.0 * (n * n * n) as f64 / secs / 1e12
    );
    Ok(())
}
