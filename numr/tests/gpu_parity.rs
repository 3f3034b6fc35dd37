//! Every core op on the GPU against the CPU reference, on several shapes: sizes that are not
//! multiples of the workgroup, strided and offset views, and sizes above 65535 × 256 elements.

use numr::testing::{check_close, test_gpu};
use numr::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Random tensor of `dtype` on the CPU (ints in a small range so products stay exact).
fn random(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut r = rng(seed);
    let v: Vec<f32> = (0..n).map(|_| if dtype.is_float() { r.random_range(-2.0f32..2.0) } else { r.random_range(0..200) as f32 }).collect();
    Tensor::from_slice(&v, shape, &Device::Cpu).unwrap().cast(dtype).unwrap()
}

fn gpu() -> Option<Device> {
    test_gpu().map(Device::Gpu)
}

fn assert_parity(label: &str, gpu: &Tensor, cpu: &Tensor) {
    assert_eq!(gpu.shape(), cpu.shape(), "{label}: shape");
    assert_eq!(gpu.dtype(), cpu.dtype(), "{label}: dtype");
    let (g, c) = (gpu.to_f64_vec().unwrap(), cpu.to_f64_vec().unwrap());
    if let Err(e) = check_close(&g, &c, cpu.dtype()) {
        panic!("{label}: {e}");
    }
}

const SHAPES: &[&[usize]] = &[&[1], &[7], &[255], &[256], &[257], &[3, 1000], &[2, 3, 5, 7], &[4, 1, 33]];
const BIG: usize = 65535 * 256 + 1000;

#[test]
fn casts_all_pairs() {
    let Some(dev) = gpu() else { return };
    for (si, shape) in SHAPES.iter().enumerate() {
        for src in DType::ALL {
            let x = random(shape, src, si as u64);
            let xg = x.to_device(&dev).unwrap();
            for dst in DType::ALL {
                assert_parity(&format!("cast {src}->{dst} {shape:?}"), &xg.cast(dst).unwrap(), &x.cast(dst).unwrap());
            }
        }
    }
}

#[test]
fn elementwise_ops() {
    let Some(dev) = gpu() else { return };
    for (si, shape) in SHAPES.iter().enumerate() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32] {
            let a = random(shape, dtype, 10 + si as u64);
            let b = random(shape, dtype, 20 + si as u64);
            let (ag, bg) = (a.to_device(&dev).unwrap(), b.to_device(&dev).unwrap());
            let l = format!("{dtype} {shape:?}");
            assert_parity(&format!("add {l}"), &ag.add(&bg).unwrap(), &a.add(&b).unwrap());
            assert_parity(&format!("mul {l}"), &ag.mul(&bg).unwrap(), &a.mul(&b).unwrap());
            assert_parity(&format!("scale {l}"), &ag.scale(3.0).unwrap(), &a.scale(3.0).unwrap());
        }
    }
}

#[test]
fn broadcast_and_strided_views() {
    let Some(dev) = gpu() else { return };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let a = random(&[6, 5, 9], dtype, 1);
        let row = random(&[9], dtype, 2);
        let col = random(&[6, 1, 1], dtype, 3);
        let (ag, rg, cg) = (a.to_device(&dev).unwrap(), row.to_device(&dev).unwrap(), col.to_device(&dev).unwrap());
        assert_parity("add row", &ag.add(&rg).unwrap(), &a.add(&row).unwrap());
        assert_parity("mul col", &ag.mul(&cg).unwrap(), &a.mul(&col).unwrap());
        let p = [2, 0, 1];
        assert_parity("permute", &ag.permute(&p).unwrap().contiguous().unwrap(), &a.permute(&p).unwrap().contiguous().unwrap());
        let tv = ag.transpose(0, 2).unwrap();
        assert_parity("transpose+add", &tv.add(&tv).unwrap(), &a.transpose(0, 2).unwrap().add(&a.transpose(0, 2).unwrap()).unwrap());
        let nv = ag.narrow(2, 3, 5).unwrap();
        assert_parity("narrow contiguous", &nv.contiguous().unwrap(), &a.narrow(2, 3, 5).unwrap().contiguous().unwrap());
        // Rank 7 collapses to fit the kernel's six dims.
        let r7 = random(&[2, 1, 3, 1, 2, 2, 3], dtype, 4);
        let r7g = r7.to_device(&dev).unwrap();
        let q = [6, 5, 4, 3, 2, 1, 0];
        assert_parity("rank7 permute", &r7g.permute(&q).unwrap().contiguous().unwrap(), &r7.permute(&q).unwrap().contiguous().unwrap());
    }
}

