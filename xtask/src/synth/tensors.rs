//! The tensor set of each architecture (llama.cpp's names, in llama.cpp's file order) and the
//! storage type of each tensor, chosen as `llama-quantize` chooses it for the file type (the
//! rule is in the [module docs](super)).

use std::fmt;
use std::str::FromStr;

use cera::gguf::{GgmlType, TensorDesc};

use super::presets::{Arch, Preset};

/// The file type asked for with `--qtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QType {
    /// `q4_0`
    Q4_0,
    /// `q4_1`
    Q4_1,
    /// `q8_0`
    Q8_0,
    /// `q4_k`: Q4_K_M.
    Q4K,
    /// `q6_k`
    Q6K,
}

impl QType {
    /// Every file type, in command-line order.
    #[cfg(test)]
    pub const ALL: [QType; 5] = [QType::Q4_0, QType::Q4_1, QType::Q8_0, QType::Q4K, QType::Q6K];

    /// The type of the ordinary 2-D weights.
    pub fn base(self) -> GgmlType {
        match self {
            QType::Q4_0 => GgmlType::Q4_0,
            QType::Q4_1 => GgmlType::Q4_1,
            QType::Q8_0 => GgmlType::Q8_0,
            QType::Q4K => GgmlType::Q4_K,
            QType::Q6K => GgmlType::Q6_K,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`: MOSTLY_Q4_0 = 2, Q4_1 = 3, Q8_0 = 7,
    /// Q4_K_M = 15, Q6_K = 18).
    pub fn file_type(self) -> u32 {
        match self {
            QType::Q4_0 => 2,
            QType::Q4_1 => 3,
            QType::Q8_0 => 7,
            QType::Q4K => 15,
            QType::Q6K => 18,
        }
    }
}

impl FromStr for QType {
    type Err = String;
    fn from_str(s: &str) -> Result<QType, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "q4_0" => QType::Q4_0,
            "q4_1" => QType::Q4_1,
            "q8_0" => QType::Q8_0,
            "q4_k" | "q4_k_m" => QType::Q4K,
            "q6_k" => QType::Q6K,
            _ => return Err(format!("unknown qtype {s:?} (q4_0, q4_1, q8_0, q4_k, q6_k)")),
        })
    }
}

impl fmt::Display for QType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QType::Q4_0 => "q4_0",
            QType::Q4_1 => "q4_1",
            QType::Q8_0 => "q8_0",
            QType::Q4K => "q4_k",
            QType::Q6K => "q6_k",
        })
    }
}

/// What a tensor is, as far as the type rule cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The LM head: `output.weight`, or the tied `token_embd.weight`.
    Output,
    /// `attn_v` or `ffn_down` of layer `i` (Q4_K_M gives them more bits on some layers).
    MoreBits(u64),
    /// Any other matrix.
    Matrix,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third in
/// between.
pub fn use_more_bits(i: u64, n: u64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The storage type of a matrix whose rows hold `cols` elements.
fn matrix_type(q: QType, role: Role, n_layers: u64, cols: u64) -> GgmlType {
    let k_ok = cols.is_multiple_of(256);
    let ty = match role {
        Role::Output if q == QType::Q8_0 || !k_ok => GgmlType::Q8_0,
        Role::Output => GgmlType::Q6_K,
        Role::MoreBits(i) if q == QType::Q4K && use_more_bits(i, n_layers) => GgmlType::Q6_K,
        _ => q.base(),
    };
    // llama.cpp's fallback for rows that are not whole super-blocks.
    match ty {
        GgmlType::Q4_K if !k_ok => GgmlType::Q5_0,
        GgmlType::Q6_K if !k_ok => GgmlType::Q8_0,
        t => t,
    }
}

/// One tensor of the file: its descriptor and whether it holds random rows (matrices) or ones
/// (norm weights, F32).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Name, dims (ggml order) and type.
    pub desc: TensorDesc,
    /// Random rows of `dims[0]` elements (else every element 1.0, F32).
    pub random: bool,
}

/// Taps of LFM2's short convolutions (`lfm2.shortconv.l_cache`).
pub const LFM2_CONV_TAPS: u64 = 3;

/// Every tensor of the model, in file order.
pub fn plan(arch: Arch, p: &Preset, q: QType) -> Vec<Planned> {
    let n = p.n_layers;
    let mut out = Vec::new();
    let mat = |out: &mut Vec<Planned>, name: String, cols: u64, rows: u64, role: Role| {
        out.push(Planned { desc: TensorDesc::new(name, &[cols, rows], matrix_type(q, role, n, cols)), random: true });
    };
    let norm = |out: &mut Vec<Planned>, name: String, len: u64| {
        out.push(Planned { desc: TensorDesc::new(name, &[len], GgmlType::F32), random: false });
    };
    let ffn = |out: &mut Vec<Planned>, l: u64| {
        let b = |s: &str| format!("blk.{l}.{s}.weight");
        norm(out, b("ffn_norm"), p.dim);
        mat(out, b("ffn_gate"), p.dim, p.ffn, Role::Matrix);
        mat(out, b("ffn_up"), p.dim, p.ffn, Role::Matrix);
        mat(out, b("ffn_down"), p.ffn, p.dim, Role::MoreBits(l));
    };
    let gemma = arch == Arch::Gemma3;
    let qk_norm = gemma || matches!(arch, Arch::Qwen3 | Arch::Lfm2);
    mat(&mut out, "token_embd.weight".into(), p.dim, p.vocab, if p.tied { Role::Output } else { Role::Matrix });
    let lfm2 = arch == Arch::Lfm2;
    for l in 0..n {
        let b = |s: &str| format!("blk.{l}.{s}.weight");
        norm(&mut out, b("attn_norm"), p.dim);
        if lfm2 && !p.lfm2_attention(l) {
            // The conv taps are F32 (llama-quantize keeps them), `[kernel, dim]` in ggml order.
            out.push(Planned { desc: TensorDesc::new(b("shortconv.conv"), &[LFM2_CONV_TAPS, p.dim], GgmlType::F32), random: true });
            mat(&mut out, b("shortconv.in_proj"), p.dim, 3 * p.dim, Role::Matrix);
            mat(&mut out, b("shortconv.out_proj"), p.dim, p.dim, Role::Matrix);
            ffn(&mut out, l);
            continue;
        }
        mat(&mut out, b("attn_q"), p.dim, p.q_dim(), Role::Matrix);
        mat(&mut out, b("attn_k"), p.dim, p.kv_dim(), Role::Matrix);
        mat(&mut out, b("attn_v"), p.dim, p.kv_dim(), Role::MoreBits(l));
        if arch == Arch::Qwen2 {
            for (s, n) in [("attn_q", p.q_dim()), ("attn_k", p.kv_dim()), ("attn_v", p.kv_dim())] {
                out.push(Planned { desc: TensorDesc::new(format!("blk.{l}.{s}.bias"), &[n], GgmlType::F32), random: true });
            }
        }
        if qk_norm {
            norm(&mut out, b("attn_q_norm"), p.head_dim);
            norm(&mut out, b("attn_k_norm"), p.head_dim);
        }
        mat(&mut out, b("attn_output"), p.q_dim(), p.dim, Role::Matrix);
        if gemma {
            norm(&mut out, b("post_attention_norm"), p.dim);
        }
        ffn(&mut out, l);
        if gemma {
            norm(&mut out, b("post_ffw_norm"), p.dim);
        }
    }
    norm(&mut out, if lfm2 { "token_embd_norm.weight" } else { "output_norm.weight" }.into(), p.dim);
    if !p.tied {
        mat(&mut out, "output.weight".into(), p.dim, p.vocab, Role::Output);
    }
    out
}

/// The type the rule gives a tensor of `plan`'s output, from its name and row length (for the
/// tests, which check the file against it independently of [`plan`]'s bookkeeping).
#[cfg(test)]
pub fn expected_type(q: QType, name: &str, tied: bool, n_layers: u64, cols: u64) -> GgmlType {
    if !name.ends_with(".weight") || name.contains("norm") || name.contains("shortconv.conv") {
        return GgmlType::F32;
    }
    let layer = name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|i| i.parse::<u64>().ok());
    let role = match (name, layer) {
        ("output.weight", _) => Role::Output,
        ("token_embd.weight", _) if tied => Role::Output,
        (_, Some(i)) if name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight") => Role::MoreBits(i),
        _ => Role::Matrix,
    };
    matrix_type(q, role, n_layers, cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(plan: &[Planned], name: &str) -> GgmlType {
        plan.iter().find(|t| t.desc.name == name).unwrap_or_else(|| panic!("{name}")).desc.ty
    }

    #[test]
    fn the_rule_on_the_real_shapes() {
        let smol = Preset::by_name("smol-135m").unwrap();
        let p = plan(Arch::Llama, &smol, QType::Q4_1);
        assert_eq!(p.len(), 2 + 30 * 9);
        assert_eq!(ty(&p, "token_embd.weight"), GgmlType::Q8_0, "576 is not a multiple of 256");
        assert_eq!(ty(&p, "blk.0.attn_q.weight"), GgmlType::Q4_1);
        assert_eq!(ty(&p, "blk.0.attn_norm.weight"), GgmlType::F32);
        let p = plan(Arch::Llama, &smol, QType::Q4K);
        assert_eq!(ty(&p, "blk.0.attn_q.weight"), GgmlType::Q5_0, "Q4_K falls back on 576-long rows");
        assert_eq!(ty(&p, "blk.0.attn_v.weight"), GgmlType::Q8_0, "Q6_K falls back on 576-long rows");
        assert_eq!(ty(&p, "blk.0.ffn_down.weight"), GgmlType::Q6_K, "1536 = 6 x 256");
        assert_eq!(ty(&p, "blk.4.ffn_down.weight"), GgmlType::Q4_K);
        let l1b = Preset::by_name("llama-1b").unwrap();
        let p = plan(Arch::Llama, &l1b, QType::Q4_0);
        assert_eq!(ty(&p, "token_embd.weight"), GgmlType::Q6_K);
        assert!(p.iter().all(|t| t.desc.name != "output.weight"));
        let l8b = Preset::by_name("llama-8b").unwrap();
        let p = plan(Arch::Llama, &l8b, QType::Q4_0);
        assert_eq!((ty(&p, "token_embd.weight"), ty(&p, "output.weight")), (GgmlType::Q4_0, GgmlType::Q6_K));
        let p = plan(Arch::Llama, &l8b, QType::Q8_0);
        assert_eq!(ty(&p, "output.weight"), GgmlType::Q8_0);
        let g = Preset::by_name("gemma3-270m").unwrap();
        let p = plan(Arch::Gemma3, &g, QType::Q4K);
        assert_eq!(p.len(), 2 + 18 * 13);
        assert_eq!(ty(&p, "blk.0.attn_q_norm.weight"), GgmlType::F32);
        assert_eq!(ty(&p, "blk.0.attn_output.weight"), GgmlType::Q4_K, "1024-long rows");
        for t in &p {
            assert_eq!(t.desc.ty, expected_type(QType::Q4K, &t.desc.name, true, 18, t.desc.dims[0]), "{}", t.desc.name);
        }
    }

    #[test]
    fn more_bits_layers() {
        let on: Vec<u64> = (0..16).filter(|&i| use_more_bits(i, 16)).collect();
        assert_eq!(on, vec![0, 1, 4, 7, 10, 13, 14, 15]);
    }
}
