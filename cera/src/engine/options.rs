//! Options of loading a model and of one generation.

use super::EngineError;
use super::backend::KvType;
use super::sampler::SamplerOpts;
use super::tuning::{Diagnostics, GpuTuning};

/// Which device runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceChoice {
    /// A real GPU adapter when one exists (not a software rasterizer), else the CPU path.
    #[default]
    Auto,
    /// The GPU adapter numr picks (`NUMR_ADAPTER` chooses among several); lavapipe counts.
    Gpu,
    /// The CPU path, no GPU at all.
    Cpu,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<DeviceChoice, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "gpu" => Ok(DeviceChoice::Gpu),
            "cpu" => Ok(DeviceChoice::Cpu),
            other => Err(format!("unknown device `{other}` (auto, gpu, cpu)")),
        }
    }
}

/// The activations of the quantized projections: on the GPU, of the decode step's
/// matrix-vector products; on the CPU, of every projection whose format has integer-dot kernels
/// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K), where `auto` means int8 ([`DecodeGemv::int8_on_cpu`]) and
/// `f32` is the exact path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DecodeGemv {
    /// int8 for the quantized projections of models with a hidden size of at least
    /// [`DecodeGemv::INT8_MIN_DIM`], f32 for smaller models (which dispatch latency, not
    /// bandwidth, bounds, and which int8 rounding disturbs more).
    #[default]
    Auto,
    /// f32 activations everywhere, the RMSNorm and GLU fused into the GEMV (fewest dispatches;
    /// best where dispatch latency, not bandwidth, bounds the step).
    F32,
    /// Activations quantized to int8 per 32 (llama.cpp's Q8_1 scheme) by the dispatch before, and
    /// integer dot products, for every projection with a quantized format.
    Int8,
}

impl DecodeGemv {
    /// The hidden size from which `Auto` takes the int8 path.
    pub const INT8_MIN_DIM: usize = 2048;

    /// `auto` / `f32` / `int8`.
    pub fn name(self) -> &'static str {
        match self {
            DecodeGemv::Auto => "auto",
            DecodeGemv::F32 => "f32",
            DecodeGemv::Int8 => "int8",
        }
    }

    /// Whether the CPU executor's quantized projections take int8 activations: `auto` and
    /// `int8` (the CPU is bound by arithmetic at every model size, and integer dots halve it);
    /// `f32` keeps the exact path.
    pub fn int8_on_cpu(self) -> bool {
        self != DecodeGemv::F32
    }

    /// Whether the quantized projections of a model of hidden size `dim` take the int8 path.
    pub fn int8_for(self, dim: usize) -> bool {
        match self {
            DecodeGemv::Auto => dim >= Self::INT8_MIN_DIM,
            DecodeGemv::F32 => false,
            DecodeGemv::Int8 => true,
        }
    }
}

impl std::str::FromStr for DecodeGemv {
    type Err = String;
    fn from_str(s: &str) -> Result<DecodeGemv, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DecodeGemv::Auto),
            "f32" => Ok(DecodeGemv::F32),
            "int8" | "q8" => Ok(DecodeGemv::Int8),
            other => Err(format!("unknown decode GEMV `{other}` (auto, f32, int8)")),
        }
    }
}

/// Whether the GPU decode step runs each layer's dependent dispatches as one chain
/// ([`mod@numr::gpu::chain`]: the stages wait on arrival counters and completion flags, not on a
/// barrier). The chains give the same bits as the plain plan, but measured slower on the H200
/// (BENCHMARKS.md, "Chains"), so `Auto` leaves them off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Chains {
    /// Off (the chains measured slower than the barrier between dispatches on the H200, and on a
    /// software adapter the waiting workgroups spin on the cores that run the others).
    #[default]
    Auto,
    /// Wherever the adapter has `@coherent` storage.
    On,
    /// Never.
    Off,
}

impl Chains {
    /// Whether chains run on an adapter with these capabilities.
    pub fn enabled(self, caps: &numr::gpu::Capabilities) -> bool {
        self == Chains::On && numr::gpu::chains_run_on(caps)
    }
}