#[test]
fn offset_view_binds_at_an_aligned_offset() {
    let Some(dev) = gpu() else { return };
    let a = random(&[4000], DType::F32, 5);
    let ag = a.to_device(&dev).unwrap();
    let v = ag.narrow(0, 1001, 2500).unwrap();
    let (binding, elem_off) = v.gpu_binding(4).unwrap();
    let align = dev.gpu_context().unwrap().capabilities().limits.min_storage_buffer_offset_alignment as u64;
    assert!(binding.offset > 0, "a view at element 1001 must bind at a non-zero offset");
    assert_eq!(binding.offset % align, 0);
    assert_eq!(binding.offset + elem_off as u64 * 4, 1001 * 4);
    let cv = a.narrow(0, 1001, 2500).unwrap();
    assert_parity("offset view scale", &v.scale(2.0).unwrap(), &cv.scale(2.0).unwrap());
    assert_parity("offset view copy", &v.contiguous().unwrap(), &cv.contiguous().unwrap());
    assert_parity("offset view to_vec", &v, &cv);
    // Sub-word dtype at an odd element offset.
    let h = a.cast(DType::F16).unwrap();
    let hv = h.to_device(&dev).unwrap().narrow(0, 333, 1001).unwrap();
    assert_parity("f16 offset view", &hv.add(&hv).unwrap(), &h.narrow(0, 333, 1001).unwrap().add(&h.narrow(0, 333, 1001).unwrap()).unwrap());
}

#[test]
fn reductions_and_softmax() {
    let Some(dev) = gpu() else { return };
    for (si, shape) in SHAPES.iter().copied().chain([&[5usize, 4097][..], &[70000, 3][..]]).enumerate() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let a = random(shape, dtype, 30 + si as u64);
            let ag = a.to_device(&dev).unwrap();
            let l = format!("{dtype} {shape:?}");
            assert_parity(&format!("sum {l}"), &ag.sum_last().unwrap(), &a.sum_last().unwrap());
            assert_parity(&format!("max {l}"), &ag.max_last().unwrap(), &a.max_last().unwrap());
            assert_parity(&format!("softmax {l}"), &ag.softmax_last().unwrap(), &a.softmax_last().unwrap());
        }
    }
    // A strided input goes through a contiguous copy first.
    let a = random(&[9, 31], DType::F32, 99);
    let ag = a.to_device(&dev).unwrap().transpose(0, 1).unwrap();
    assert_parity("softmax transposed", &ag.softmax_last().unwrap(), &a.transpose(0, 1).unwrap().softmax_last().unwrap());
}

#[test]
fn matmul_shapes() {
    let Some(dev) = gpu() else { return };
    let cases: &[(usize, usize, usize, usize)] = &[(1, 1, 1, 1), (1, 7, 13, 5), (1, 64, 64, 64), (2, 65, 130, 33), (3, 100, 17, 129), (1, 1, 300, 257)];
    for dtype in [DType::F32, DType::F16] {
        for (i, &(b, m, k, n)) in cases.iter().enumerate() {
            let x = random(&[b, m, k], dtype, 40 + i as u64);
            let y = random(&[b, k, n], dtype, 50 + i as u64);
            let (xg, yg) = (x.to_device(&dev).unwrap(), y.to_device(&dev).unwrap());
            let l = format!("{dtype} b{b} m{m} k{k} n{n}");
            assert_parity(&format!("matmul {l}"), &xg.matmul(&yg).unwrap(), &x.matmul(&y).unwrap());
            // Transposed right-hand side as a view (no copy), broadcast over the batch.
            let w = random(&[n, k], dtype, 60 + i as u64);
            let wt = w.transpose(0, 1).unwrap();
            let wg = w.to_device(&dev).unwrap().transpose(0, 1).unwrap();
            assert_parity(&format!("matmul x·wᵀ {l}"), &xg.matmul(&wg).unwrap(), &x.matmul(&wt).unwrap());
        }
    }
}

