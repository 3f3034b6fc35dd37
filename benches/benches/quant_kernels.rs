//! Criterion benches of boostr's quantized kernels: the streaming-read roofline, GEMV per format
//! (f32 math and integer dot) at the Llama-3-8B down-projection shape (4096x14336, GB/s of weight
//! bytes, rotating over weight copies larger than the L2) and GEMM at M = 512
//! (Gelem/s = GFLOP/s). `cargo bench -p benches --bench quant_kernels`; `NUMR_ADAPTER` picks the
//! GPU. `cargo xtask bench --kernels` prints the full table.

use std::time::Duration;

use benches::quant::{copies_for, gemm, gemv, gemv_q8, random_weight, upload_copies};
use benches::{cap_bytes, stream_read};
use boostr::quant::{QuantGemm, QuantGemv, QuantGemvQ8, QuantMatrix, WeightKind};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use numr::GpuContext;
use numr::gpu::KernelEnv;

fn bench(c: &mut Criterion) {
    let ctx = GpuContext::new().expect("a GPU adapter");
    let env = KernelEnv::from_caps(ctx.capabilities());
    let soft = ctx.capabilities().device_type == "Cpu";
    let mut g = c.benchmark_group("quant");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let bytes = cap_bytes(&ctx, if soft { 64 << 20 } else { 1 << 30 });
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("stream_read", |b| b.iter_custom(|it| Duration::from_secs_f64(stream_read(&ctx, bytes, it as usize).unwrap().seconds * it as f64)));
    let (n, k) = if soft { (256, 1024) } else { (4096, 14336) };
    for kind in WeightKind::all() {
        let p = random_weight(kind, n, k, 7).unwrap();
        let ws = upload_copies(&ctx, &p, if soft { 2 } else { copies_for(p.total_bytes()) }).unwrap();
        let cfg = QuantGemv { unchecked: true, ..QuantGemv::new(kind, &env, 1) };
        g.throughput(Throughput::Bytes(p.total_bytes() as u64));
        g.bench_function(format!("gemv_{}_{n}x{k}", kind.name()), |b| {
            b.iter_custom(|it| Duration::from_secs_f64(gemv(&ctx, &cfg, &ws, p.total_bytes(), it as usize).unwrap()[0].seconds * it as f64))
        });
        if QuantGemvQ8::supports(kind) {
            let cfg = QuantGemvQ8 { unchecked: true, ..QuantGemvQ8::new(kind, &env, 1) };
            g.bench_function(format!("gemv_q8_{}_{n}x{k}", kind.name()), |b| {
                b.iter_custom(|it| Duration::from_secs_f64(gemv_q8(&ctx, &cfg, &ws, p.total_bytes(), it as usize, false).unwrap()[0].seconds * it as f64))
            });
        }
    }
    let (m, n, k) = if soft { (64, 256, 512) } else { (512, 4096, 4096) };
    for kind in [WeightKind::Ggml(boostr::formats::GgmlType::Q4_0), WeightKind::Ggml(boostr::formats::GgmlType::Q4_K)] {
        let p = random_weight(kind, n, k, 9).unwrap();
        let w = QuantMatrix::upload(&ctx, "w", &p).unwrap();
        let cfg = QuantGemm { unchecked: true, ..QuantGemm::new(kind, &ctx) };
        g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        g.bench_function(format!("gemm_{}_{m}x{k}x{n}", kind.name()), |b| {
            b.iter_custom(|it| Duration::from_secs_f64(gemm(&ctx, &cfg, &w, m, it as usize).unwrap().seconds * it as f64))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