impl std::str::FromStr for Chains {
    type Err = String;
    fn from_str(s: &str) -> Result<Chains, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Chains::Auto),
            "on" => Ok(Chains::On),
            "off" => Ok(Chains::Off),
            other => Err(format!("unknown chain mode `{other}` (auto, on, off)")),
        }
    }
}

/// How to load a model.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadOptions {
    /// The device.
    pub device: DeviceChoice,
    /// Context length; `None`: the model's trained context or 4096, whichever is smaller.
    pub n_ctx: Option<usize>,
    /// Most prompt tokens one prefill step runs (llama.cpp's ubatch); default 512.
    pub ubatch: usize,
    /// KV cache type; default f16.
    pub kv: KvType,
    /// CPU threads; `None`: all available cores.
    pub threads: Option<usize>,
    /// The GPU decode step's GEMV activations; default [`DecodeGemv::Auto`].
    pub decode_gemv: DecodeGemv,
    /// The GPU plan builder's tuning (speed only); default: the measured [`GpuTuning`].
    pub tuning: GpuTuning,
    /// For measuring only: ablation makes the output wrong, the traces print to standard
    /// error ([`Diagnostics`]). Default: all off. Leave it so outside a measurement.
    pub measuring_only: Diagnostics,
    /// The GPUs to split the model's layers across (adapter indices as `cera devices` lists
    /// them, or parts of their names; one entry: just that adapter); empty: the one adapter
    /// [`Self::device`] picks. The same adapter may be named twice (two devices of one adapter).
    pub devices: Vec<String>,
    /// Each device's share of the layers with [`Self::devices`] (`[1.0, 3.0]`: a quarter on the
    /// first); empty: the same share each.
    pub tensor_split: Vec<f64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceChoice::Auto,
            n_ctx: None,
            ubatch: 512,
            kv: KvType::F16,
            threads: None,
            decode_gemv: DecodeGemv::Auto,
            tuning: GpuTuning::default(),
            measuring_only: Diagnostics::default(),
            devices: Vec::new(),
            tensor_split: Vec::new(),
        }
    }
}

/// Options of one `generate` call: the sampler's, and what bounds and shapes the output.
///
/// ```
/// use cera::engine::{GenerateOpts, SamplerOpts};
/// // Sampled, with a seed and a stop string.
/// let opts = GenerateOpts { max_tokens: 128, stop: vec!["\n\n".into()], ..Default::default() }.with_temperature(0.7).with_seed(42);
/// assert_eq!((opts.sampler.temperature, opts.sampler.seed, opts.sampler.top_k), (0.7, 42, 40));
/// // Any sampler setting, through the embedded options.
/// let opts = GenerateOpts { sampler: SamplerOpts { top_k: 5, ..SamplerOpts::default() }, ..GenerateOpts::greedy(16) };
/// assert_eq!((opts.max_tokens, opts.sampler.top_k), (16, 5));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOpts {
    /// How the next token is chosen: temperature, top-k/p, min-p, penalties, seed.
    pub sampler: SamplerOpts,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop strings: matched across token boundaries, never emitted.
    pub stop: Vec<String>,
    /// Stop tokens besides the model's end-of-generation tokens.
    pub stop_tokens: Vec<u32>,
    /// Keep generating through end-of-generation tokens (they are then masked out and never
    /// chosen, as llama.cpp's `ignore_eos` does).
    pub ignore_eos: bool,
    /// Report the N most likely ids with their log-probabilities at each step (0: off; at most
    /// [`MAX_TOP_LOGPROBS`](super::MAX_TOP_LOGPROBS)).
    pub top_logprobs: usize,
    /// Pipelined decoding (default on): greedy steps whose id stays on the device (no
    /// penalties, no `top_logprobs`) are recorded and submitted one token ahead, before the
    /// previous id is read back, so the device never waits for the host. Stop conditions are
    /// checked one token late; the step run past a stop is discarded and its cache position
    /// is not counted. The output is the same either way.
    pub pipeline: bool,
    /// Constrained decoding (structured output): each step may only choose the ids the
    /// constraint allows, and the generation ends when it is complete. Such a generation reads
    /// each step's whole logits row.
    pub constraint: Option<super::Constraint>,
    /// Added to the raw logit of each listed id before sampling (OpenAI's `logit_bias`: -100
    /// bans an id in practice, 100 all but forces it). Such a generation reads each step's whole
    /// logits row; log-probabilities stay those of the raw row.
    pub logit_bias: Vec<(u32, f32)>,
    /// Speculative decoding in the [`Batcher`](super::Batcher) (`None`: off): see
    /// [`Speculative`].
    pub speculative: Option<Speculative>,
}

