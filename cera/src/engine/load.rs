//! [`Engine::load`]: a GGUF file or a Hugging Face model folder to a model on a device.
//!
//! The file is checked completely before anything is uploaded (architecture, hyperparameters,
//! every tensor's presence, shape and type), so a bad file fails at once with the first problem
//! named. Then the device is chosen ([`DeviceChoice`]) and the executor prepares the weights,
//! reporting progress in bytes.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numr::gpu::{GpuContext, GpuOptions};

use crate::chat_template::ChatTemplate;
use crate::model_file::{ModelError, ModelFile};
use crate::tokenizer::Tokenizer;

use super::backend::{Backend, ProgressFn};
use super::cpu::CpuBackend;
use super::gpu::{GpuBackend, SplitBackend};
use super::graph::ModelGraph;
use super::hf::HfModel;
use super::model::{Engine, EngineParts, LoadTimes, end_of_generation_ids};
use super::options::{DeviceChoice, LoadOptions};
use super::weights::WeightSource;
use super::{EngineError, weights};

/// The context length used when [`LoadOptions::n_ctx`] is `None` and the model was trained on
/// more.
pub const DEFAULT_MAX_CTX: usize = 4096;

/// Whether numr's adapter is a real GPU (not a software rasterizer such as lavapipe or
/// SwiftShader, which report themselves as CPU devices).
pub fn is_hardware_gpu(ctx: &GpuContext) -> bool {
    let caps = ctx.capabilities();
    let name = caps.adapter_name.to_ascii_lowercase();
    let software = ["llvmpipe", "lavapipe", "swiftshader", "software", "warp"].iter().any(|s| name.contains(s));
    matches!(caps.device_type.as_str(), "DiscreteGpu" | "IntegratedGpu" | "VirtualGpu") && !software
}

fn gpu_context() -> Result<GpuContext, EngineError> {
    GpuContext::new().map_err(|e| EngineError::Device { device: "GPU".into(), reason: e.to_string() })
}

fn in_file(path: &Path) -> impl Fn(EngineError) -> EngineError + '_ {
    move |e| EngineError::InFile { path: path.to_path_buf(), source: Box::new(e) }
}

/// Everything about the file, checked, before a device is touched.
struct Checked {
    source: Box<dyn WeightSource>,
    graph: ModelGraph,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    eog: Vec<u32>,
    name: Option<String>,
}

/// A model file's error as the engine's: tokenizer and template errors keep their types.
fn model_err(e: ModelError) -> EngineError {
    match e {
        ModelError::Tokenizer(t) => t.into(),
        ModelError::Template(t) => t.into(),
        other => EngineError::File { reason: other.to_string() },
    }
}

fn check_file(path: &Path) -> Result<Checked, EngineError> {
    let wrap = in_file(path);
    // GGUF errors name the file already.
    let file = ModelFile::open(path).map_err(|e| EngineError::File { reason: e.to_string() })?;
    let tokenizer = file.tokenizer().map_err(|e| wrap(model_err(e)))?;
    let template = file.chat_template(&tokenizer).map_err(|e| wrap(model_err(e)))?;
    let mut eog = end_of_generation_ids(&tokenizer);
    let (source, graph, name): (Box<dyn WeightSource>, ModelGraph, Option<String>) = match file {
        ModelFile::Gguf(g) => {
            let graph = ModelGraph::from_gguf(&g).map_err(&wrap)?;
            let name = g.metadata().get_str("general.name").ok().map(str::to_string);
            (g, graph, name)
        }
        ModelFile::Safetensors(st) => {
            let hf = HfModel::new(*st).map_err(&wrap)?;
            let graph = hf.graph().map_err(&wrap)?;
            eog.extend(hf.generation_eos().map_err(&wrap)?);
            eog.sort_unstable();
            eog.dedup();
            let name = hf.safetensors().dir().file_name().and_then(|n| n.to_str()).map(str::to_string);
            (Box::new(hf), graph, name)
        }
    };
    weights::check_all(&graph, source.as_ref()).map_err(&wrap)?;
    Ok(Checked { source, graph, tokenizer, template, eog, name })
}

fn cpu(graph: &ModelGraph, file: &dyn WeightSource, opts: &LoadOptions, progress: Option<ProgressFn<'_>>) -> Result<Arc<dyn Backend>, EngineError> {
    let threads = opts.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let int8 = opts.decode_gemv.int8_on_cpu();
    Ok(Arc::new(CpuBackend::load_with_activations(graph, file, threads, int8, progress)?))
}