#[test]
fn big_tensors_past_the_1d_grid() {
    let Some(dev) = gpu() else { return };
    for dtype in [DType::F32, DType::F16, DType::U8] {
        let a = random(&[BIG], dtype, 70);
        let ag = a.to_device(&dev).unwrap();
        assert_parity(&format!("big cast {dtype}"), &ag.cast(DType::F32).unwrap(), &a.cast(DType::F32).unwrap());
        if dtype != DType::U8 {
            assert_parity(&format!("big add {dtype}"), &ag.add(&ag).unwrap(), &a.add(&a).unwrap());
        }
        // Strided copy over the whole tensor.
        let shape = [BIG / 8, 8];
        let r = ag.narrow(0, 0, BIG / 8 * 8).unwrap().reshape(&shape).unwrap().transpose(0, 1).unwrap();
        let rc = a.narrow(0, 0, BIG / 8 * 8).unwrap().reshape(&shape).unwrap().transpose(0, 1).unwrap();
        assert_parity(&format!("big transpose {dtype}"), &r.contiguous().unwrap(), &rc.contiguous().unwrap());
    }
    // 70000 rows: more workgroups than one grid dimension holds.
    let a = random(&[70000, 300], DType::F32, 71);
    assert_parity("sum 70000 rows", &a.to_device(&dev).unwrap().sum_last().unwrap(), &a.sum_last().unwrap());
}

/// Every matmul kernel variant (`Matmul::all`) dispatched directly on row-major inputs whose
/// strides satisfy every variant (even K and N), with M, N, K not multiples of the tile.
#[test]
fn matmul_every_variant() {
    use numr::gpu::KernelEnv;
    use numr::kernels::matmul::{Matmul, TILE};
    let Some(dev) = gpu() else { return };
    let Device::Gpu(ctx) = &dev else { unreachable!() };
    let env = KernelEnv::from_caps(ctx.capabilities());
    for (i, &(b, m, k, n)) in [(2usize, 66usize, 34usize, 130usize), (1, 5, 2, 2), (1, 64, 64, 64)].iter().enumerate() {
        for cfg in Matmul::all(&env) {
            let x = random(&[b, m, k], cfg.dtype, 80 + i as u64);
            let y = random(&[b, k, n], cfg.dtype, 90 + i as u64);
            let want = x.cast(DType::F32).unwrap().matmul(&y.cast(DType::F32).unwrap()).unwrap();
            let (xg, yg) = (x.to_device(&dev).unwrap(), y.to_device(&dev).unwrap());
            let out_dt = if cfg.out_f16 { DType::F16 } else { DType::F32 };
            let out = Tensor::zeros(&[b, m, n], out_dt, &dev).unwrap();
            let src = cfg.source(&env);
            let kern = ctx.kernel(&src).unwrap();
            let binds = [xg.gpu_binding(4).unwrap().0, yg.gpu_binding(4).unwrap().0, out.gpu_binding(4).unwrap().0];
            let params = [m, n, k, 0, m * k, k, 1, 0, k * n, n, 1].map(|v| v as u32);
            let grid = [(n as u32).div_ceil(TILE), (m as u32).div_ceil(TILE), b as u32];
            ctx.with_stream(|rec| rec.dispatch_with(&kern, &binds, &params, grid)).unwrap();
            let got = out.to_f64_vec().unwrap();
            let tol = if cfg.dtype == DType::F16 || cfg.out_f16 { DType::F16 } else { DType::F32 };
            if let Err(e) = check_close(&got, &want.to_f64_vec().unwrap(), tol) {
                panic!("{} b{b} m{m} k{k} n{n}: {e}", kern.name());
            }
        }
    }
}
