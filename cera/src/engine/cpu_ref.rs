//! A plain CPU forward pass of the llama architecture: every weight dequantized to f32 with
//! boostr's reference dequantizer, one token at a time with an f32 KV cache, matrix-vector
//! products split over threads by rows. It is the oracle the engine's executors are checked
//! against, and itself checked against llama.cpp's logits (`tests/golden/generation/`).
//!
//! Not the engine's CPU path (that runs the shared layer description); gemma3 is not covered
//! here yet.
//!
//! [`CpuRefModel::set_int8_activations`] rounds every projection's input to int8 per block of
//! 32 first (`d = max|x| / 127`, `q = round(x / d)`, ties away from zero: llama.cpp's Q8 scheme
//! and the GPU's int8 decode path), so that path has an oracle of its own.

use crate::gguf::GgufFile;

use super::graph::MatRef;
use super::weights::WeightSource;
use super::{Arch, EngineError, ModelConfig};

struct Layer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// The reference model with its KV cache.
pub struct CpuRefModel {
    cfg: ModelConfig,
    embd: Vec<f32>,
    layers: Vec<Layer>,
    out_norm: Vec<f32>,
    /// `None`: tied to the embedding.
    output: Option<Vec<f32>>,
    inv_freq: Vec<f32>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    pos: usize,
    int8: bool,
}

/// `x` rounded through int8 per block of 32 (the activations of an integer-dot GEMV).
pub fn int8_round(x: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for blk in x.chunks(32) {
        let am = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = am / 127.0;
        let inv = if am > 0.0 { 127.0 / am } else { 0.0 };
        out.extend(blk.iter().map(|v| (v * inv).round() * d));
    }
    out
}

/// `rows x cols` of the file's tensor `name`, dequantized to f32 (checked as the engine checks
/// its weights: [`WeightSource::mat_f32`]).
fn tensor(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, EngineError> {
    file.mat_f32(&MatRef { name: name.to_string(), rows, cols })
}

/// `y = W x` for `W` of `rows x x.len()`, split over the available cores.
fn matvec(w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let k = x.len();
    let mut y = vec![0.0f32; rows];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(rows.max(1));
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (i, chunk) in y.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (j, out) in chunk.iter_mut().enumerate() {
                    let r = i * per + j;
                    *out = w[r * k..(r + 1) * k].iter().zip(x).map(|(a, b)| a * b).sum();
                }
            });
        }
    });
    y
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (v * v) as f64).sum::<f64>() / x.len() as f64;
    let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
    x.iter().zip(w).map(|(v, wi)| v * inv * wi).collect()
}

