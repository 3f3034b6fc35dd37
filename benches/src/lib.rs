//! Benchmark workloads, shared by the criterion benches (`cargo bench -p benches`) and the table
//! of `cargo xtask bench`. Recorded GPU work is encoded ahead and timed by wall clock from one
//! submit of many repetitions to its completion ([`time_recorded`], after a warm-up): the GPU's
//! own cost per dispatch, barriers included, without the CPU's encoding (which an engine overlaps
//! with the GPU). Eager tensor ops ([`copy`], [`matmul`]) are timed with their encoding
//! ([`time_reps`]), which is what a user of the eager API gets.

pub mod attention;
pub mod l2_prefetch;
pub mod paged;
pub mod probe;
pub mod quant;
pub mod recording;
pub mod small_m;
pub mod tall;

use std::time::Instant;

use numr::gpu::{Binding, BufferKind, GpuContext, KernelEnv, grid_2d};
use numr::kernels::stream::StreamRead;
use numr::{DType, Device, Result, Tensor};

/// One measured workload.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub label: String,
    /// Median seconds per repetition.
    pub seconds: f64,
    /// Bytes moved per repetition (read + written).
    pub bytes: f64,
    /// Floating-point operations per repetition.
    pub flops: f64,
}

impl Measurement {
    pub fn gbps(&self) -> f64 {
        self.bytes / self.seconds / 1e9
    }
    pub fn tflops(&self) -> f64 {
        self.flops / self.seconds / 1e12
    }
}

