//! [`GpuTuning`] and [`Diagnostics`] set by name from `KEY=VALUE` strings (the CLI's `--tune`
//! and `--diag`): the keys, what each takes, and typed errors that say both.

use super::super::options::Chains;
use super::{AttnTuning, BatchGemv, BatchQ8, ChainPoll, DecodeFusions, DecodeKernel, GpuTuning, WorkgroupShape};

/// Every `--tune` key with the value it takes (the field of [`GpuTuning`] it sets has the same
/// name, or says which key sets it).
pub const TUNING_KEYS: &[(&str, &str)] = &[
    ("decode_fusion", "`all`, `none` or a comma list of norm, residual, glu, epilogue, attn_q8, rope"),
    ("norm_fuse_max_k", "input features (an integer)"),
    ("norm_stage_k", "input features (an integer; 0: off)"),
    ("gemv_eight_rows_min_k", "input features (an integer)"),
    ("gemv_small", "rows or input features (an integer)"),
    ("gemv_rows", "rows per workgroup (an integer, or `auto`)"),
    ("gemv_threads", "invocations per workgroup (an integer, or `auto`)"),
    ("batch_gemv", "rows,group,threads,f16 of the batched steps' f32 decode-row GEMV (integers; f16 0 or 1)"),
    ("batch_gemv_max_seqs", "sequences (an integer): batch states of at most this many run decode rows through the GEMV"),
    ("batch_split_k", "1 (off) to 8, or `auto`: K splits of the GEMMs of batch states that run every row through them"),
    ("batch_attn_split_keys", "keys (an integer; 0: a count fixed by the context length), or `auto`: chunks of a batched row's attention"),
    ("batch_lanes", "`on` or `off`: such batch states run decode rows in a fused lane of their own"),
    ("batch_q8", "`off` (the f32 GEMV) or rows,group,threads,unroll of the batched steps' integer-dot decode-row GEMV"),
    ("verify_q8", "`off` (the f32 GEMV) or rows,group,threads,unroll of a verification step's integer-dot rows GEMV"),
    ("q8_min_rows", "rows per workgroup (an integer)"),
    ("q8_tall_above", "rows (an integer)"),
    ("q8_tall_min_rows", "rows per workgroup (an integer)"),
    ("q8_wide_k", "input features (an integer)"),
    ("q8_max_wgs", "workgroups (an integer; 0: one row group each)"),
    ("q8_rows", "rows per workgroup (an integer, or `auto`)"),
    ("q8_threads", "invocations per workgroup (an integer, or `auto`)"),
    ("q8_unroll", "blocks per step (an integer, or `auto`)"),
    ("q8_wide_rows", "rows per workgroup (an integer, or `auto`)"),
    ("q8_wide_threads", "invocations per workgroup (an integer, or `auto`)"),
    ("q8_wide_unroll", "blocks per step (an integer, or `auto`)"),
    ("q8_tall_rows", "rows per workgroup (an integer, or `auto`)"),
    ("q8_tall_threads", "invocations per workgroup (an integer, or `auto`)"),
    ("q8_tall_unroll", "blocks per step (an integer, or `auto`)"),
    ("q8_small_rows", "rows per workgroup (an integer, or `auto`)"),
    ("q8_small_threads", "invocations per workgroup (an integer, or `auto`)"),
    ("q8_small_unroll", "blocks per step (an integer, or `auto`)"),
    ("q8_sg_rows", "rows per subgroup (an integer, or `auto`)"),
    ("q8_prefetch", "0 or 1 (or `auto`)"),
    ("glu_local", "`off` or rows,threads,unroll,sg_rows"),
    ("norm_local_max_k", "input features (an integer)"),
    ("norm_local", "`off` or rows,threads,unroll,sg_rows (both classes)"),
    ("norm_local_small", "`off` or rows,threads,unroll,sg_rows"),
    ("norm_local_wide", "`off` or rows,threads,unroll,sg_rows"),
    ("attn_tuning", "heads,keys,target_wgs (or `auto`)"),
    ("attn_single_kv", "positions (an integer; 0: never; or `auto`)"),
    ("prefill_attn", "coop, subgroup, tiled or auto"),
    ("gemm_f16_input", "0 or 1 (or `auto`: where the coopmat GEMM runs)"),
    ("prefill_split_k", "1 (off) or 2 (on)"),
    ("qkv_split_max_blocks", "blocks (an integer)"),
    ("prefill_lead", "dispatches (an integer; 0: one submit)"),
    ("split_micro_tokens", "tokens (an integer; 0: off): a split model's batched steps run in micro-batches of at least this many"),
    ("chain", "auto, on, off, all, or a comma list of kernel-name prefixes"),
    ("chain_layers", "layers per chain (an integer, at least 1)"),
    ("chain_max", "stages per chain (an integer, or `auto`: no limit)"),
    ("chain_poll", "every or first"),
];