/// The GPUs of `opts.devices` with the model's layers split across them ([`SplitBackend`]); one
/// device: a plain [`GpuBackend`] on that adapter.
fn split(graph: &ModelGraph, file: &dyn WeightSource, opts: &LoadOptions, progress: Option<ProgressFn<'_>>) -> Result<Arc<dyn Backend>, EngineError> {
    if opts.devices.is_empty() {
        return Err(EngineError::Usage("--tensor-split needs --devices (the GPUs to split the layers across)".into()));
    }
    if opts.device == DeviceChoice::Cpu {
        return Err(EngineError::Usage("--devices names GPUs: not with --device cpu".into()));
    }
    let ranges = super::split::split_layers(graph.cfg.n_layers, opts.devices.len(), &opts.tensor_split)?;
    let ctxs = opts
        .devices
        .iter()
        .map(|d| {
            let o = GpuOptions { adapter: Some(d.trim().to_string()), ..GpuOptions::from_env() };
            GpuContext::with_options(o).map(Arc::new).map_err(|e| EngineError::Device { device: format!("adapter `{d}`"), reason: e.to_string() })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let [ctx] = &ctxs[..] {
        return gpu(ctx.as_ref().clone(), graph, file, opts, progress);
    }
    Ok(Arc::new(SplitBackend::load(ctxs, graph, &ranges, file, progress, &|b| configured(b, opts))?))
}

/// `b` with the settings of `opts` (the decode GEMV, the tuning, the measuring-only switches).
fn configured(b: GpuBackend, opts: &LoadOptions) -> GpuBackend {
    b.with_decode_gemv(opts.decode_gemv).with_tuning(opts.tuning.clone()).with_measuring_only_diagnostics(opts.measuring_only.clone())
}

fn gpu(
    ctx: GpuContext,
    graph: &ModelGraph,
    file: &dyn WeightSource,
    opts: &LoadOptions,
    progress: Option<ProgressFn<'_>>,
) -> Result<Arc<dyn Backend>, EngineError> {
    Ok(Arc::new(configured(GpuBackend::load(Arc::new(ctx), graph, file, progress)?, opts)))
}

impl Engine {
    /// Loads a GGUF file or a Hugging Face model folder (`config.json`, safetensors,
    /// `tokenizer.json`; see [`HfModel`]) onto the device `opts.device` chooses:
    /// - [`DeviceChoice::Cpu`]: the CPU executor, `opts.threads` workers (default: every core);
    /// - [`DeviceChoice::Gpu`]: the adapter numr picks (`NUMR_ADAPTER` / `NUMR_BACKEND` choose;
    ///   lavapipe counts);
    /// - [`DeviceChoice::Auto`]: that adapter when it is a real GPU ([`is_hardware_gpu`]), else the
    ///   CPU executor.
    ///
    /// The context length is `opts.n_ctx`, else the model's trained context or
    /// [`DEFAULT_MAX_CTX`], whichever is smaller. A context longer than the trained one is
    /// allowed (the model's output past its trained length is usually poor). `progress` is
    /// called as the weights are prepared (bytes done, out of all).
    ///
    /// Errors about the file's content ([`EngineError::UnknownArchitecture`],
    /// [`EngineError::MissingTensor`], [`EngineError::TensorShape`], [`EngineError::TensorType`],
    /// tokenizer and template errors, ...) come as [`EngineError::InFile`] naming the file
    /// ([`EngineError::inner`] gives the error itself); device errors as
    /// [`EngineError::Device`].
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions, progress: Option<ProgressFn<'_>>) -> Result<Engine, EngineError> {
        let start = Instant::now();
        let path = path.as_ref();
        let Checked { source, graph, tokenizer, template, eog, name } = check_file(path)?;
        let file = source.as_ref();
        let n_ctx = opts.n_ctx.unwrap_or(graph.cfg.context_length.min(DEFAULT_MAX_CTX));
        if n_ctx == 0 {
            return Err(EngineError::Usage("the context length must be at least 1".into()));
        }
        if opts.ubatch == 0 {
            return Err(EngineError::Usage("the batch size (ubatch) must be at least 1".into()));
        }
        let file_time = start.elapsed();
        let t = Instant::now();
        let (backend, device) = match opts.device {
            _ if !opts.devices.is_empty() || !opts.tensor_split.is_empty() => (split(&graph, file, opts, progress)?, Duration::ZERO),
            DeviceChoice::Cpu => (cpu(&graph, file, opts, progress)?, Duration::ZERO),
            DeviceChoice::Gpu => {
                let ctx = gpu_context()?;
                let device = t.elapsed();
                (gpu(ctx, &graph, file, opts, progress)?, device)
            }
            DeviceChoice::Auto => {
                let ctx = GpuContext::new();
                let device = t.elapsed();
                match ctx {
                    Ok(ctx) if is_hardware_gpu(&ctx) => (gpu(ctx, &graph, file, opts, progress)?, device),
                    _ => (cpu(&graph, file, opts, progress)?, device),
                }
            }
        };
        // One end instant, so that the parts add up to the total.
        let end = Instant::now();
        let times = LoadTimes {
            total: end - start,
            file: file_time,
            device,
            weights: (end - t).saturating_sub(device),
            device_writes: backend.weight_write_time(),
            host_wait: backend.weight_wait_time(),
        };
        let parts = EngineParts { backend, tokenizer, template, config: graph.cfg, eog, n_ctx, ubatch: opts.ubatch, kv: opts.kv };
        Engine::assemble(parts, Some(path.to_path_buf()), name, times).map_err(in_file(path))
    }
}