/// Median seconds per repetition of `run(reps)` (which must record `reps` repetitions and leave
/// them submitted), over `trials` timed trials after one warm-up.
pub fn time_reps(ctx: &GpuContext, reps: usize, trials: usize, mut run: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    run(1)?;
    ctx.sync()?;
    let mut times = Vec::with_capacity(trials);
    for _ in 0..trials {
        let t = Instant::now();
        run(reps)?;
        ctx.sync()?;
        times.push(t.elapsed().as_secs_f64() / reps as f64);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// Median GPU seconds per repetition: `record(rec, i)` records repetition `i` of `reps`; the
/// recording is encoded ahead ([`numr::gpu::Recorder::finish`]) and only submit-to-completion is
/// timed, so the CPU's encoding (which a real engine overlaps with the GPU) is not counted.
/// Untimed trials run first for at least [`WARM_SECS`] (the GPU's clocks rise only under
/// sustained load; from idle, short kernels measure up to several times slower), then `trials`
/// timed ones.
pub fn time_recorded(ctx: &GpuContext, reps: usize, trials: usize, mut record: impl FnMut(&mut numr::gpu::Recorder, usize) -> Result<()>) -> Result<f64> {
    let trial = |record: &mut dyn FnMut(&mut numr::gpu::Recorder, usize) -> Result<()>| -> Result<f64> {
        let mut rec = ctx.recorder();
        for i in 0..reps {
            record(&mut rec, i)?;
        }
        let done = rec.finish()?;
        ctx.sync()?;
        let t = Instant::now();
        done.submit()?;
        ctx.sync()?;
        Ok(t.elapsed().as_secs_f64() / reps as f64)
    };
    let warm = Instant::now();
    trial(&mut record)?;
    while warm.elapsed().as_secs_f64() < WARM_SECS {
        trial(&mut record)?;
    }
    let mut times = (0..trials).map(|_| trial(&mut record)).collect::<Result<Vec<f64>>>()?;
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// Seconds of untimed load before each [`time_recorded`] measurement.
pub const WARM_SECS: f64 = 0.25;

/// Largest test buffer for this adapter: `want` bytes, capped by one binding.
pub fn cap_bytes(ctx: &GpuContext, want: u64) -> u64 {
    let max = ctx.capabilities().limits.max_storage_buffer_binding_size.min(ctx.capabilities().limits.max_buffer_size);
    want.min(max / 16 * 16)
}

/// The bandwidth roofline: a plain streaming read of `bytes`.
pub fn stream_read(ctx: &GpuContext, bytes: u64, reps: usize) -> Result<Measurement> {
    let bytes = cap_bytes(ctx, bytes);
    let src = Tensor::zeros(&[(bytes / 4) as usize], DType::U32, &Device::Gpu(ctx.clone()))?;
    let env = KernelEnv::from_caps(ctx.capabilities());
    let k = ctx.kernel(&StreamRead.source(&env))?;
    let n_vec4 = (bytes / 16) as u32;
    let workgroups = (n_vec4 / 256).clamp(1, 16384);
    let dst = ctx.alloc(workgroups as u64 * 4, BufferKind::Storage)?;
    let group = ctx.bind(&k, &[src.gpu_binding(16)?.0, Binding::whole(&dst)])?;
    let grid = grid_2d(workgroups as u64, 65535).expect("small grid");
    let s = time_recorded(ctx, reps, 5, |rec, _| {
        rec.dispatch(&k, &group, &[n_vec4, workgroups * 256], grid)?;
        Ok(())
    })?;
    Ok(Measurement { label: format!("stream read {} MiB", bytes >> 20), seconds: s, bytes: bytes as f64, flops: 0.0 })
}

/// A contiguous copy of `bytes` through [`Tensor::copy`] (counts bytes read plus written).
pub fn copy(ctx: &GpuContext, bytes: u64, reps: usize) -> Result<Measurement> {
    let bytes = cap_bytes(ctx, bytes);
    let src = Tensor::zeros(&[(bytes / 4) as usize], DType::F32, &Device::Gpu(ctx.clone()))?;
    // One submit per repetition, so each output returns to the pool before the next is made.
    let s = time_reps(ctx, reps, 5, |r| {
        for _ in 0..r {
            let out = src.copy()?;
            ctx.flush()?;
            drop(out);
        }
        Ok(())
    })?;
    Ok(Measurement { label: format!("copy {} MiB", bytes >> 20), seconds: s, bytes: 2.0 * bytes as f64, flops: 0.0 })
}

/// `[m, k] · [k, n]` matmul of `dtype` (f16 accumulates in f32) through [`Tensor::matmul`].
pub fn matmul(ctx: &GpuContext, dtype: DType, m: usize, n: usize, k: usize, reps: usize) -> Result<Measurement> {
    let dev = Device::Gpu(ctx.clone());
    let fill = |rows: usize, cols: usize| -> Result<Tensor> {
        let v: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 1000.0).collect();
        Tensor::from_slice(&v, &[rows, cols], &Device::Cpu)?.cast(dtype)?.to_device(&dev)
    };
    let (a, b) = (fill(m, k)?, fill(k, n)?);
    let s = time_reps(ctx, reps, 3, |r| {
        for _ in 0..r {
            let out = a.matmul(&b)?;
            ctx.flush()?;
            drop(out);
        }
        Ok(())
    })?;
    let e = dtype.size() as f64;
    Ok(Measurement { label: format!("matmul {dtype} {m}x{k}x{n}"), seconds: s, bytes: e * (m * k + k * n + m * n) as f64, flops: 2.0 * (m * n * k) as f64 })
}

/// One variant of numr's matmul kernel, dispatched directly over bind groups built once:
/// `[m, k] · [k, n]`, both row-major.
pub fn matmul_variant(ctx: &GpuContext, cfg: numr::kernels::matmul::Matmul, m: usize, n: usize, k: usize, reps: usize) -> Result<Measurement> {
    matmul_variant_data(ctx, cfg, m, n, k, reps, false)
}

/// [`matmul_variant`]; `f16_values`: round the inputs to f16 values first (to test an f32 kernel
/// on exactly the data an f16 kernel sees).
pub fn matmul_variant_data(
    ctx: &GpuContext,
    cfg: numr::kernels::matmul::Matmul,
    m: usize,
    n: usize,
    k: usize,
    reps: usize,
    f16_values: bool,
) -> Result<Measurement> {
    use numr::kernels::matmul::TILE;
    let dev = Device::Gpu(ctx.clone());
    let fill = |rows: usize, cols: usize| -> Result<Tensor> {
        let v: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 1000.0).collect();
        let t = Tensor::from_slice(&v, &[rows, cols], &Device::Cpu)?;
        let t = if f16_values { t.cast(DType::F16)?.cast(DType::F32)? } else { t };
        t.cast(cfg.dtype)?.to_device(&dev)
    };
    let (a, b) = (fill(m, k)?, fill(k, n)?);
    let out = Tensor::zeros(&[m, n], if cfg.out_f16 { DType::F16 } else { DType::F32 }, &dev)?;
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut src = cfg.source(&env);
    if cfg.unchecked {
        // SAFETY: the tiled matmul bounds every load and store by `m`, `n`, `k` (edge tiles are
        // masked), and the tensors above hold exactly `m * k`, `k * n` and `m * n` elements.
        src = unsafe { src.assume_in_bounds() };
    }
    let kern = ctx.kernel(&src)?;
    let group = ctx.bind(&kern, &[a.gpu_binding(4)?.0, b.gpu_binding(4)?.0, out.gpu_binding(4)?.0])?;
    let params = [m, n, k, 0, m * k, k, 1, 0, k * n, n, 1].map(|x| x as u32);
    let grid = [(n as u32).div_ceil(TILE), (m as u32).div_ceil(TILE), 1];
    let s = time_recorded(ctx, reps, 3, |rec, _| {
        rec.dispatch(&kern, &group, &params, grid)?;
        Ok(())
    })?;
    let e = cfg.dtype.size() as f64;
    Ok(Measurement {
        label: format!("kernel {}{} {m}x{k}x{n}", kern.name(), if f16_values { " (f16-rounded data)" } else { "" }),
        seconds: s,
        bytes: e * (m * k + k * n + m * n) as f64,
        flops: 2.0 * (m * n * k) as f64,
    })
}

/// Cost of one small dispatch: `n` dispatches of a one-workgroup kernel in one pass and one
/// submit. `dependent`: each reads the word the previous one wrote (a barrier between each);
/// else each writes its own word (no hazards). The label names the context's options.
pub fn dispatch_overhead(ctx: &GpuContext, n: usize, dependent: bool) -> Result<Measurement> {
    use numr::gpu::{Access, KernelBuilder};
    let env = KernelEnv::from_caps(ctx.capabilities());
    let k = ctx.kernel(
        &KernelBuilder::new("tiny", env)
            .storage("x", Access::ReadWrite, "array<u32>")
            .params(&["i", "j"])
            .prelude("var<workgroup> scratch: array<u32, 1024>;")
            .workgroup(64, 1, 1)
            .body("    scratch[lidx] = lidx;\n    workgroupBarrier();\n    if (lidx == 0u) { x[p.j] = x[p.i] + scratch[63]; }\n")
            .build(),
    )?;
    let buf = ctx.alloc((n as u64 + 1) * 4, BufferKind::Storage)?;
    let group = ctx.bind(&k, &[Binding::whole(&buf)])?;
    let record = |rec: &mut numr::gpu::Recorder, i: usize| {
        let i = i as u32;
        let p = if dependent { [i, i + 1] } else { [n as u32, i] };
        rec.dispatch(&k, &group, &p, [1, 1, 1])
    };
    let s = time_recorded(ctx, n, 5, record)?;
    // The CPU side: recording and encoding one dispatch.
    let t = Instant::now();
    let mut rec = ctx.recorder();
    for i in 0..n {
        record(&mut rec, i)?;
    }
    drop(rec.finish()?);
    let encode = t.elapsed().as_secs_f64() / n as f64;
    let zi = if ctx.options().zero_init_workgroup_memory { ", zero-init wg memory" } else { "" };
    let mut gpu = String::new();
    if ctx.capabilities().timestamps {
        let mut rec = ctx.recorder();
        for i in 0..n as u32 {
            let p = if dependent { [i, i + 1] } else { [n as u32, i] };
            rec.dispatch(&k, &group, &p, [1, 1, 1])?;
        }
        let mut t: Vec<f64> = rec.submit_profiled()?.entries.iter().map(|e| e.1).collect();
        t.sort_by(|a, b| a.total_cmp(b));
        gpu = format!(", GPU timestamps median {:.2} us", t[t.len() / 2] / 1e3);
    }
    Ok(Measurement {
        label: format!(
            "{n} tiny dispatches, {}{zi}{gpu}, encoding {:.2} us (GPU wall per dispatch)",
            if dependent { "dependent" } else { "independent" },
            encode * 1e6
        ),
        seconds: s,
        bytes: 0.0,
        flops: 0.0,
    })
}

/// The numr core table: roofline, copy and matmuls, with the fraction of the roofline.
pub fn core_table(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let (bytes, reps, mm) = if quick { (64u64 << 20, 3, 512) } else { (1u64 << 30, 20, 4096) };
    let mut v = vec![stream_read(ctx, bytes, reps)?, copy(ctx, bytes, reps)?];
    for dtype in [DType::F32, DType::F16] {
        v.push(matmul(ctx, dtype, mm, mm, mm, if quick { 2 } else { 10 })?);
    }
    let env = KernelEnv::from_caps(ctx.capabilities());
    use numr::kernels::matmul::Matmul;
    let mreps = if quick { 2 } else { 10 };
    for cfg in Matmul::all(&env) {
        v.push(matmul_variant(ctx, cfg, mm, mm, mm, mreps)?);
    }
    // Diagnostics for the f16 matmul gap: no bounds checks; f32 kernel on f16-rounded values.
    for cfg in [Matmul::new(DType::F32), Matmul::new(DType::F16), Matmul { pair_loads: true, unrolled_store: true, ..Matmul::new(DType::F16) }] {
        v.push(matmul_variant(ctx, Matmul { unchecked: true, ..cfg }, mm, mm, mm, mreps)?);
    }
    v.push(matmul_variant_data(ctx, Matmul::new(DType::F32), mm, mm, mm, mreps, true)?);
    let n = if quick { 50 } else { 1000 };
    v.push(dispatch_overhead(ctx, n, true)?);
    v.push(dispatch_overhead(ctx, n, false)?);
    let mut zero_opts = ctx.options().clone();
    zero_opts.zero_init_workgroup_memory = true;
    let zero = numr::GpuContext::with_options(zero_opts)?;
    v.push(dispatch_overhead(&zero, n, true)?);
    v.extend(recording::recording_cost(ctx, quick)?);
    Ok(v)
}

/// Prints measurements as a markdown table; bandwidth figures as a fraction of the first row.
pub fn print_table(ctx: &GpuContext, rows: &[Measurement]) {
    let roof = rows.first().map(|m| m.gbps()).unwrap_or(0.0);
    println!("adapter: {} ({})", ctx.capabilities().adapter_name, ctx.capabilities().backend);
    println!("| workload | time | GB/s | of roofline | TFLOP/s |");
    println!("|---|---|---|---|---|");
    for m in rows {
        let tf = if m.flops > 0.0 { format!("{:.2}", m.tflops()) } else { "-".into() };
        let frac = if m.flops == 0.0 && roof > 0.0 { format!("{:.0}%", 100.0 * m.gbps() / roof) } else { "-".into() };
        println!("| {} | {:.1} us | {:.0} | {} | {} |", m.label, m.seconds * 1e6, m.gbps(), frac, tf);
    }
}
