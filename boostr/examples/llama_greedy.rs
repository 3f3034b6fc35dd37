//! Greedy decoding of a llama-architecture GGUF file (SmolLM2, Llama 3.x) on boostr's plans and
//! numr alone, without cera: a tutorial for building your own engine.
//!
//! ```sh
//! cargo run -p boostr --release --example llama_greedy -- MODEL.gguf 1 504 3458 -n 16
//! ```
//! prints the 16 token ids that follow the prompt ids (no tokenizer here; `cera tokenize` gives
//! ids). The whole step (embedding, 30 layers, LM head, argmax) is ONE plan, built once and
//! recorded per token into one submit. The id never leaves the GPU: argmax writes `ids[t + 1]`,
//! where the next step's embedding reads it. Prompt tokens run through the same step, one at a
//! time, with their id written over the argmax's.
use std::collections::HashMap;
use std::sync::Arc;

use boostr::act::{Act, ActIo, ActKind, ActPlan, GluInput};
use boostr::attention::{AttnOptions, DecodePlan};
use boostr::embedding::{EmbeddingPlan, GpuEmbedding};
use boostr::formats::{GgmlType, PackedWeights, repack};
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use boostr::norm::{Norm, NormIo, NormPlan};
use boostr::ops_common::{GpuView, OpPlan};
use boostr::quant::upload::concat_rows;
use boostr::quant::{GemvIo, GemvPlan, QuantGemv, QuantMatrix, WeightKind};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopeParams, RopePositions, RopeScaling, RopeStyle};
use boostr::sampling::ArgmaxPlan;
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, Plan, StepValues};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The few GGUF facts a llama needs: numeric metadata, and each tensor's type, shape and bytes.
struct Gguf {
    nums: HashMap<String, f64>,
    tensors: HashMap<String, (GgmlType, Vec<usize>, usize)>,
    data: Vec<u8>,
}

fn parse(buf: Vec<u8>) -> Res<Gguf> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Res<&[u8]> {
        let s = buf.get(at..at + n).ok_or("truncated GGUF")?;
        at += n;
        Ok(s)
    };
    let u = |b: &[u8]| b.iter().rev().fold(0u64, |a, &x| a << 8 | x as u64);
    if take(4)? != b"GGUF" || u(take(4)?) < 2 {
        return Err("not a GGUF v2/v3 file".into());
    }
    let (n_tensors, n_kv) = (u(take(8)?), u(take(8)?));
    let mut nums = HashMap::new();
    // One value of type `ty`: numbers are kept, strings and arrays skipped.
    fn value(take: &mut dyn FnMut(usize) -> Res<Vec<u8>>, ty: u32) -> Res<Option<f64>> {
        let u = |b: Vec<u8>| b.iter().rev().fold(0u64, |a, &x| a << 8 | x as u64);
        Ok(match ty {
            0 | 1 | 7 => Some(take(1)?[0] as f64),
            2 | 3 => Some(u(take(2)?) as f64),
            4 | 5 => Some(u(take(4)?) as f64),
            6 => Some(f32::from_bits(u(take(4)?) as u32) as f64),
            10 | 11 => Some(u(take(8)?) as f64),
            12 => Some(f64::from_bits(u(take(8)?))),
            8 => {
                let n = u(take(8)?) as usize;
                take(n)?;
                None
            }
            9 => {
                let (et, n) = (u(take(4)?) as u32, u(take(8)?));
                for _ in 0..n {
                    value(take, et)?;
                }
                None
            }
            t => return Err(format!("metadata type {t}").into()),
        })
    }
    let mut take_vec = |n: usize| take(n).map(|s| s.to_vec());
    let string = |t: &mut dyn FnMut(usize) -> Res<Vec<u8>>| -> Res<String> {
        let n = u(&t(8)?) as usize;
        Ok(String::from_utf8(t(n)?)?)
    };
    for _ in 0..n_kv {
        let key = string(&mut take_vec)?;
        let ty = u(&take_vec(4)?) as u32;
        if let Some(v) = value(&mut take_vec, ty)? {
            nums.insert(key, v);
        }
    }
    let mut tensors = HashMap::new();
    for _ in 0..n_tensors {
        let name = string(&mut take_vec)?;
        let dims: Vec<usize> = (0..u(&take_vec(4)?)).map(|_| take_vec(8).map(|b| u(&b) as usize)).collect::<Res<_>>()?;
        let ty = GgmlType::from_ggml_id(u(&take_vec(4)?) as u32)?;
        tensors.insert(name, (ty, dims, u(&take_vec(8)?) as usize));
    }
    let align = nums.get("general.alignment").map_or(32, |&a| a as usize);
    let data = buf[at.div_ceil(align) * align..].to_vec();
    Ok(Gguf { nums, tensors, data })
}