/// Every `--diag` key ([`super::Diagnostics`]) with the value it takes.
pub const DIAGNOSTIC_KEYS: &[(&str, &str)] = &[
    ("ablate", "a comma list of -NAME (drop) and +NAME (double) kernel-name parts (the output is wrong)"),
    ("step_trace", "0 or 1"),
    ("chain_verbose", "0 or 1"),
];

/// A `KEY=VALUE` setting that cannot be applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TuningError {
    /// No `=` in the setting.
    #[error("`{0}` is not KEY=VALUE")]
    NotAPair(String),
    /// A key that is not one of the known ones.
    #[error("unknown key `{key}` (known: {known})")]
    UnknownKey {
        /// The key given.
        key: String,
        /// The known keys, comma separated.
        known: String,
    },
    /// A value the key does not take.
    #[error("`{key}={value}`: expected {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What the key takes.
        expected: &'static str,
    },
}

/// `KEY=VALUE` split at the first `=`, both trimmed, the key lowercased.
pub(super) fn split_pair(pair: &str) -> Result<(String, &str), TuningError> {
    let (k, v) = pair.split_once('=').ok_or_else(|| TuningError::NotAPair(pair.to_string()))?;
    Ok((k.trim().to_ascii_lowercase(), v.trim()))
}

/// A value parser for one key of `table`: its errors name the key, the value and what the key
/// takes.
pub(super) struct Value<'a> {
    pub(super) key: &'a str,
    pub(super) value: &'a str,
    pub(super) expected: &'static str,
}

