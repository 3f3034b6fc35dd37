//! The public device-specific ops (`numr::ops::{cpu, gpu}`) and the element accessors return
//! typed errors on bad input: a tensor on the other device, a scalar given to a reduction, a
//! missing operand, shapes that do not chain, an element past the buffer.

use numr::dtype::{read_f64, write_f64};
use numr::kernels::binary::BinaryOp;
use numr::kernels::reduce::RowOp;
use numr::ops::{cpu, gpu};
use numr::testing::test_gpu;
use numr::{DType, Device, NumrError, Tensor};

fn cpu_t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
}

fn wrong_device(r: numr::Result<Tensor>, expected: &str) {
    match r {
        Err(NumrError::WrongDevice { expected: e, .. }) => assert_eq!(e, expected),
        other => panic!("expected WrongDevice on the {expected}, got {other:?}"),
    }
}

#[test]
fn gpu_ops_refuse_cpu_tensors() {
    // No GPU needed: the check comes first.
    let a = cpu_t(&[1., 2., 3., 4.], &[2, 2]);
    let a3 = cpu_t(&[1., 2., 3., 4.], &[1, 2, 2]);
    wrong_device(gpu::convert(&a, DType::F16), "GPU");
    wrong_device(gpu::binary(&a, Some(&a), BinaryOp::Add, 0.0), "GPU");
    wrong_device(gpu::binary(&a, None, BinaryOp::Scale, 2.0), "GPU");
    wrong_device(gpu::row_op(&a, RowOp::Softmax), "GPU");
    wrong_device(gpu::matmul(&a3, &a3), "GPU");
    assert!(matches!(a.gpu_binding(4), Err(NumrError::WrongDevice { .. })));
}

#[test]
fn cpu_ops_refuse_gpu_tensors() {
    let Some(ctx) = test_gpu() else { return };
    let dev = Device::Gpu(ctx);
    let g = Tensor::from_slice(&[1f32, 2., 3., 4.], &[2, 2], &dev).unwrap();
    let g3 = g.reshape(&[1, 2, 2]).unwrap();
    wrong_device(cpu::convert(&g, DType::F16), "CPU");
    wrong_device(cpu::binary(&g, Some(&g), BinaryOp::Mul, 0.0), "CPU");
    wrong_device(cpu::binary(&g, None, BinaryOp::Scale, 2.0), "CPU");
    wrong_device(cpu::row_op(&g, RowOp::Sum), "CPU");
    wrong_device(cpu::matmul(&g3, &g3), "CPU");
    // A GPU op given one GPU and one CPU operand.
    let c = cpu_t(&[1., 2., 3., 4.], &[2, 2]);
    assert!(matches!(gpu::binary(&g, Some(&c), BinaryOp::Add, 0.0), Err(NumrError::DeviceMismatch { .. })));
    assert!(matches!(gpu::matmul(&g3, &c.reshape(&[1, 2, 2]).unwrap()), Err(NumrError::DeviceMismatch { .. })));
    // A scalar on the GPU.
    let s = Tensor::from_slice(&[1f32], &[], &dev).unwrap();
    assert!(matches!(gpu::row_op(&s, RowOp::Max), Err(NumrError::NeedsRank { got: 0, .. })));
    assert!(matches!(s.softmax_last(), Err(NumrError::NeedsRank { got: 0, .. })));
}

#[test]
fn reductions_refuse_scalars() {
    let s = cpu_t(&[1.], &[]);
    assert_eq!(s.rank(), 0);
    for op in [RowOp::Sum, RowOp::Max, RowOp::Softmax] {
        assert!(matches!(cpu::row_op(&s, op), Err(NumrError::NeedsRank { got: 0, .. })), "{op:?}");
    }
    assert!(matches!(s.sum_last(), Err(NumrError::NeedsRank { got: 0, .. })));
    assert!(matches!(s.max_last(), Err(NumrError::NeedsRank { got: 0, .. })));
    assert!(matches!(s.softmax_last(), Err(NumrError::NeedsRank { got: 0, .. })));
}