/// Speculative decoding in the batcher. The drafts come from prompt lookup
/// ([`DraftSource::Ngram`]: at each decode step the batcher looks for the last `ngram`, down to
/// one, generated-or-prompt tokens earlier in the sequence and proposes the tokens that followed
/// them, up to `draft_max`) or from the batcher's draft model ([`DraftSource::Model`], see
/// [`Engine::batcher_with_draft`](super::Engine::batcher_with_draft)); the model runs the last token
/// and the drafts as one entry of the step with an output at every row, and keeps the drafts
/// up to the first one its own choice disagrees with, plus its choice there. Greedy output is
/// the same token for token as without it (the rows run through the decode rows' kernels).
/// Sampling from top-k candidates keeps a draft with its probability under the sampler and
/// otherwise draws from the rest (speculative sampling with a one-token proposal), so every
/// token keeps its distribution (a chi-square test checks it), though a seed then reproduces
/// its tokens only under the same drafts (their length can follow the step's other
/// sequences); generations that need whole
/// logits rows (penalties, `top_logprobs`, constraints, `logit_bias`, `top_k` 0 or over 128)
/// decode without drafts. The [`BatcherMetrics`](super::BatcherMetrics) count drafted and
/// accepted tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speculative {
    /// Most draft tokens per step (1 to 16).
    pub draft_max: usize,
    /// Fewest draft tokens worth a verification (fewer: a plain decode row).
    pub draft_min: usize,
    /// Longest suffix matched (1 to 8).
    pub ngram: usize,
    /// Pace the drafts by how often they are kept and what verifying them costs
    /// ([`DraftPacer`](super::speculative::DraftPacer)): the number of drafts that gives the
    /// most tokens per unit of time, none while decoding plainly is faster (with a probe now
    /// and then). Off: every step verifies what the drafter finds, up to `draft_max`. Sessions
    /// cost a verification step as measured ([`VerifyCost::for_model`](super::VerifyCost::for_model));
    /// the batcher costs a verification entry's rows in its step
    /// ([`VerifyCost::for_batch`](super::VerifyCost::for_batch)) and a draft model's steps.
    pub adaptive: bool,
    /// Where the drafts come from.
    pub source: DraftSource,
}

impl Default for Speculative {
    fn default() -> Self {
        Speculative { draft_max: 8, draft_min: 1, ngram: 3, adaptive: true, source: DraftSource::Ngram }
    }
}

/// Where a [`Speculative`] request's drafts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftSource {
    /// Prompt lookup: no model, a scan of the sequence per step.
    #[default]
    Ngram,
    /// The batcher's draft model ([`Engine::batcher_with_draft`](super::Engine::batcher_with_draft)),
    /// decoding greedily; a request for it on a batcher without one is a
    /// [`EngineError::Usage`] at submission.
    Model,
}

/// At most 256 tokens, sampled with [`SamplerOpts::default`] (llama.cpp's defaults), pipelined.
impl Default for GenerateOpts {
    fn default() -> Self {
        GenerateOpts {
            sampler: SamplerOpts::default(),
            max_tokens: 256,
            stop: Vec::new(),
            stop_tokens: Vec::new(),
            ignore_eos: false,
            top_logprobs: 0,
            pipeline: true,
            constraint: None,
            logit_bias: Vec::new(),
            speculative: None,
        }
    }
}

impl GenerateOpts {
    /// Greedy decoding ([`SamplerOpts::greedy`]) of at most `max_tokens`.
    pub fn greedy(max_tokens: usize) -> GenerateOpts {
        GenerateOpts { max_tokens, sampler: SamplerOpts::greedy(), ..Default::default() }
    }

