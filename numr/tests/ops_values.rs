//! The core ops against hand-computed values, each body on the CPU and on the GPU
//! ([`numr::test_device!`]).

use numr::{DType, Device, NumrError, Tensor};

fn t(dev: &Device, v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, dev).unwrap()
}

fn elementwise_and_broadcast(dev: &Device) {
    let a = t(dev, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = t(dev, &[10., 20., 30.], &[3]);
    assert_eq!(a.add(&b).unwrap().to_vec::<f32>().unwrap(), vec![11., 22., 33., 14., 25., 36.]);
    assert_eq!(a.mul(&b).unwrap().to_vec::<f32>().unwrap(), vec![10., 40., 90., 40., 100., 180.]);
    assert_eq!(a.scale(0.5).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 1., 1.5, 2., 2.5, 3.]);
    let col = t(dev, &[1., 2.], &[2, 1]);
    assert_eq!(a.add(&col).unwrap().to_vec::<f32>().unwrap(), vec![2., 3., 4., 6., 7., 8.]);
}

fn views_and_contiguous(dev: &Device) {
    let a = t(dev, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let at = a.transpose(0, 1).unwrap();
    assert_eq!(at.shape(), &[3, 2]);
    assert_eq!(at.contiguous().unwrap().to_vec::<f32>().unwrap(), vec![1., 4., 2., 5., 3., 6.]);
    let n = a.narrow(1, 1, 2).unwrap();
    assert_eq!(n.to_vec::<f32>().unwrap(), vec![2., 3., 5., 6.]);
    assert_eq!(a.reshape(&[3, 2]).unwrap().to_vec::<f32>().unwrap(), vec![1., 2., 3., 4., 5., 6.]);
    assert_eq!(at.reshape(&[6]).unwrap().to_vec::<f32>().unwrap(), vec![1., 4., 2., 5., 3., 6.]);
}

fn reductions_and_softmax(dev: &Device) {
    let a = t(dev, &[1., 2., 3., -4., 0., 4.], &[2, 3]);
    assert_eq!(a.sum_last().unwrap().to_vec::<f32>().unwrap(), vec![6., 0.]);
    assert_eq!(a.max_last().unwrap().to_vec::<f32>().unwrap(), vec![3., 4.]);
    let s = t(dev, &[0., 0., 2f32.ln()], &[1, 3]).softmax_last().unwrap().to_vec::<f32>().unwrap();
    assert!((s[0] - 0.25).abs() < 1e-7 && (s[2] - 0.5).abs() < 1e-7, "{s:?}");
}

fn matmul_small(dev: &Device) {
    let a = t(dev, &[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = t(dev, &[7., 8., 9., 10., 11., 12.], &[3, 2]);
    assert_eq!(a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), vec![58., 64., 139., 154.]);
    // Batched with a broadcast right-hand side.
    let a3 = t(dev, &[1., 2., 3., 4., 5., 6., 1., 0., 0., 0., 1., 0.], &[2, 2, 3]);
    let out = a3.matmul(&b).unwrap();
    assert_eq!(out.shape(), &[2, 2, 2]);
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![58., 64., 139., 154., 7., 8., 9., 10.]);
}

fn casts(dev: &Device) {
    let a = t(dev, &[1.5, -2.0, 300.0, 65504.0], &[4]);
    assert_eq!(a.cast(DType::U8).unwrap().to_vec::<u8>().unwrap(), vec![1, 0, 255, 255]);
    assert_eq!(a.cast(DType::I32).unwrap().to_vec::<i32>().unwrap(), vec![1, -2, 300, 65504]);
    let h = a.cast(DType::F16).unwrap().to_vec::<half::f16>().unwrap();
    assert_eq!(h[3].to_f32(), 65504.0);
    let bf = t(dev, &[1.0 + 1.0 / 512.0], &[1]).cast(DType::BF16).unwrap().to_vec::<half::bf16>().unwrap();
    assert_eq!(bf[0].to_f32(), 1.0); // round to nearest even
}

fn typed_errors(dev: &Device) {
    let a = t(dev, &[1., 2.], &[2]);
    let i = Tensor::from_slice(&[1i32, 2], &[2], dev).unwrap();
    assert!(matches!(a.add(&i), Err(NumrError::DTypeMismatch { .. })));
    assert!(matches!(a.add(&t(dev, &[1., 2., 3.], &[3])), Err(NumrError::ShapeMismatch { .. })));
    assert!(matches!(Tensor::from_slice(&[1f32, 2.], &[3], dev), Err(NumrError::LengthMismatch { .. })));
    assert!(matches!(a.to_vec::<i32>(), Err(NumrError::DTypeMismatch { .. })));
    assert!(matches!(a.narrow(0, 1, 5), Err(NumrError::InvalidView { .. })));
    assert!(matches!(i.softmax_last(), Err(NumrError::UnsupportedDType { .. })));
    assert!(matches!(a.matmul(&a), Err(NumrError::ShapeMismatch { .. })));
}

numr::test_device!(elementwise_and_broadcast, views_and_contiguous, reductions_and_softmax, matmul_small, casts, typed_errors);
