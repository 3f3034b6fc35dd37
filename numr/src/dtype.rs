//! Element types and host-side conversions (through `half`).

use half::{bf16, f16};

use crate::error::{NumrError, Result};

/// The element types a [`crate::Tensor`] can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16 (`half::f16`); GPU kernels need `shader-f16` or unpack it from u32 words.
    F16,
    /// bfloat16 (`half::bf16`): f32's exponent, 8 mantissa bits.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned byte (packed four per word on the GPU).
    U8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32, DType::U8];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// Lower-case name as in WGSL and Rust (`"f32"`, `"bf16"`, ...); also the `Display` form.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::U8 => "u8",
        }
    }

    /// True for F32, F16 and BF16.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Elements packed into one 32-bit word on the GPU.
    pub const fn per_word(self) -> usize {
        4 / self.size()
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is the host representation of a [`DType`].
pub trait Element: bytemuck::Pod + Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The dtype this type represents.
    const DTYPE: DType;
    /// Widens to f64 (exact for every element type).
    fn to_f64(self) -> f64;
    /// Converts with round-to-nearest-even for floats, saturating for integers.
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, |$v:ident| $to:expr, |$w:ident| $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn to_f64(self) -> f64 {
                let $v = self;
                $to
            }
            #[inline]
            fn from_f64($w: f64) -> Self {
                $from
            }
        }
    };
}

element!(f32, DType::F32, |v| v as f64, |w| w as f32);
element!(f16, DType::F16, |v| v.to_f64(), |w| f16::from_f32(w as f32));
element!(bf16, DType::BF16, |v| v.to_f64(), |w| bf16::from_f32(w as f32));
element!(i32, DType::I32, |v| v as f64, |w| w as i32);
element!(u32, DType::U32, |v| v as f64, |w| w as u32);
element!(u8, DType::U8, |v| v as f64, |w| w as u8);

/// Element `i`'s bytes in a buffer of `len` bytes, or [`NumrError::InvalidView`].
fn element_range(dtype: DType, len: usize, i: usize) -> Result<std::ops::Range<usize>> {
    let s = dtype.size();
    match i.checked_mul(s) {
        Some(start) if start + s <= len => Ok(start..start + s),
        _ => Err(NumrError::InvalidView { op: "element access", reason: format!("element {i} of {dtype} past a buffer of {len} bytes") }),
    }
}

/// Reads element `i` of a little-endian byte buffer of `dtype` as f64 ([`NumrError::InvalidView`]
/// past the buffer's end).
#[inline]
pub fn read_f64(dtype: DType, bytes: &[u8], i: usize) -> Result<f64> {
    let b = &bytes[element_range(dtype, bytes.len(), i)?];
    Ok(match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U8 => b[0] as f64,
    })
}

/// Writes `v` as element `i` of a little-endian byte buffer of `dtype`. Floats are rounded to
/// nearest even through f32 (so f16/bf16 match a GPU that computes in f32); integers saturate.
/// [`NumrError::InvalidView`] past the buffer's end.
#[inline]
pub fn write_f64(dtype: DType, bytes: &mut [u8], i: usize, v: f64) -> Result<()> {
    let r = element_range(dtype, bytes.len(), i)?;
    let b = &mut bytes[r];
    match dtype {
        DType::F32 => b.copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F16 => b.copy_from_slice(&f16::from_f32(v as f32).to_le_bytes()),
        DType::BF16 => b.copy_from_slice(&bf16::from_f32(v as f32).to_le_bytes()),
        DType::I32 => b.copy_from_slice(&(v as i32).to_le_bytes()),
        DType::U32 => b.copy_from_slice(&(v as u32).to_le_bytes()),
        DType::U8 => b[0] = v as u8,
    }
    Ok(())
}

/// Tolerances for comparing results, in one place: relative tolerance per dtype.
/// f32 1e-5, f16/bf16 1e-2, integers exact.
pub const fn rtol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(DType::F32.size(), 4);
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::U8.size(), 1);
        assert_eq!(DType::F16.per_word(), 2);
        assert_eq!(DType::U8.per_word(), 4);
        assert_eq!(DType::BF16.to_string(), "bf16");
    }

    #[test]
    fn conversions_round_trip() {
        let mut buf = vec![0u8; 8];
        write_f64(DType::F16, &mut buf, 1, 1.0009765625).unwrap(); // 1 + 2^-10 is exact in f16
        assert_eq!(read_f64(DType::F16, &buf, 1).unwrap(), 1.0009765625);
        write_f64(DType::BF16, &mut buf, 0, 3.0).unwrap();
        assert_eq!(read_f64(DType::BF16, &buf, 0).unwrap(), 3.0);
        // bf16 keeps 8 mantissa bits: 1 + 2^-9 rounds to even (1.0).
        write_f64(DType::BF16, &mut buf, 0, 1.0 + 2f64.powi(-9)).unwrap();
        assert_eq!(read_f64(DType::BF16, &buf, 0).unwrap(), 1.0);
        write_f64(DType::U8, &mut buf, 5, 300.0).unwrap();
        assert_eq!(read_f64(DType::U8, &buf, 5).unwrap(), 255.0);
        write_f64(DType::I32, &mut buf, 1, -7.0).unwrap();
        assert_eq!(read_f64(DType::I32, &buf, 1).unwrap(), -7.0);
    }
}