    /// The same with the sampler's temperature `temperature` (0: greedy).
    pub fn with_temperature(mut self, temperature: f32) -> GenerateOpts {
        self.sampler.temperature = temperature;
        self
    }

    /// The same with the sampler's seed `seed`.
    pub fn with_seed(mut self, seed: u64) -> GenerateOpts {
        self.sampler.seed = seed;
        self
    }

    /// Checks the sampler's values ([`SamplerOpts::check`]), `top_logprobs` (at most
    /// [`MAX_TOP_LOGPROBS`](super::MAX_TOP_LOGPROBS)) and that every `logit_bias` is finite:
    /// [`EngineError::Sampler`] otherwise. An id outside the vocabulary is a
    /// [`EngineError::TokenOutOfRange`] at the first step.
    /// `Session::generate` calls it before anything runs.
    pub fn check(&self) -> Result<(), EngineError> {
        self.sampler.check()?;
        if self.top_logprobs > super::MAX_TOP_LOGPROBS {
            return Err(EngineError::Sampler { option: "top_logprobs", value: self.top_logprobs.to_string(), expected: "at most 100" });
        }
        if let Some(s) = self.speculative {
            let max = super::batch::MAX_DRAFT;
            if !(1..=max).contains(&s.draft_max) || !(1..=s.draft_max).contains(&s.draft_min) || !(1..=8).contains(&s.ngram) {
                return Err(EngineError::Sampler {
                    option: "speculative",
                    value: format!("draft_max {}, draft_min {}, ngram {}", s.draft_max, s.draft_min, s.ngram),
                    expected: "1 <= draft_min <= draft_max <= 16, ngram 1 to 8",
                });
            }
        }
        if let Some(&(id, b)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(EngineError::Sampler { option: "logit_bias", value: format!("{b} for id {id}"), expected: "a finite number" });
        }
        Ok(())
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// An end-of-generation token, a stop token or a stop string.
    Stop,
    /// `max_tokens` reached.
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// Cancelled through the [`CancelToken`](super::CancelToken).
    Cancelled,
}

impl FinishReason {
    /// `stop`, `max_tokens`, `context_full`, `cancelled`.
    pub fn name(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::MaxTokens => "max_tokens",
            FinishReason::ContextFull => "context_full",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values `greedy` and `Default` have always had, field by field.
    #[test]
    fn greedy_and_default_values() {
        let s = SamplerOpts {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        };
        let rest = |o: &GenerateOpts| (o.stop.is_empty(), o.stop_tokens.is_empty(), o.ignore_eos, o.top_logprobs, o.pipeline);
        let d = GenerateOpts::default();
        assert_eq!((&d.sampler, d.max_tokens), (&s, 256));
        assert_eq!(rest(&d), (true, true, false, 0, true));
        let g = GenerateOpts::greedy(7);
        assert_eq!((&g.sampler, g.max_tokens), (&SamplerOpts { temperature: 0.0, top_k: 1, top_p: 1.0, min_p: 0.0, ..s.clone() }, 7));
        assert_eq!(rest(&g), (true, true, false, 0, true));
        assert!(g.sampler.is_greedy() && !d.sampler.is_greedy());
        let t = GenerateOpts::greedy(3).with_temperature(0.5).with_seed(9);
        assert_eq!(t.sampler, SamplerOpts { temperature: 0.5, seed: 9, ..g.sampler.clone() });
        assert_eq!(t.max_tokens, 3);
    }

    #[test]
    fn check_bounds_top_logprobs() {
        let at = |n| GenerateOpts { top_logprobs: n, ..GenerateOpts::greedy(1) }.check();
        assert!(at(0).is_ok() && at(crate::engine::MAX_TOP_LOGPROBS).is_ok());
        let e = at(crate::engine::MAX_TOP_LOGPROBS + 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("sampler option top_logprobs is {}: expected at most {}", crate::engine::MAX_TOP_LOGPROBS + 1, crate::engine::MAX_TOP_LOGPROBS)
        );
        // The sampler's own values are checked too.
        assert!(matches!(GenerateOpts::greedy(1).with_temperature(f32::NAN).check(), Err(EngineError::Sampler { option: "temperature", .. })));
    }
}