impl CpuRefModel {
    /// Loads a llama-architecture file.
    pub fn load(file: &GgufFile) -> Result<CpuRefModel, EngineError> {
        let hp = file.hparams().map_err(|e| EngineError::BadConfig { reason: e.to_string() })?;
        let rows = file.tensor("token_embd.weight").and_then(|t| t.dims.get(1)).map(|&r| r as usize);
        let cfg = ModelConfig::from_hparams(&hp, rows)?;
        if cfg.arch != Arch::Llama {
            return Err(EngineError::Unsupported { what: format!("the CPU reference of {}", cfg.arch.name()) });
        }
        let (d, hd, f) = (cfg.dim, cfg.head_dim, cfg.ffn_dim);
        let (q, kv) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let t = |n: &str, r: usize, c: usize| tensor(file, &format!("blk.{l}.{n}.weight"), r, c);
            layers.push(Layer {
                attn_norm: t("attn_norm", 1, d)?,
                wq: t("attn_q", q, d)?,
                wk: t("attn_k", kv, d)?,
                wv: t("attn_v", kv, d)?,
                wo: t("attn_output", d, q)?,
                ffn_norm: t("ffn_norm", 1, d)?,
                gate: t("ffn_gate", f, d)?,
                up: t("ffn_up", f, d)?,
                down: t("ffn_down", d, f)?,
            });
        }
        let output = if file.tensor("output.weight").is_some() { Some(tensor(file, "output.weight", cfg.vocab, d)?) } else { None };
        let half = cfg.rope_dim / 2;
        let base = cfg.rope[0].base as f64;
        let inv_freq = (0..half).map(|i| (base.powf(-2.0 * i as f64 / cfg.rope_dim as f64) / cfg.rope[0].linear_factor as f64) as f32).collect();
        Ok(CpuRefModel {
            embd: tensor(file, "token_embd.weight", cfg.vocab, d)?,
            out_norm: tensor(file, "output_norm.weight", 1, d)?,
            output,
            layers,
            inv_freq,
            k: vec![Vec::new(); cfg.n_layers],
            v: vec![Vec::new(); cfg.n_layers],
            pos: 0,
            int8: false,
            cfg,
        })
    }

    /// Rounds the input of every projection from the next step on through int8 (see the module
    /// documentation).
    pub fn set_int8_activations(&mut self, on: bool) {
        self.int8 = on;
    }

    /// `y = W x`, with `x` rounded through int8 when that is on.
    fn project(&self, w: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
        if self.int8 { matvec(w, &int8_round(x), rows) } else { matvec(w, x, rows) }
    }

    /// The resolved configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Forgets the cached positions.
    pub fn reset(&mut self) {
        self.k.iter_mut().chain(self.v.iter_mut()).for_each(Vec::clear);
        self.pos = 0;
    }

    fn rope(&self, x: &mut [f32], pos: usize) {
        for head in x.chunks_mut(self.cfg.head_dim) {
            for (i, &f) in self.inv_freq.iter().enumerate() {
                let (s, c) = ((pos as f32 * f) as f64).sin_cos();
                let (a, b) = (head[2 * i] as f64, head[2 * i + 1] as f64);
                head[2 * i] = (a * c - b * s) as f32;
                head[2 * i + 1] = (a * s + b * c) as f32;
            }
        }
    }

    /// Runs one token at the next position and returns its logits.
    pub fn step(&mut self, id: u32) -> Result<Vec<f32>, EngineError> {
        let c = &self.cfg;
        let (d, hd, g) = (c.dim, c.head_dim, c.group());
        let id = id as usize;
        if id >= c.vocab {
            return Err(EngineError::BadConfig { reason: format!("token id {id} out of range for a vocabulary of {}", c.vocab) });
        }
        let mut h = self.embd[id * d..(id + 1) * d].to_vec();
        let pos = self.pos;
        for l in 0..c.n_layers {
            let ly = &self.layers[l];
            let n = rmsnorm(&h, &ly.attn_norm, c.norm_eps);
            let mut q = self.project(&ly.wq, &n, c.n_heads * hd);
            let mut k = self.project(&ly.wk, &n, c.n_kv_heads * hd);
            let v = self.project(&ly.wv, &n, c.n_kv_heads * hd);
            self.rope(&mut q, pos);
            self.rope(&mut k, pos);
            self.k[l].extend_from_slice(&k);
            self.v[l].extend_from_slice(&v);
            let kvd = c.n_kv_heads * hd;
            let mut att = vec![0.0f32; c.n_heads * hd];
            for qh in 0..c.n_heads {
                let kvh = qh / g;
                let qv = &q[qh * hd..(qh + 1) * hd];
                let s: Vec<f64> = (0..=pos)
                    .map(|p| {
                        let kr = &self.k[l][p * kvd + kvh * hd..][..hd];
                        kr.iter().zip(qv).map(|(a, b)| (a * b) as f64).sum::<f64>() * c.attn_scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (p, ep) in e.iter().enumerate() {
                    let vr = &self.v[l][p * kvd + kvh * hd..][..hd];
                    for (o, &vv) in att[qh * hd..(qh + 1) * hd].iter_mut().zip(vr) {
                        *o += (ep / z) as f32 * vv;
                    }
                }
            }
            let o = self.project(&ly.wo, &att, d);
            h.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let n = rmsnorm(&h, &ly.ffn_norm, c.norm_eps);
            let gate = self.project(&ly.gate, &n, c.ffn_dim);
            let up = self.project(&ly.up, &n, c.ffn_dim);
            let act: Vec<f32> = gate.iter().zip(&up).map(|(&gv, &u)| gv / (1.0 + (-gv).exp()) * u).collect();
            let dn = self.project(&ly.down, &act, d);
            h.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
        }
        self.pos += 1;
        let n = rmsnorm(&h, &self.out_norm, self.cfg.norm_eps);
        Ok(self.project(self.output.as_deref().unwrap_or(&self.embd), &n, self.cfg.vocab))
    }
}
