//! Criterion benches of numr's core: the streaming-read roofline, a contiguous copy (GB/s) and
//! the f16/f32 matmul (TFLOP/s, shown by criterion as Gelem/s = GFLOP/s).
//! `cargo bench -p benches --bench numr_core`; `NUMR_ADAPTER` picks the GPU.

use std::time::Duration;

use benches::{cap_bytes, copy, matmul, stream_read};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use numr::{DType, GpuContext};

fn bench(c: &mut Criterion) {
    let ctx = GpuContext::new().expect("a GPU adapter");
    let bytes = cap_bytes(&ctx, 1 << 30);
    let mut g = c.benchmark_group("numr");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("stream_read", |b| {
        b.iter_custom(|iters| Duration::from_secs_f64(stream_read(&ctx, bytes, iters as usize).unwrap().seconds * iters as f64))
    });
    g.throughput(Throughput::Bytes(2 * bytes));
    g.bench_function("copy", |b| b.iter_custom(|iters| Duration::from_secs_f64(copy(&ctx, bytes, iters as usize).unwrap().seconds * iters as f64)));
    let n = if ctx.capabilities().device_type == "Cpu" { 256 } else { 4096 };
    for dtype in [DType::F16, DType::F32] {
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.bench_function(format!("matmul_{dtype}_{n}"), |b| {
            b.iter_custom(|iters| Duration::from_secs_f64(matmul(&ctx, dtype, n, n, n, iters as usize).unwrap().seconds * iters as f64))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
