//! [`Tensor`]: a dtype, a strided [`Layout`] and shared storage on a [`Device`]. Views share the
//! storage; ops produce new contiguous tensors.

use std::sync::Arc;

use crate::device::Device;
use crate::dtype::{DType, Element, read_f64};
use crate::error::{NumrError, Result};
use crate::gpu::{BufferKind, GpuBuffer, GpuContext};
use crate::shape::{Layout, checked_bytes, numel};

#[derive(Clone, Debug)]
pub(crate) enum Storage {
    /// Little-endian element bytes.
    Cpu(Arc<Vec<u8>>),
    Gpu(Arc<GpuBuffer>),
}

/// An n-dimensional array on the CPU or a GPU.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub(crate) storage: Storage,
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

impl Tensor {
    /// A contiguous tensor holding `data` with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        checked_bytes("from_slice", shape, T::DTYPE.size())?;
        if data.len() != numel(shape) {
            return Err(NumrError::LengthMismatch { shape: shape.to_vec(), expected: numel(shape), got: data.len() });
        }
        Self::from_bytes(bytemuck::cast_slice(data), T::DTYPE, shape, device)
    }

    /// A contiguous tensor from little-endian element bytes.
    pub fn from_bytes(bytes: &[u8], dtype: DType, shape: &[usize], device: &Device) -> Result<Tensor> {
        let size = checked_bytes("from_bytes", shape, dtype.size())?;
        let n = numel(shape);
        if bytes.len() != size {
            return Err(NumrError::LengthMismatch { shape: shape.to_vec(), expected: n, got: bytes.len() / dtype.size() });
        }
        let storage = match device {
            Device::Cpu => Storage::Cpu(Arc::new(bytes.to_vec())),
            Device::Gpu(ctx) => Storage::Gpu(ctx.upload(bytes)?),
        };
        Ok(Tensor { storage, layout: Layout::contiguous(shape), dtype, device: device.clone() })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let bytes = checked_bytes("zeros", shape, dtype.size())? as u64;
        let storage = match device {
            Device::Cpu => Storage::Cpu(Arc::new(vec![0u8; bytes as usize])),
            Device::Gpu(ctx) => {
                let buf = ctx.alloc(bytes, BufferKind::Storage)?;
                ctx.with_stream(|rec| rec.clear(&buf))?;
                Storage::Gpu(buf)
            }
        };
        Ok(Tensor { storage, layout: Layout::contiguous(shape), dtype, device: device.clone() })
    }

    /// An uninitialised contiguous GPU tensor (the output of a kernel).
    pub(crate) fn gpu_empty(ctx: &GpuContext, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let bytes = (numel(shape) * dtype.size()) as u64;
        let buf = ctx.alloc(bytes, BufferKind::Storage)?;
        Ok(Tensor { storage: Storage::Gpu(buf), layout: Layout::contiguous(shape), dtype, device: Device::Gpu(ctx.clone()) })
    }

    pub(crate) fn cpu_from_bytes(bytes: Vec<u8>, dtype: DType, shape: &[usize]) -> Tensor {
        Tensor { storage: Storage::Cpu(Arc::new(bytes)), layout: Layout::contiguous(shape), dtype, device: Device::Cpu }
    }

    /// Size of each dimension.
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The strided view into the storage (strides and offset in elements).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Where the storage lives.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    /// True when the view is dense and row-major (its offset may be non-zero); see
    /// [`Layout::is_contiguous`].
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// The GPU buffer behind this tensor (None on the CPU).
    pub fn gpu_buffer(&self) -> Option<&Arc<GpuBuffer>> {
        match &self.storage {
            Storage::Gpu(b) => Some(b),
            Storage::Cpu(_) => None,
        }
    }

    /// The binding of this GPU view's bytes for a kernel, and the element offset of its first
    /// element inside the binding. The binding starts at the adapter's storage offset alignment at
    /// or below the view's first byte; its size is rounded up to `granule` bytes (4, or 16 for
    /// vec4 access). A CPU tensor is [`NumrError::WrongDevice`].
    pub fn gpu_binding(&self, granule: u64) -> Result<(crate::gpu::Binding, u32)> {
        crate::ops::gpu::bind_view(self, granule)
    }

    fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor { storage: self.storage.clone(), layout, dtype: self.dtype, device: self.device.clone() }
    }

    /// View of `len` elements of `dim` from `start`. No copy.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.narrow(dim, start, len)?))
    }
    /// View with reordered dimensions. No copy.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.permute(perm)?))
    }
    /// View with two dimensions swapped. No copy.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.transpose(a, b)?))
    }
    /// Broadcast view (zero strides). No copy.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.broadcast_to(shape)?))
    }
    /// A new shape with the same elements: a view when contiguous, else a contiguous copy first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        match self.layout.reshape(shape)? {
            Some(l) => Ok(self.with_layout(l)),
            None => self.contiguous()?.reshape(shape),
        }
    }

    /// The elements in row-major order, as `T` (which must be this tensor's dtype).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(NumrError::DTypeMismatch { op: "to_vec", expected: self.dtype, got: T::DTYPE });
        }
        Ok(bytemuck::pod_collect_to_vec(&self.to_bytes()?))
    }

    /// The elements in row-major order, converted to f64 (for tests and printing).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let b = self.to_bytes()?;
        (0..self.numel()).map(|i| read_f64(self.dtype, &b, i)).collect()
    }

    /// Little-endian bytes of the elements in row-major order.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let s = self.dtype.size();
        match &self.storage {
            Storage::Cpu(bytes) => {
                if self.is_contiguous() {
                    let o = self.layout.offset() * s;
                    return Ok(bytes[o..o + self.numel() * s].to_vec());
                }
                let mut out = Vec::with_capacity(self.numel() * s);
                for i in self.layout.indices() {
                    out.extend_from_slice(&bytes[i * s..i * s + s]);
                }
                Ok(out)
            }
            Storage::Gpu(buf) => {
                let ctx = self.device.gpu_context().ok_or(NumrError::WrongDevice { op: "to_bytes", expected: "GPU", got: "CPU" })?;
                if !self.is_contiguous() {
                    return self.contiguous()?.to_bytes();
                }
                ctx.read_bytes(buf, (self.layout.offset() * s) as u64, (self.numel() * s) as u64)
            }
        }
    }

    /// A copy on `device` (contiguous).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if self.device.same(device) {
            return Ok(self.clone());
        }
        Tensor::from_bytes(&self.to_bytes()?, self.dtype, self.shape(), device)
    }

    pub(crate) fn check_same_device(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if self.device.same(&other.device) { Ok(()) } else { Err(NumrError::DeviceMismatch { op }) }
    }
}
