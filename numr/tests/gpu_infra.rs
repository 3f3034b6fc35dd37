//! The GPU machinery: buffer pool reuse, limits as typed errors, the pipeline cache, the recorder
//! (one encoder, one pass, one submit; bind groups reused across submits; recordings finished
//! ahead and submitted later), the uniform-arena parameter path, the profiler and the implicit stream.

use numr::gpu::{Access, Binding, BufferKind, GpuOptions, KernelBuilder, KernelEnv, ParamMode};
use numr::kernels::binary::{Binary, BinaryOp};
use numr::testing::{check_close, test_gpu};
use numr::{DType, Device, GpuContext, NumrError, Tensor};

fn data(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect()
}

#[test]
fn pool_reuses_freed_buffers_by_size_class() {
    let Some(ctx) = test_gpu() else { return };
    let before = ctx.pool_stats();
    let a = ctx.alloc(1000, BufferKind::Storage).unwrap();
    assert_eq!(a.capacity(), 1024);
    drop(a);
    let b = ctx.alloc(900, BufferKind::Storage).unwrap();
    let after = ctx.pool_stats();
    assert!(after.reused > before.reused, "{before:?} -> {after:?}");
    assert_eq!(b.capacity(), 1024);
}

#[test]
fn limits_are_typed_errors() {
    let Some(ctx) = test_gpu() else { return };
    let dev = Device::Gpu(ctx.clone());
    let limits = ctx.capabilities().limits.clone();
    let n = (limits.max_buffer_size / 4 + 16) as usize;
    match Tensor::zeros(&[n], DType::F32, &dev) {
        Err(NumrError::BufferTooLarge { bytes, limit }) => assert!(bytes > limit),
        other => panic!("expected BufferTooLarge, got {other:?}"),
    }
    assert!(matches!(ctx.alloc(limits.max_buffer_size + 1, BufferKind::Storage), Err(NumrError::BufferTooLarge { .. })));
    // A tensor that fits a buffer but not one binding.
    let binding = limits.max_storage_buffer_binding_size;
    if binding + 1024 <= limits.max_buffer_size && binding <= 1 << 30 {
        let t = Tensor::zeros(&[(binding / 4 + 64) as usize], DType::F32, &dev).unwrap();
        match t.scale(2.0) {
            Err(NumrError::BindingTooLarge { bytes, limit }) => assert!(bytes > limit && limit == binding),
            other => panic!("expected BindingTooLarge, got {other:?}"),
        }
        // A view of it that fits one binding still works.
        let v = t.narrow(0, 1000, 1000).unwrap().scale(2.0).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), vec![0.0; 1000]);
    }
}

#[test]
fn pipeline_cache_compiles_once() {
    // A context of its own: tests run in parallel and others compile kernels on the shared one.
    if test_gpu().is_none() {
        return;
    }
    let ctx = GpuContext::new().unwrap();
    let dev = Device::Gpu(ctx.clone());
    let a = Tensor::from_slice(&data(100), &[100], &dev).unwrap();
    a.scale(2.0).unwrap();
    let n = ctx.cached_kernels();
    for _ in 0..5 {
        a.scale(3.0).unwrap();
    }
    assert_eq!(ctx.cached_kernels(), n);
    let env = KernelEnv::from_caps(ctx.capabilities());
    let src = Binary { op: BinaryOp::Scale, dtype: DType::F32 }.source(&env);
    let k1 = ctx.kernel(&src).unwrap();
    let k2 = ctx.kernel(&src).unwrap();
    assert!(std::sync::Arc::ptr_eq(&k1, &k2));
}

fn scale_params(n: u32, s: f32) -> Vec<u32> {
    let mut p = vec![n, s.to_bits(), 0, 0, 1, 1, 1, 1, 1, n];
    p.extend([0, 0, 0, 0, 0, 1]);
    p
}