impl<'a> Value<'a> {
    /// The key's entry in `table`, or [`TuningError::UnknownKey`] listing the table's keys.
    pub(super) fn of(table: &[(&str, &'static str)], key: &'a str, value: &'a str) -> Result<Value<'a>, TuningError> {
        match table.iter().find(|(k, _)| *k == key) {
            Some(&(_, expected)) => Ok(Value { key, value, expected }),
            None => Err(TuningError::UnknownKey { key: key.to_string(), known: table.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ") }),
        }
    }

    pub(super) fn bad(&self) -> TuningError {
        TuningError::BadValue { key: self.key.to_string(), value: self.value.to_string(), expected: self.expected }
    }

    fn lower(&self) -> String {
        self.value.to_ascii_lowercase()
    }

    fn int<T: std::str::FromStr>(&self) -> Result<T, TuningError> {
        self.value.parse().map_err(|_| self.bad())
    }

    /// An integer, or `auto` for `None`.
    fn opt_int<T: std::str::FromStr>(&self) -> Result<Option<T>, TuningError> {
        if self.lower() == "auto" { Ok(None) } else { self.int().map(Some) }
    }

    /// `0`/`1` (also `off`/`on`, `false`/`true`).
    pub(super) fn flag(&self) -> Result<bool, TuningError> {
        match self.lower().as_str() {
            "1" | "on" | "true" => Ok(true),
            "0" | "off" | "false" => Ok(false),
            _ => Err(self.bad()),
        }
    }

    /// Comma-separated integers, exactly `n` of them.
    fn ints<T: std::str::FromStr>(&self, n: usize) -> Result<Vec<T>, TuningError> {
        let v: Vec<T> = self.value.split(',').map(|x| x.trim().parse().map_err(|_| self.bad())).collect::<Result<_, _>>()?;
        if v.len() == n { Ok(v) } else { Err(self.bad()) }
    }

    /// `off` or `rows,threads,unroll,sg_rows`.
    fn shape(&self) -> Result<Option<WorkgroupShape>, TuningError> {
        if self.lower() == "off" {
            return Ok(None);
        }
        let p = self.ints::<u32>(4)?;
        Ok(Some(WorkgroupShape::new(p[0], p[1], p[2], p[3])))
    }
}

impl GpuTuning {
    /// Sets the field named `key` ([`TUNING_KEYS`], case-insensitive) from `value`. An unknown
    /// key lists the known ones; a bad value says what the key takes.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TuningError> {
        let key = key.trim().to_ascii_lowercase();
        let v = Value::of(TUNING_KEYS, &key, value.trim())?;
        match v.key {
            "decode_fusion" => self.decode_fusions = fusions(&v)?,
            "norm_fuse_max_k" => self.norm_fuse_max_k = v.int()?,
            "norm_stage_k" => self.norm_stage_k = v.int()?,
            "gemv_eight_rows_min_k" => self.gemv_eight_rows_min_k = v.int()?,
            "gemv_small" => self.gemv_small = v.int()?,
            "gemv_rows" => self.gemv_rows = v.opt_int()?,
            "gemv_threads" => self.gemv_threads = v.opt_int()?,
            "batch_gemv" => {
                let p = v.ints::<u32>(4)?;
                if p[3] > 1 {
                    return Err(v.bad());
                }
                self.batch_gemv = BatchGemv { rows: p[0], group: p[1], threads: p[2], f16: p[3] == 1 };
            }
            "batch_gemv_max_seqs" => self.batch_gemv_max_seqs = v.int()?,
            "batch_lanes" => self.batch_lanes = v.flag()?,
            "batch_attn_split_keys" => self.batch_attn_split_keys = v.opt_int()?,
            "batch_split_k" => {
                let splits = v.opt_int::<u32>()?;
                if splits.is_some_and(|s| !(1..=8).contains(&s)) {
                    return Err(v.bad());
                }
                self.batch_split_k = splits;
            }
            "batch_q8" | "verify_q8" => {
                let shape = if v.lower() == "off" {
                    None
                } else {
                    let p = v.ints::<u32>(4)?;
                    Some(BatchQ8 { rows: p[0], group: p[1], threads: p[2], unroll: p[3] })
                };
                if v.key == "batch_q8" {
                    self.batch_q8 = shape;
                } else {
                    self.verify_q8 = shape;
                }
            }
            "q8_min_rows" => self.q8_min_rows = v.int()?,
            "q8_tall_above" => self.q8_tall_above = v.int()?,
            "q8_tall_min_rows" => self.q8_tall_min_rows = v.int()?,
            "q8_wide_k" => self.q8_wide_k = v.int()?,
            "q8_max_wgs" => self.q8_max_wgs = v.int()?,
            "q8_sg_rows" => self.q8_subgroup_rows = v.opt_int()?,
            "q8_prefetch" => self.q8_prefetch = if v.lower() == "auto" { None } else { Some(v.flag()?) },
            "glu_local" => self.glu_local = v.shape()?,
            "norm_local_max_k" => self.norm_local_max_k = v.int()?,
            "norm_local" => (self.norm_local_small, self.norm_local_wide) = (v.shape()?, v.shape()?),
            "norm_local_small" => self.norm_local_small = v.shape()?,
            "norm_local_wide" => self.norm_local_wide = v.shape()?,
            "attn_tuning" => {
                self.attn_tuning = if v.lower() == "auto" {
                    None
                } else {
                    let p = v.ints::<usize>(3)?;
                    let word = |x: usize| u32::try_from(x).map_err(|_| v.bad());
                    Some(AttnTuning { heads: word(p[0])?, keys: word(p[1])?, target_wgs: p[2] })
                }
            }
            "attn_single_kv" => self.attn_single_kv = v.opt_int()?,
            "prefill_attn" => {
                self.prefill_attn = match v.lower().as_str() {
                    "auto" => None,
                    "coop" => Some(DecodeKernel::Coop),
                    "subgroup" => Some(DecodeKernel::Subgroup),
                    "tiled" => Some(DecodeKernel::Tiled),
                    _ => return Err(v.bad()),
                }
            }
            "gemm_f16_input" => self.gemm_f16_input = if v.lower() == "auto" { None } else { Some(v.flag()?) },
            "prefill_split_k" => {
                self.prefill_split_k = match v.value {
                    "1" => false,
                    "2" => true,
                    _ => return Err(v.bad()),
                }
            }
            "qkv_split_max_blocks" => self.qkv_split_max_blocks = v.int()?,
            "prefill_lead" => self.prefill_lead = v.int()?,
            "split_micro_tokens" => self.split_micro_tokens = v.int()?,
            "chain" => (self.chains, self.chain_kernels) = chain(&v)?,
            "chain_layers" => self.chain_layers = v.int::<usize>().ok().filter(|&n| n >= 1).ok_or_else(|| v.bad())?,
            "chain_max" => self.chain_max = v.opt_int()?,
            "chain_poll" => {
                self.chain_poll = match v.lower().as_str() {
                    "every" => ChainPoll::Every,
                    "first" => ChainPoll::First,
                    _ => return Err(v.bad()),
                }
            }
            key => {
                // q8_{,wide_,tall_,small_}{rows,threads,unroll}: the only keys left in the table.
                let (class, field) = key.strip_prefix("q8_").and_then(|k| k.rsplit_once('_').or(Some(("", k)))).ok_or_else(|| v.bad())?;
                let o = match class {
                    "" => &mut self.q8,
                    "wide" => &mut self.q8_wide,
                    "tall" => &mut self.q8_tall,
                    "small" => &mut self.q8_small,
                    _ => return Err(v.bad()),
                };
                match field {
                    "rows" => o.rows = v.opt_int()?,
                    "threads" => o.threads = v.opt_int()?,
                    "unroll" => o.unroll = v.opt_int()?,
                    _ => return Err(v.bad()),
                }
            }
        }
        Ok(())
    }

    /// [`Self::set`] from one `KEY=VALUE` string.
    pub fn set_pair(&mut self, pair: &str) -> Result<(), TuningError> {
        let (k, v) = split_pair(pair)?;
        self.set(&k, v)
    }
}

fn fusions(v: &Value) -> Result<DecodeFusions, TuningError> {
    match v.lower().as_str() {
        "all" => return Ok(DecodeFusions::ALL),
        "none" => return Ok(DecodeFusions::NONE),
        _ => {}
    }
    let mut f = DecodeFusions::NONE;
    for part in v.value.split(',').map(str::trim) {
        match part {
            "norm" => f.norm = true,
            "residual" => f.residual = true,
            "glu" => f.glu = true,
            "epilogue" => f.epilogue = true,
            "attn_q8" => f.attn_q8 = true,
            "rope" => f.rope = true,
            _ => return Err(v.bad()),
        }
    }
    Ok(f)
}

fn chain(v: &Value) -> Result<(Chains, Vec<String>), TuningError> {
    Ok(match v.lower().as_str() {
        "auto" => (Chains::Auto, Vec::new()),
        "on" | "all" => (Chains::On, Vec::new()),
        "off" => (Chains::Off, Vec::new()),
        _ => {
            let prefixes: Vec<String> = v.value.split(',').map(|s| s.trim().to_string()).collect();
            if prefixes.iter().any(String::is_empty) {
                return Err(v.bad());
            }
            (Chains::On, prefixes)
        }
    })
}