impl Gguf {
    fn num(&self, key: &str) -> Res<f64> {
        self.nums.get(key).copied().ok_or_else(|| format!("missing {key}").into())
    }
    /// A matrix in boostr's GPU layout (`[rows, cols]`, GGUF dims `[cols, rows]`).
    fn mat(&self, name: &str) -> Res<PackedWeights> {
        let (ty, dims, off) = self.tensors.get(name).ok_or_else(|| format!("missing tensor {name}"))?;
        let (cols, rows) = (dims[0], dims.get(1).copied().unwrap_or(1));
        Ok(repack(*ty, &self.data[*off..*off + rows * ty.bytes_for(cols)?], rows, cols)?)
    }
    fn vec(&self, name: &str) -> Res<Vec<f32>> {
        let p = self.mat(name)?;
        Ok(p.dequantize_row(0)?)
    }
}

/// Greedy ids after `prompt` (at least one id), `n` of them.
pub fn greedy(path: &str, prompt: &[u32], n: usize) -> Res<Vec<u32>> {
    let g = parse(std::fs::read(path)?)?;
    let a = "llama";
    let k = |s: &str| g.num(&format!("{a}.{s}")).map(|v| v as usize);
    let (d, layers, ffn, nq, nkv) =
        (k("embedding_length")?, k("block_count")?, k("feed_forward_length")?, k("attention.head_count")?, k("attention.head_count_kv")?);
    let (hd, eps) = (d / nq, g.num("llama.attention.layer_norm_rms_epsilon")? as f32);
    let base = g.nums.get("llama.rope.freq_base").map_or(10_000.0, |&b| b as f32);
    let rope = RopeParams { head_dim: hd, rot_dim: hd, base, scaling: RopeScaling::None, style: RopeStyle::Normal };
    let embd = g.mat("token_embd.weight")?;
    let (vocab, steps) = (embd.rows(), prompt.len() + n);

    let ctx = GpuContext::new()?;
    let env = KernelEnv::from_caps(ctx.capabilities());
    let buf = |floats: usize| -> Res<Arc<GpuBuffer>> { Ok(ctx.alloc((floats * 4) as u64, BufferKind::Storage)?) };
    let (res, delta, normed, qkv, att, gu, act, logits) =
        (buf(d)?, buf(d)?, buf(d)?, buf((nq + 2 * nkv) * hd)?, buf(nq * hd)?, buf(2 * ffn)?, buf(ffn)?, buf(vocab)?);
    let ids = ctx.alloc((steps as u64 + 1) * 4, BufferKind::Storage)?;
    let cache =
        KvCache::new(&ctx, KvCacheConfig { n_layers: layers, n_kv_heads: nkv, head_dim: hd, capacity: steps, dtype: KvDtype::F16, max_segment_bytes: None })?;
    let gemv = |w: &PackedWeights, x: &Arc<GpuBuffer>, y: &Arc<GpuBuffer>| -> Res<Plan> {
        let m = QuantMatrix::upload(&ctx, "w", w)?;
        let cfg = QuantGemv::new(WeightKind::of(w.format()), &env, 1);
        Ok(GemvPlan::new(&ctx, &cfg, &m, &GemvIo::new(Binding::whole(x), Binding::whole(y)))?.plan().clone())
    };
    // `normed = rmsnorm(x) * w`, or with `residual` first `res += delta` and the norm of `res`.
    let norm = |w: Vec<f32>, residual: bool| -> Res<Plan> {
        let x = GpuView::whole(if residual { &delta } else { &res });
        let io = NormIo {
            x,
            w: GpuView::whole(&ctx.upload(bytemuck::cast_slice(&w))?),
            b: None,
            residual: residual.then(|| GpuView::whole(&res)),
            out: Some(GpuView::whole(&normed)),
        };
        Ok(NormPlan::new(&ctx, &Norm { residual, ..Norm::rms() }, &io, d, 1, eps)?.plan().clone())
    };

    let mut plan = Plan::new();
    let table = GpuEmbedding::new(&ctx, &embd, None)?;
    plan.append(EmbeddingPlan::new(&ctx, &table, &GpuView::whole(&ids), 1, 1.0, Some(GpuView::whole(&res)))?.plan());
    let qkv_rope = QkvRope { style: RopeStyle::Normal, rope: true, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::F16) };
    let qb = Binding::whole(&qkv);
    for l in 0..layers {
        let b = |s: &str| format!("blk.{l}.{s}.weight");
        // Layer 0 normalises the embedding; later layers first add the previous FFN's delta.
        plan.append(&norm(g.vec(&b("attn_norm"))?, l > 0)?);
        plan.append(&gemv(&concat_rows(&[&g.mat(&b("attn_q"))?, &g.mat(&b("attn_k"))?, &g.mat(&b("attn_v"))?])?, &normed, &qkv)?);
        let inputs = QkvRopeInputs {
            x: &qb,
            layout: QkvLayout::packed(1, nq, nkv, hd),
            rope: &rope,
            positions: &RopePositions::Step,
            qw: None,
            kw: None,
            eps,
            cache: Some((&cache, l)),
        };
        plan.append(QkvRopePlan::new(&ctx, &qkv_rope, &inputs)?.plan());
        plan.append(DecodePlan::builder(&ctx, &qb, 0, nq, &cache, l, &AttnOptions::new(hd)).output(&Binding::whole(&att), 0).build()?.plan());
        plan.append(&gemv(&g.mat(&b("attn_output"))?, &att, &delta)?);
        plan.append(&norm(g.vec(&b("ffn_norm"))?, true)?);
        plan.append(&gemv(&concat_rows(&[&g.mat(&b("ffn_gate"))?, &g.mat(&b("ffn_up"))?])?, &normed, &gu)?);
        let glu = Act { kind: ActKind::Silu, input: GluInput::Packed };
        plan.append(ActPlan::new(&ctx, &glu, &ActIo { a: GpuView::whole(&gu), b: None, out: Some(GpuView::whole(&act)) }, ffn, 1)?.plan());
        plan.append(&gemv(&g.mat(&b("ffn_down"))?, &act, &delta)?);
    }
    plan.append(&norm(g.vec("output_norm.weight")?, true)?);
    let head = if g.tensors.contains_key("output.weight") { g.mat("output.weight")? } else { embd };
    plan.append(&gemv(&head, &normed, &logits)?);
    plan.append(ArgmaxPlan::new(&ctx, &GpuView::whole(&logits), vocab, Some(GpuView::new(Binding::whole(&ids), 1)), steps)?.plan());

    ctx.write(&ids, 0, bytemuck::cast_slice(prompt))?;
    for t in 0..steps - 1 {
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &StepValues::decode(t as u32).with_token(t as u32))?;
        rec.submit()?;
        if t + 1 < prompt.len() {
            // Ordered after this submit: the prompt's next id replaces the argmax's.
            ctx.write(&ids, 4 * (t as u64 + 1), &prompt[t + 1].to_le_bytes())?;
        }
    }
    let all: Vec<u32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&ids, 0, 4 * steps as u64)?);
    Ok(all[prompt.len()..].to_vec())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut prompt, mut n, mut path) = (Vec::new(), 16, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-n" => n = it.next().ok_or("-n needs a count")?.parse()?,
            p if path.is_none() => path = Some(p.to_string()),
            id => prompt.push(id.parse::<u32>()?),
        }
    }
    let path = path.ok_or("usage: llama_greedy MODEL.gguf ID... [-n N]")?;
    if prompt.is_empty() {
        return Err("give at least one prompt id".into());
    }
    println!("{:?}", greedy(&path, &prompt, n)?);
    Ok(())
}