#[test]
fn recorder_one_pass_one_submit_and_reused_bind_groups() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let k = ctx.kernel(&Binary { op: BinaryOp::Scale, dtype: DType::F32 }.source(&env)).unwrap();
    let n = 3000usize;
    let x = data(n);
    let a = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
    let b = ctx.alloc((n * 4) as u64, BufferKind::Storage).unwrap();
    // Built once, reused for every dispatch of two submits.
    let ab = ctx.bind(&k, &[Binding::whole(&a), Binding::whole(&b)]).unwrap();
    let ba = ctx.bind(&k, &[Binding::whole(&b), Binding::whole(&a)]).unwrap();
    let grid = [(n as u32).div_ceil(256), 1, 1];
    for _ in 0..2 {
        let mut rec = ctx.recorder();
        for i in 0..40 {
            let (g, s) = if i % 2 == 0 { (&ab, 2.0) } else { (&ba, 1.5) };
            rec.dispatch(&k, g, &scale_params(n as u32, s), grid).unwrap();
        }
        assert_eq!(rec.dispatch_count(), 40);
        assert_eq!(rec.pass_count(), 1);
        rec.submit().unwrap();
    }
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&a, 0, (n * 4) as u64).unwrap());
    let want: Vec<f64> = x.iter().map(|&v| v as f64 * 3f64.powi(40)).collect();
    check_close(&got.iter().map(|&v| v as f64).collect::<Vec<_>>(), &want, DType::F32).unwrap();
}

/// Two recordings finished ahead and submitted in the reverse order: each runs with its own
/// parameters (immediates, or a uniform buffer of its own), in submission order.
#[test]
fn finished_recordings_submit_later_with_their_own_parameters() {
    let Some(shared) = test_gpu() else { return };
    let arena = GpuContext::with_options(GpuOptions { param_mode: Some(ParamMode::UniformArena), ..GpuOptions::from_env() }).unwrap();
    for ctx in [shared, arena] {
        let env = KernelEnv::from_caps(ctx.capabilities());
        let k = ctx.kernel(&Binary { op: BinaryOp::Scale, dtype: DType::F32 }.source(&env)).unwrap();
        let n = 1000usize;
        let x = data(n);
        let a = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
        let b = ctx.alloc((n * 4) as u64, BufferKind::Storage).unwrap();
        // `ab`: b = s a; `ba`: a = s b.
        let ab = ctx.bind(&k, &[Binding::whole(&a), Binding::whole(&b)]).unwrap();
        let ba = ctx.bind(&k, &[Binding::whole(&b), Binding::whole(&a)]).unwrap();
        let grid = [(n as u32).div_ceil(256), 1, 1];
        let finish = |steps: &[(&numr::gpu::BoundGroup, f32)]| {
            let mut rec = ctx.recorder();
            for &(g, s) in steps {
                rec.dispatch(&k, g, &scale_params(n as u32, s), grid).unwrap();
            }
            rec.finish().unwrap()
        };
        let first = finish(&[(&ab, 2.0), (&ba, 3.0)]);
        let second = finish(&[(&ab, 0.5)]);
        assert_eq!((first.dispatch_count(), second.dispatch_count()), (2, 1));
        // A plain recording in between must not disturb the finished ones' parameters.
        let mut rec = ctx.recorder();
        rec.dispatch(&k, &ba, &scale_params(n as u32, -1.0), grid).unwrap();
        second.submit().unwrap();
        rec.submit().unwrap();
        first.submit().unwrap();
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&a, 0, (n * 4) as u64).unwrap());
        let want: Vec<f64> = x.iter().map(|&v| v as f64 * -3.0).collect();
        check_close(&got.iter().map(|&v| v as f64).collect::<Vec<_>>(), &want, DType::F32).unwrap();
    }
}

#[test]
fn uniform_arena_parameters() {
    if test_gpu().is_none() {
        return;
    }
    let ctx = GpuContext::with_options(GpuOptions { param_mode: Some(ParamMode::UniformArena), ..GpuOptions::from_env() }).unwrap();
    assert_eq!(ctx.capabilities().param_mode, ParamMode::UniformArena);
    let dev = Device::Gpu(ctx.clone());
    let x = Tensor::from_slice(&data(5000), &[50, 100], &Device::Cpu).unwrap();
    let xg = x.to_device(&dev).unwrap();
    // Several dispatches with different parameters in one recording: each must see its own.
    let got = xg.scale(2.0).unwrap().add(&xg.scale(-0.5).unwrap()).unwrap().softmax_last().unwrap();
    let want = x.scale(2.0).unwrap().add(&x.scale(-0.5).unwrap()).unwrap().softmax_last().unwrap();
    check_close(&got.to_f64_vec().unwrap(), &want.to_f64_vec().unwrap(), DType::F32).unwrap();
    let w = Tensor::from_slice(&data(100 * 30), &[100, 30], &Device::Cpu).unwrap();
    let mm = xg.matmul(&w.to_device(&dev).unwrap()).unwrap();
    check_close(&mm.to_f64_vec().unwrap(), &x.matmul(&w).unwrap().to_f64_vec().unwrap(), DType::F32).unwrap();
}

