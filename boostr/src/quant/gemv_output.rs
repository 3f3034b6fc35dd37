//! [`GemvOutput`]: where a GEMV or GEMM writes (one output, the fused Q/K/V projection's three,
//! or columns of a wider row), checked against its bindings once at build, and the parameters
//! that place a part's outputs.

use numr::gpu::{Binding, PlanDispatch};

use super::validate::{check_binding, mul};
use super::{QuantError, QuantPart, Result};

/// Where a GEMV writes (`m` = the config's activation rows, `N` = the matrix rows).
#[derive(Clone, Debug)]
pub enum GemvOutput {
    /// `y`: `m x N` f32, row-major.
    Single(Binding),
    /// The fused Q/K/V projection (`split_qkv`): the matrix holds `rows[0]` Q rows, then
    /// `rows[1]` K rows, then `rows[2]` V rows (`rows` summing to `N`); each output gets
    /// `m x rows[i]` f32, row-major.
    Qkv {
        /// Q output: `m x rows[0]` f32.
        q: Binding,
        /// K output: `m x rows[1]` f32.
        k: Binding,
        /// V output: `m x rows[2]` f32.
        v: Binding,
        /// Matrix rows of Q, K and V, in that order.
        rows: [usize; 3],
    },
    /// `y[r * stride + offset + n]`: the `N` outputs of each activation row go to columns
    /// `offset .. offset + N` of a wider row-major `m x stride` f32 output (an engine's packed
    /// `[q | k | v]` rows when Q, K and V are stored in different formats).
    Columns {
        /// The wide output, `m x stride` f32.
        y: Binding,
        /// Elements per output row.
        stride: usize,
        /// Column of the matrix's first row (`offset + N <= stride`).
        offset: usize,
    },
}

/// The output placement of a GEMV or GEMM: `(n_out, col0)` = the output's row stride and the
/// column of the matrix's first row (`(N, 0)` for a plain `m x N` output).
pub(crate) fn out_cols(output: &GemvOutput, n: usize) -> (usize, usize) {
    match output {
        GemvOutput::Columns { stride, offset, .. } => (*stride, *offset),
        _ => (n, 0),
    }
}

/// Places the part's outputs: `y[r * n_out + col0 + part.row0 + row]`.
pub(crate) fn set_out_cols(d: PlanDispatch, part: &QuantPart, (n_out, col0): (usize, usize)) -> Result<PlanDispatch> {
    Ok(d.set_usize("n_out", n_out)?.set_usize("row0", col0 + part.row0)?)
}

impl GemvOutput {
    /// The bindings (one, or Q, K, V) after checking each against `m` activation rows of a
    /// matrix of `n` rows and the config's `split_qkv`.
    pub(crate) fn checked(&self, op: &'static str, split_qkv: bool, m: usize, n: usize) -> Result<(Vec<Binding>, [usize; 3])> {
        match (self, split_qkv) {
            (GemvOutput::Single(y), false) => {
                check_binding(op, "y", y, mul("y elements", m, n)?, 4)?;
                Ok((vec![y.clone()], [0; 3]))
            }
            (GemvOutput::Qkv { q, k, v, rows }, true) => {
                let total = rows.iter().try_fold(0usize, |a, &r| a.checked_add(r));
                if total != Some(n) {
                    return Err(QuantError::Shape {
                        what: op,
                        reason: format!("Q/K/V of {} + {} + {} rows for a matrix of {n} rows", rows[0], rows[1], rows[2]),
                    });
                }
                check_binding(op, "q output", q, mul("q elements", m, rows[0])?, 4)?;
                check_binding(op, "k output", k, mul("k elements", m, rows[1])?, 4)?;
                check_binding(op, "v output", v, mul("v elements", m, rows[2])?, 4)?;
                Ok((vec![q.clone(), k.clone(), v.clone()], *rows))
            }
            (GemvOutput::Columns { y, stride, offset }, false) => {
                let end = offset.checked_add(n).filter(|&e| e <= *stride);
                if end.is_none() {
                    return Err(QuantError::Shape { what: op, reason: format!("columns {offset} .. {offset} + {n} of rows {stride} wide") });
                }
                check_binding(op, "y", y, mul("y elements", m, *stride)?, 4)?;
                Ok((vec![y.clone()], [0; 3]))
            }
            (GemvOutput::Single(_) | GemvOutput::Columns { .. }, true) => {
                Err(QuantError::Shape { what: op, reason: "split_qkv writes three outputs (GemvOutput::Qkv)".into() })
            }
            (GemvOutput::Qkv { .. }, false) => Err(QuantError::Shape { what: op, reason: "three outputs need split_qkv".into() }),
        }
    }
}
