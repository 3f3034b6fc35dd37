//! Shapes and strided layouts. Views (narrow, reshape, permute, transpose, broadcast) only change
//! the [`Layout`]; the storage is shared and nothing is copied.

use crate::error::{NumrError, Result};

/// A strided view into a flat storage: `element(idx) = storage[offset + sum(idx[d] * strides[d])]`.
/// Offsets and strides are counted in elements, not bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// Row-major strides for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Number of elements of `shape` (1 for a scalar).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Bytes of a contiguous `shape` of `elem_size`-byte elements, or [`NumrError::InvalidView`]
/// when that overflows `usize`.
pub(crate) fn checked_bytes(op: &'static str, shape: &[usize], elem_size: usize) -> Result<usize> {
    shape
        .iter()
        .try_fold(elem_size, |a, &d| a.checked_mul(d))
        .ok_or_else(|| NumrError::InvalidView { op, reason: format!("shape {shape:?} holds more bytes than usize counts") })
}

impl Layout {
    /// The row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout { shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0 }
    }

    /// A layout from explicit shape, strides and offset (in elements). Only the ranks are checked
    /// ([`NumrError::InvalidView`] when they differ), not the extent against any storage.
    pub fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(NumrError::InvalidView { op: "layout", reason: format!("shape {shape:?} and strides {strides:?} differ in rank") });
        }
        Ok(Layout { shape, strides, offset })
    }

    /// Size of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Stride of each dimension, in elements (0 for a broadcast dimension).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Storage index of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Number of dimensions (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// True when the elements are stored densely in row-major order (offset may be non-zero).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for d in (0..self.shape.len()).rev() {
            if self.shape[d] != 1 && self.strides[d] != expected {
                return false;
            }
            expected *= self.shape[d];
        }
        true
    }

    /// One past the largest storage index this view can touch (0 for an empty view).
    pub fn storage_extent(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        self.offset + self.shape.iter().zip(&self.strides).map(|(&n, &s)| (n - 1) * s).sum::<usize>() + 1
    }

    fn check_dim(&self, op: &'static str, dim: usize) -> Result<()> {
        if dim >= self.rank() {
            return Err(NumrError::InvalidView { op, reason: format!("dim {dim} out of range for rank {}", self.rank()) });
        }
        Ok(())
    }

    /// Keeps `len` elements of `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        self.check_dim("narrow", dim)?;
        if start.checked_add(len).is_none_or(|end| end > self.shape[dim]) {
            return Err(NumrError::InvalidView {
                op: "narrow",
                reason: format!("range {start}..{} out of bounds for dim {dim} of size {}", start + len, self.shape[dim]),
            });
        }
        let mut out = self.clone();
        out.offset += start * self.strides[dim];
        out.shape[dim] = len;
        Ok(out)
    }

    /// Reorders dimensions: output dim `i` is input dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Self> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank() || perm.iter().any(|&p| p >= self.rank() || std::mem::replace(&mut seen[p], true)) {
            return Err(NumrError::InvalidView { op: "permute", reason: format!("{perm:?} is not a permutation of rank {}", self.rank()) });
        }
        Ok(Layout { shape: perm.iter().map(|&p| self.shape[p]).collect(), strides: perm.iter().map(|&p| self.strides[p]).collect(), offset: self.offset })
    }

    /// Swaps dimensions `a` and `b`.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        self.check_dim("transpose", a)?;
        self.check_dim("transpose", b)?;
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// A view with a new shape of the same element count. Only possible without a copy when the
    /// view is contiguous; returns `None` otherwise.
    pub fn reshape(&self, shape: &[usize]) -> Result<Option<Self>> {
        if numel(shape) != self.numel() {
            return Err(NumrError::ShapeMismatch { op: "reshape", lhs: self.shape.clone(), rhs: shape.to_vec() });
        }
        if !self.is_contiguous() {
            return Ok(None);
        }
        Ok(Some(Layout { shape: shape.to_vec(), strides: contiguous_strides(shape), offset: self.offset }))
    }

    /// Broadcasts to `shape` (numpy rules, aligned at the trailing dimension) with zero strides.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Self> {
        let err = || NumrError::ShapeMismatch { op: "broadcast", lhs: self.shape.clone(), rhs: shape.to_vec() };
        if shape.len() < self.rank() {
            return Err(err());
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for d in 0..self.rank() {
            let (have, want) = (self.shape[d], shape[lead + d]);
            strides[lead + d] = if have == want {
                self.strides[d]
            } else if have == 1 {
                0
            } else {
                return Err(err());
            };
        }
        Ok(Layout { shape: shape.to_vec(), strides, offset: self.offset })
    }

    /// Storage index of every element, in row-major order of the view.
    pub fn indices(&self) -> StridedIndex<'_> {
        StridedIndex { layout: self, idx: vec![0; self.rank()], remaining: self.numel() }
    }
}

/// The broadcast shape of two shapes (numpy rules).
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() { 1 } else { a[i - (rank - a.len())] };
        let db = if i < rank - b.len() { 1 } else { b[i - (rank - b.len())] };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(NumrError::ShapeMismatch { op: "broadcast", lhs: a.to_vec(), rhs: b.to_vec() }),
        };
    }
    Ok(out)
}

/// Iterator over the storage indices of a [`Layout`].
pub struct StridedIndex<'a> {
    layout: &'a Layout,
    idx: Vec<usize>,
    remaining: usize,
}

impl Iterator for StridedIndex<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let pos = self.layout.offset + self.idx.iter().zip(&self.layout.strides).map(|(i, s)| i * s).sum::<usize>();
        for d in (0..self.idx.len()).rev() {
            self.idx[d] += 1;
            if self.idx[d] < self.layout.shape[d] {
                break;
            }
            self.idx[d] = 0;
        }
        Some(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.strides(), &[12, 4, 1]);
        let t = l.transpose(1, 2).unwrap();
        assert_eq!(t.shape(), &[2, 4, 3]);
        assert!(!t.is_contiguous());
        assert_eq!(t.reshape(&[24]).unwrap(), None);
        let n = l.narrow(1, 1, 2).unwrap();
        assert_eq!(n.offset(), 4);
        assert_eq!(n.indices().collect::<Vec<_>>()[..5], [4, 5, 6, 7, 8]);
        assert!(l.narrow(1, 2, 2).is_err());
        let b = Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 4]).unwrap();
        assert_eq!(b.strides(), &[0, 1, 0]);
        assert_eq!(broadcast_shape(&[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert!(broadcast_shape(&[3], &[4]).is_err());
        assert!(l.permute(&[0, 0, 1]).is_err());
        assert_eq!(n.storage_extent(), 4 + 12 + 4 + 3 + 1);
    }
}