#[test]
fn profiler_reports_time_per_dispatch() {
    let Some(ctx) = test_gpu() else { return };
    if !ctx.capabilities().timestamps {
        numr::testing::skip_path(&ctx, "the profiler's time per dispatch", "no timestamp queries");
        return;
    }
    let env = KernelEnv::from_caps(ctx.capabilities());
    let k = ctx.kernel(&Binary { op: BinaryOp::Scale, dtype: DType::F32 }.source(&env)).unwrap();
    let n = 1 << 20;
    let a = ctx.upload(bytemuck::cast_slice(&data(n))).unwrap();
    let b = ctx.alloc((n * 4) as u64, BufferKind::Storage).unwrap();
    let mut rec = ctx.recorder();
    for _ in 0..3 {
        rec.dispatch_with(&k, &[Binding::whole(&a), Binding::whole(&b)], &scale_params(n as u32, 2.0), [(n as u32) / 256, 1, 1]).unwrap();
    }
    let profile = rec.submit_profiled().unwrap();
    assert_eq!(profile.entries.len(), 3);
    assert!(profile.entries.iter().all(|(l, ns)| &**l == "scale_f32" && *ns >= 0.0));
    assert!(profile.total_ns() > 0.0, "{profile}");
}

#[test]
fn eager_ops_share_one_submit() {
    // A context of its own, so no other test flushes its stream in between.
    if test_gpu().is_none() {
        return;
    }
    let ctx = GpuContext::new().unwrap();
    let dev = Device::Gpu(ctx.clone());
    ctx.sync().unwrap();
    let x = Tensor::from_slice(&data(1000), &[1000], &dev).unwrap();
    let mut y = x.clone();
    for _ in 0..50 {
        y = y.add(&x).unwrap();
    }
    assert_eq!(ctx.pending_dispatches(), 50, "50 eager ops, nothing submitted yet");
    let got = y.to_vec::<f32>().unwrap();
    assert_eq!(ctx.pending_dispatches(), 0);
    let want: Vec<f64> = data(1000).iter().map(|&v| v as f64 * 51.0).collect();
    check_close(&got.iter().map(|&v| v as f64).collect::<Vec<_>>(), &want, DType::F32).unwrap();
}

