//! Criterion benches of attention: flash-decoding at 4K and 32K context (GB/s of KV read) and
//! causal prefill at 2K tokens (criterion's Gelem/s = GFLOP/s). Shape: 32 query heads, 8 KV
//! heads, head_dim 128, f16 cache. `cargo bench -p benches --bench attention`.

use std::time::Duration;

use benches::attention::{decode, prefill};
use boostr::kv_cache::KvDtype;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use numr::GpuContext;

fn bench(c: &mut Criterion) {
    let ctx = GpuContext::new().expect("a GPU adapter");
    let cpu = ctx.capabilities().device_type == "Cpu";
    let mut g = c.benchmark_group("attention");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    for len in if cpu { vec![1024] } else { vec![4096, 32768] } {
        g.throughput(Throughput::Bytes((2 * len * 8 * 128 * 2) as u64));
        g.bench_function(format!("decode_f16_{len}"), |b| {
            b.iter_custom(|iters| Duration::from_secs_f64(decode(&ctx, 32, 8, 128, len, KvDtype::F16, iters as usize, false).unwrap().seconds * iters as f64))
        });
    }
    let n = if cpu { 128 } else { 2048 };
    g.throughput(Throughput::Elements((4 * 128 * 32 * n * (n + 1) / 2) as u64));
    g.bench_function(format!("prefill_{n}"), |b| {
        b.iter_custom(|iters| Duration::from_secs_f64(prefill(&ctx, 32, 8, 128, n, iters as usize, None).unwrap().seconds * iters as f64))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