#[test]
fn binary_operands_are_checked() {
    let a = cpu_t(&[1., 2., 3., 4.], &[2, 2]);
    let b = cpu_t(&[1., 2.], &[2]);
    assert!(matches!(cpu::binary(&a, None, BinaryOp::Add, 0.0), Err(NumrError::InvalidView { .. })));
    assert!(matches!(cpu::binary(&a, Some(&a), BinaryOp::Scale, 2.0), Err(NumrError::InvalidView { .. })));
    assert!(matches!(cpu::binary(&a, Some(&b), BinaryOp::Mul, 0.0), Err(NumrError::ShapeMismatch { .. })));
    let h = a.cast(DType::F16).unwrap();
    assert!(matches!(cpu::binary(&a, Some(&h), BinaryOp::Add, 0.0), Err(NumrError::DTypeMismatch { .. })));
    // The checked paths still compute.
    assert_eq!(cpu::binary(&a, Some(&a), BinaryOp::Add, 0.0).unwrap().to_vec::<f32>().unwrap(), vec![2., 4., 6., 8.]);
    assert_eq!(cpu::binary(&a, None, BinaryOp::Scale, 0.5).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 1., 1.5, 2.]);
}

#[test]
fn matmul_operands_are_checked() {
    let a2 = cpu_t(&[1., 2., 3., 4.], &[2, 2]);
    let a3 = cpu_t(&[1., 2., 3., 4., 5., 6.], &[1, 2, 3]);
    let b3 = cpu_t(&[1., 0., 0., 1., 1., 1.], &[1, 3, 2]);
    assert!(matches!(cpu::matmul(&a2, &a2), Err(NumrError::NeedsRank { got: 2, .. })));
    assert!(matches!(gpu::matmul(&a2, &a2), Err(NumrError::NeedsRank { got: 2, .. })));
    assert!(matches!(cpu::matmul(&a3, &a3), Err(NumrError::ShapeMismatch { .. })));
    assert!(matches!(cpu::matmul(&a3, &cpu_t(&[1.; 12], &[2, 3, 2])), Err(NumrError::ShapeMismatch { .. })));
    // [1,2,3] x [1,3,2]: rows (1,2,3) and (4,5,6) against columns (1,0,1) and (0,1,1).
    assert_eq!(cpu::matmul(&a3, &b3).unwrap().to_vec::<f32>().unwrap(), vec![4., 5., 10., 11.]);
}

#[test]
fn element_access_past_the_buffer_is_an_error() {
    let mut bytes = vec![0u8; 8];
    write_f64(DType::F32, &mut bytes, 1, 2.5).unwrap();
    assert_eq!(read_f64(DType::F32, &bytes, 1).unwrap(), 2.5);
    assert!(matches!(read_f64(DType::F32, &bytes, 2), Err(NumrError::InvalidView { .. })));
    assert!(matches!(write_f64(DType::F16, &mut bytes, 4, 1.0), Err(NumrError::InvalidView { .. })));
    assert!(matches!(read_f64(DType::F32, &bytes, usize::MAX), Err(NumrError::InvalidView { .. })));
}

#[test]
fn shapes_too_large_to_count_are_errors() {
    let huge = [usize::MAX, 2];
    assert!(matches!(Tensor::zeros(&huge, DType::F32, &Device::Cpu), Err(NumrError::InvalidView { .. })));
    assert!(matches!(Tensor::from_bytes(&[], DType::F32, &huge, &Device::Cpu), Err(NumrError::InvalidView { .. })));
    assert!(matches!(Tensor::from_slice::<f32>(&[], &huge, &Device::Cpu), Err(NumrError::InvalidView { .. })));
}

#[test]
fn buffer_ranges_past_the_end_are_errors() {
    let Some(ctx) = test_gpu() else { return };
    let buf = ctx.upload(&[0u8; 16]).unwrap();
    let cap = buf.capacity();
    let far = u64::MAX - 3; // offset + size overflows u64
    assert!(matches!(ctx.write(&buf, far, &[0u8; 8]), Err(NumrError::Validation { .. })));
    assert!(matches!(ctx.read_bytes(&buf, 0, cap + 4), Err(NumrError::Validation { .. })));
    assert!(matches!(ctx.read_bytes(&buf, far, 8), Err(NumrError::Validation { .. })));
    let r = ctx.with_stream(|rec| rec.copy(&buf, far - 3, &buf, 0, 8));
    assert!(matches!(r, Err(NumrError::Validation { .. })), "{r:?}");
    // In range, the same calls work.
    ctx.write(&buf, 4, &[1, 2, 3, 4]).unwrap();
    assert_eq!(ctx.read_bytes(&buf, 4, 4).unwrap(), vec![1, 2, 3, 4]);
}