#[test]
fn bad_kernels_and_devices_are_typed_errors() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let bad = KernelBuilder::new("broken", env).storage("x", Access::ReadWrite, "array<u32>").body("    x[0] = undefined_thing;\n").build();
    assert!(matches!(ctx.kernel(&bad), Err(NumrError::ShaderCompile { .. })));
    let limit = ctx.capabilities().limits.max_storage_buffers_per_shader_stage;
    if limit < 64 {
        let mut b = KernelBuilder::new("wide", env);
        for i in 0..=limit {
            b = b.storage(&format!("x{i}"), Access::Read, "array<u32>");
        }
        assert!(matches!(ctx.kernel(&b.build()), Err(NumrError::TooManyBindings { .. })));
    }
    let g = Tensor::from_slice(&[1f32, 2.0], &[2], &Device::Gpu(ctx.clone())).unwrap();
    let c = Tensor::from_slice(&[1f32, 2.0], &[2], &Device::Cpu).unwrap();
    assert!(matches!(g.add(&c), Err(NumrError::DeviceMismatch { .. })));
    // The context stays usable after errors.
    assert_eq!(g.add(&g).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn adapter_by_index_matches_the_listing() {
    // `NUMR_ADAPTER=<i>` must pick the adapter `list_adapters` prints as `i:` (it used to index a
    // different enumeration, so an index that was listed could be refused).
    if test_gpu().is_none() {
        return;
    }
    let list = GpuContext::list_adapters();
    let (i, line) = list.iter().enumerate().rev().find(|(_, l)| l.contains("Vulkan")).or_else(|| list.iter().enumerate().next()).expect("adapters listed");
    let ctx = GpuContext::with_options(GpuOptions { adapter: Some(i.to_string()), ..GpuOptions::default() }).unwrap();
    let name = &ctx.capabilities().adapter_name;
    assert!(line.starts_with(&format!("{i}: {name} (")), "index {i} gave {name}, listed as {line}");
}

/// Threads sharing one context: each records eager ops into the implicit stream and reads them
/// back, or submits an explicit recording after its stream work, while another thread flushes
/// the stream in a loop. Every result must be the thread's own. (Taking the stream and
/// submitting it were two steps: another thread could take a thread's pending work, and the
/// thread's readback or explicit submission would then run before it.)
#[test]
fn threads_sharing_a_context_see_their_own_stream_work_in_order() {
    let Some(ctx) = test_gpu() else { return };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (ctx, stop) = (ctx.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                ctx.flush().unwrap();
            }
        })
    };
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                let dev = Device::Gpu(ctx.clone());
                for i in 0..150 {
                    let v: Vec<f32> = (0..4096).map(|j| (w * 1000 + i * 7 + j) as f32).collect();
                    let a = Tensor::from_slice(&v, &[v.len()], &dev).unwrap();
                    // Eager op, then readback through the implicit stream.
                    let b = a.add(&a).unwrap();
                    let got = b.to_vec::<f32>().unwrap();
                    assert!(got.iter().zip(&v).all(|(g, x)| *g == 2.0 * x), "worker {w} step {i}: eager readback");
                    // Stream work (a copy into `dst`), then an explicit recording reading it.
                    let dst = ctx.alloc(4 * 4096, BufferKind::Storage).unwrap();
                    let (src, off) = b.gpu_binding(4).unwrap();
                    ctx.with_stream(|rec| rec.copy(&src.buffer, src.offset + 4 * off as u64, &dst, 0, 4 * 4096)).unwrap();
                    let out = ctx.alloc(4 * 4096, BufferKind::Storage).unwrap();
                    let mut rec = ctx.recorder();
                    rec.copy(&dst, 0, &out, 0, 4 * 4096).unwrap();
                    rec.submit().unwrap();
                    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&out, 0, 4 * 4096).unwrap());
                    assert!(got.iter().zip(&v).all(|(g, x)| *g == 2.0 * x), "worker {w} step {i}: explicit recording after stream work");
                }
            })
        })
        .collect();
    for t in workers {
        t.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flusher.join().unwrap();
}

/// A bulk upload: writes of odd lengths across many small staging chunks and batches (so the
/// ring is reused and batches wait for each other) land where they were written, after what the
/// context wrote before it; a misaligned or oversized write is a typed error.
#[test]
fn bulk_upload_lands_every_write_through_a_reused_ring() {
    let Some(ctx) = test_gpu() else { return };
    let bytes = |n: usize, seed: usize| -> Vec<u8> { (0..n).map(|i| ((i * 31 + seed * 7) % 251) as u8).collect() };
    let before = ctx.upload(&vec![0xAAu8; 4096]).unwrap();
    let mut bulk = ctx.bulk_upload_sized(64 << 10, 256 << 10).unwrap();
    let sizes = [1, 3, 4, 4097, 64 << 10, (64 << 10) + 5, 300_001, 1 << 20];
    let mut bufs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let d = bytes(n, i);
        bufs.push((bulk.upload(&d).unwrap(), d));
    }
    let patch = bytes(1000, 99);
    bulk.write(&before, 2048, &patch).unwrap();
    assert!(matches!(bulk.write(&before, 2, &patch), Err(NumrError::Validation { .. })));
    assert!(matches!(bulk.write(&before, 4000, &patch), Err(NumrError::Validation { .. })));
    let written: u64 = sizes.iter().map(|n| n.next_multiple_of(4) as u64).sum::<u64>() + 1000;
    assert_eq!(bulk.bytes(), written);
    bulk.finish().unwrap();
    for (b, d) in &bufs {
        assert_eq!(&ctx.read_bytes(b, 0, d.len() as u64).unwrap(), d);
    }
    let got = ctx.read_bytes(&before, 0, 4096).unwrap();
    assert!(got[..2048].iter().all(|&b| b == 0xAA) && got[3048..].iter().all(|&b| b == 0xAA));
    assert_eq!(&got[2048..3048], &patch[..]);
    assert!(matches!(ctx.bulk_upload_sized(6, 1 << 20), Err(NumrError::Validation { .. })));
}
