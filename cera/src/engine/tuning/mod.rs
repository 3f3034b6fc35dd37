//! The GPU plan builder's tuning as data: [`GpuTuning`], held in
//! [`LoadOptions::tuning`](super::LoadOptions::tuning). Its [`Default`] is the measured
//! configuration (each field says what was measured, where and when); a field set otherwise
//! changes only the speed of the decode and prefill plans, never their output, except where a
//! field says so. The `cera` CLI and `cargo xtask bench` set fields by name
//! (`--tune KEY=VALUE`, [`GpuTuning::set`], [`TUNING_KEYS`]).
//!
//! Two thresholds over a GEMV's input features (`K`) are easy to confuse and are named apart:
//! [`GpuTuning::gemv_eight_rows_min_k`] (2048: the f32 GEMV takes 8 rows per workgroup from
//! there) and [`GpuTuning::q8_wide_k`] (4096: the int8 GEMV's `q8_wide_*` overrides apply above
//! it). Only the latter is called "wide".
//!
//! Switches that make the output wrong or print to standard error are not here: they are
//! [`Diagnostics`], in a field of their own.

mod diagnostics;
mod keys;

pub use boostr::attention::DecodeKernel;
pub use diagnostics::{AblateRule, Diagnostics};
pub use keys::{DIAGNOSTIC_KEYS, TUNING_KEYS, TuningError};

use super::options::Chains;

/// A workgroup shape of an int8 GEMV whose workgroups own whole blocks of their epilogue's
/// output (`--tune` value `rows,threads,unroll,sg_rows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkgroupShape {
    /// Rows per workgroup.
    pub rows: u32,
    /// Invocations per workgroup.
    pub threads: u32,
    /// Blocks each invocation decodes per loop step.
    pub unroll: u32,
    /// Rows per subgroup at a time (0: no subgroups).
    pub subgroup_rows: u32,
}

impl WorkgroupShape {
    /// A shape of `rows` rows over `threads` invocations, unroll `unroll`, `subgroup_rows` rows
    /// per subgroup.
    pub const fn new(rows: u32, threads: u32, unroll: u32, subgroup_rows: u32) -> WorkgroupShape {
        WorkgroupShape { rows, threads, unroll, subgroup_rows }
    }
}

/// The decode plan's fusions ([`GpuTuning::decode_fusions`]); all on by default. Turning one
/// off adds the dispatch it saves, to measure what it gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeFusions {
    /// The RMSNorm inside the consuming GEMV (up to [`GpuTuning::norm_fuse_max_k`] inputs).
    pub norm: bool,
    /// The residual add inside the producing GEMV.
    pub residual: bool,
    /// The GLU inside the down projection's GEMV.
    pub glu: bool,
    /// int8 GEMVs quantize their output for the next projection in their epilogue.
    pub epilogue: bool,
    /// The decode attention's merge writes the output projection's int8 activations.
    pub attn_q8: bool,
    /// RoPE and the KV write inside the Q/K/V GEMV.
    pub rope: bool,
}

impl DecodeFusions {
    /// Every fusion.
    pub const ALL: DecodeFusions = DecodeFusions { norm: true, residual: true, glu: true, epilogue: true, attn_q8: true, rope: true };
    /// None.
    pub const NONE: DecodeFusions = DecodeFusions { norm: false, residual: false, glu: false, epilogue: false, attn_q8: false, rope: false };
}

impl Default for DecodeFusions {
    fn default() -> Self {
        DecodeFusions::ALL
    }
}

/// An override of an int8 decode GEMV's configuration (`None`: the measured default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Q8Override {
    /// Rows per workgroup.
    pub rows: Option<u32>,
    /// Invocations per workgroup.
    pub threads: Option<u32>,
    /// Blocks per invocation per loop step.
    pub unroll: Option<u32>,
}

/// The decode attention's tuning (boostr's `DecodePlanBuilder::tuning`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnTuning {
    /// Query heads per workgroup.
    pub heads: u32,
    /// Keys per invocation.
    pub keys: u32,
    /// The workgroups the split aims for.
    pub target_wgs: usize,
}

/// Which invocations of a waiting chain workgroup poll ([`numr::gpu::Poll`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ChainPoll {
    /// Every invocation.
    #[default]
    Every,
    /// Invocation 0 only.
    First,
}

/// The GPU plan builder's tuning: what the decode and prefill plans are made of, beyond the
/// model and the adapter. [`Default`] is the measured best on the H200; every field keeps the
/// measurement that chose it. `--tune` keys are [`TUNING_KEYS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTuning {
    /// The decode fusions to make (`decode_fusion` = `all`, `none` or a comma list of `norm`,
    /// `residual`, `glu`, `epilogue`, `attn_q8`, `rope`; default all).
    pub decode_fusions: DecodeFusions,
    /// The RMSNorm goes into GEMVs of at most this many input features (`norm_fuse_max_k`;
    /// default: every size).
    pub norm_fuse_max_k: usize,
    /// Activations staged in workgroup memory by the f32 GEMV's RMSNorm prologue up to this many
    /// features (`norm_stage_k`; default 0: normalised while loading, which measured faster on
    /// the H200 at every size: staging 4096 features cost llama-8b 20% of its decode speed).
    pub norm_stage_k: u32,

    /// f32 decode GEMVs over at least this many input features take 8 rows per workgroup (each
    /// activation load shared by twice the rows): +24% decode on llama-8b, neutral on
    /// llama-1b, -20% on SmolLM2's 576 (H200, README). (Not "wide": see the module docs.)
    pub gemv_eight_rows_min_k: usize,
    /// f32 decode GEMVs below [`Self::gemv_eight_rows_min_k`] with fewer input features or
    /// fewer rows than this are bound by latency, not bytes: they take two rows per workgroup
    /// (twice the workgroups of boostr's default four, each with half the work). H200, tg128,
    /// three pairs each: SmolLM2-135M (K 576) 879 -> 977 tok/s, Gemma 3 270M (K 640) 644 -> 681;
    /// with two rows everywhere Qwen3-0.6B (K 1024, 4096 and more rows) lost 577 -> 517, so its
    /// projections keep four.
    pub gemv_small: usize,
    /// Rows per workgroup of every f32 decode GEMV (`gemv_rows`; `None`: by shape, above).
    pub gemv_rows: Option<u32>,
    /// Invocations per workgroup of every f32 decode GEMV (`gemv_threads`; `None`: boostr's).
    pub gemv_threads: Option<u32>,
    /// The shape of the batched steps' decode-row GEMV (`batch_gemv` = rows,group,threads,f16).
    pub batch_gemv: BatchGemv,
    /// Batch states of at most this many sequences run their decode rows through the
    /// multi-row GEMV, larger ones through the GEMM with the prompt rows
    /// (`batch_gemv_max_seqs`; a state picks one for all its steps, so that a sequence's numbers
    /// never depend on the others). The GEMM's block shape follows each step's rows
    /// (`boostr::quant::gemm::CoopTiles::SPLIT_ROW_BANDS`; before the K split of
    /// [`GpuTuning::batch_split_k`], `ROW_BANDS`, as measured here). One decode step at depth
    /// 1024, llama-8b Q4_0, H100, 2026-12-07 (`cera bench --concurrency 8,32,64 --requests 0 --profile -d 1024
    /// --tune batch_gemv_max_seqs=64|0`): the integer-dot GEMV takes 7.3 / 21.7 / 41.2 ms at
    /// 8 / 32 / 64 sequences, the GEMM 14.5 / 19.3 / 24.7 ms. The fixed workload (`cera bench
    /// --concurrency 32,64 --kv-budget 24G`) gives 797 / 1,049 total tok/s with the GEMM at 32
    /// and 64 streams (this default) against 761 / 802 with the GEMV; llama-1b Q4_0: 2,786 /
    /// 3,575 against 2,674 / 2,957 (steps of 5.4 / 7.0 ms against 5.7 / 10.3). The GEMV stays for states
    /// of up to 16 (`cera serve`'s default `--parallel`), where few busy sequences are likely.
    pub batch_gemv_max_seqs: usize,
    /// K splits of the GEMMs of a batch state that runs every row through them (more than
    /// [`GpuTuning::batch_gemv_max_seqs`] sequences), each summed by one more dispatch
    /// (`batch_split_k` = 1 (off) to 8, or `auto`). Every row band splits K at the same
    /// elements and the sum's order is fixed, so a sequence's numbers still never depend on the
    /// others. `None` (auto): boostr's `GemmPlan::row_band_splits` for each matrix (4 for
    /// Llama-3-8B's Q/K/V, O and down projections, none for gate/up), on the coopmat GEMM only.
    /// H100, 2026-12-07 (`cera bench -m llama-8b-q4_0.gguf --concurrency 32,64 --requests 0
    /// --profile -d 1024 --tune batch_split_k=1|auto`): a decode step of 32 / 64 sequences at
    /// depth 1024 takes 22.0 / 24.7 ms unsplit, 15.1 / 18.0 ms split; the fixed workload gives
    /// 895 / 1,139 total tok/s at 32 / 64 streams (llama.cpp 343 / 366 in the same run).
    pub batch_split_k: Option<u32>,
    /// Keys per chunk of a batched row's attention (`batch_attn_split_keys` = keys, `0` for a
    /// count fixed by the state's context length, or `auto`): each row takes one chunk (one
    /// workgroup per head block, and a partial to merge) per that many of its own keys, so its
    /// count follows its own length only and its numbers never depend on the other rows.
    /// `None` (auto): 4096 keys in a plan whose rows run through the GEMM (prompt rows; every
    /// row in a state of more than [`GpuTuning::batch_gemv_max_seqs`] sequences), whose steps
    /// have rows enough to fill the GPU (H100, `cargo xtask bench --paged`: 64 decode rows at
    /// 1K keys 124 us in one chunk against 179 in 4; a 512-token prompt chunk at depth 1536
    /// 1,127 against 1,507 us); `ceil(n_ctx / 1024)` chunks for every row in the decode-row
    /// GEMV's plans (a state of few sequences).
    pub batch_attn_split_keys: Option<usize>,
    /// Such a batch state runs its decode rows in a lane of their own (`batch_lanes`), whose
    /// plan takes a verification plan's fusions (the RMSNorm and the GLU in the rows'
    /// quantizer or the f32 GEMV's prologue, the residual add in the GEMV): 10 dispatches a
    /// llama layer on the int8 path instead of 15, and a prompt chunk's rows in another lane
    /// through the GEMM. The lane has activation buffers of its own, of
    /// `BatchOpts::max_decode_rows` rows (a decode row per sequence, the drafts and 64 more,
    /// within the step's token budget). Off:
    /// every row in one plan, unfused. On by default from the dispatch counts and the
    /// verification plan's gain from the same fusions; not yet timed here.
    pub batch_lanes: bool,
    /// The shape of the batched steps' integer-dot decode-row GEMV (`batch_q8`; `None`: the
    /// f32 one), where the int8 decode path is on. The default is the best of a sweep of six
    /// shapes on the H100 (`scripts/batch-sweep.sh`; summed one-step tok/s at 1, 8 and 64
    /// sequences, depth 1024): 2 rows, groups of 4 activation rows, 64 invocations, unroll 1.
    /// The f32 GEMV it replaces took 3 ms a step for one row, this one 1 ms; at 64 rows a step
    /// went from 52 ms to 11 ms.
    pub batch_q8: Option<BatchQ8>,
    /// The same GEMV's shape in a session's speculative verification step (`verify_q8`; `None`:
    /// the f32 one): 2 rows, groups of 3 activation rows, 64 invocations, unroll 1, the best
    /// of seven shapes on the H100 (2026-12-06, `cera bench --spec-oracle 0.9 --spec-k 2,8
    /// --tune batch_q8=...`): a step of 2 / 8 drafts took 4.51 / 6.98 ms on llama-8b Q4_0
    /// against 4.62 / 7.88 with groups of 4 (9 rows then run as 4 + 4 + 1 padded to 4), 1.62 /
    /// 2.16 ms against 1.68 / 2.38 on llama-1b; more threads, unroll 2 or more rows a workgroup
    /// were slower.
    pub verify_q8: Option<BatchQ8>,

    /// Rows per workgroup of the int8 decode GEMVs, at least. Two (boostr's default takes one
    /// for most shapes) measured 331 -> 340 tok/s on llama-8b and 848 -> 860 on llama-1b (tg128,
    /// H200, 2026-12-01); 4 or 8 rows per workgroup with one row per subgroup, unroll 4 and
    /// prefetching were all slower.
    pub q8_min_rows: u32,
    /// int8 decode GEMVs of more than this many rows (Llama's gate and up packed into one
    /// matrix, the LM head) are tall: they take [`Self::q8_tall_min_rows`] rows per workgroup,
    /// and the `q8_tall_*` overrides apply to them.
    pub q8_tall_above: usize,
    /// Rows per workgroup of the tall int8 decode GEMVs, at least: with the GLU epilogue, whose
    /// arrivals and quantization each workgroup pays, four rows measured faster than two (H200,
    /// 2026-12-04: Q4_0 28672x4096 with the deferred RMSNorm and the GLU epilogue 26.4 -> 24.5 us
    /// in a dependent chain, `cargo xtask bench --kernels --only tall`; llama-8b tg128 451.8 ->
    /// 456.9 tok/s).
    pub q8_tall_min_rows: u32,
    /// int8 decode GEMVs of more than this many input features are wide: the `q8_wide_*`
    /// overrides apply to them (4096; see the module docs for the f32 GEMV's other threshold).
    pub q8_wide_k: usize,
    /// Workgroups per int8 decode GEMV at most, each taking several row groups where the matrix
    /// has more (`q8_max_wgs`; 0: one row group per workgroup).
    pub q8_max_wgs: u32,
    /// Overrides for every int8 decode GEMV (`q8_rows`, `q8_threads`, `q8_unroll`); they win
    /// over the per-class ones below.
    pub q8: Q8Override,
    /// Overrides for the wide int8 GEMVs (`q8_wide_rows`, `q8_wide_threads`, `q8_wide_unroll`).
    pub q8_wide: Q8Override,
    /// Overrides for the tall int8 GEMVs that are not wide (`q8_tall_rows`, ...).
    pub q8_tall: Q8Override,
    /// Overrides for the int8 GEMVs neither wide nor tall (`q8_small_rows`, ...).
    pub q8_small: Q8Override,
    /// Rows per subgroup of every int8 decode GEMV (`q8_sg_rows`; `None`: boostr's).
    pub q8_subgroup_rows: Option<u32>,
    /// Whether the int8 decode GEMVs prefetch their next block (`q8_prefetch` = 0 or 1;
    /// `None`: boostr's).
    pub q8_prefetch: Option<bool>,

    /// The workgroup shape of a decode GLU producer whose workgroups own whole blocks (boostr's
    /// `Q8Epilogue::GluLocal`: no arrival counter, no `@coherent` storage); `None`: the
    /// arrival-counter epilogue (`Q8Epilogue::Glu`). `glu_local` = `off` or
    /// `rows,threads,unroll,sg_rows`. Measured on the H200 (2026-12-04, `cargo xtask bench
    /// --kernels --only tall`, Q4_0 28672x4096 with the deferred RMSNorm in a dependent chain):
    /// 24.3 us with arrivals at four rows per workgroup, 22.1 us at 64 rows over 512 invocations
    /// (sixteen subgroups of two rows at a time, unroll 1); tg128 llama-8b 459.8 -> 480.5 tok/s,
    /// llama-1b 1,382.6 -> 1,396.5. The other 25 local shapes of the sweep were slower
    /// (23.1-60.9 us), some slower than the arrivals.
    pub glu_local: Option<WorkgroupShape>,
    /// Inputs up to which a residual GEMV takes [`Self::norm_local_small`], beyond which
    /// [`Self::norm_local_wide`]. Wider ones (Llama's down, 14336 or 8192 inputs) keep the
    /// arrival counters: 480.2 -> 475.1 tok/s on llama-8b with the down projection local too.
    pub norm_local_max_k: usize,
    /// The workgroup shape of a decode GEMV of at most [`Self::norm_local_max_k`] inputs adding
    /// into the residual stream (the O projection; the down projection of an FFN of at most
    /// 4096) whose workgroups own whole blocks of the next RMSNorm's int8 input (boostr's
    /// `Q8Epilogue::QuantizeLocal`): 32 rows, one per subgroup of a 1024-wide workgroup
    /// (`norm_local_small`; `norm_local` sets both classes). Measured on the H200 (2026-12-04,
    /// tg128, medians of 3): llama-8b 480.2 -> 483.8 tok/s, llama-1b 1,407.7-1,410.3 ->
    /// 1,438.6-1,439.0; with 2 rows per subgroup over 512 invocations, 4 over 256, unroll 2, or
    /// 64 rows, slower (359-463 on llama-8b, O and down together).
    pub norm_local_small: Option<WorkgroupShape>,
    /// The same for residual GEMVs of more than [`Self::norm_local_max_k`] inputs
    /// (`norm_local_wide`; default `None`: arrival counters).
    pub norm_local_wide: Option<WorkgroupShape>,

    /// The decode attention's tuning (`attn_tuning` = `heads,keys,target_wgs`; `None`: boostr's
    /// choice per shape).
    pub attn_tuning: Option<AttnTuning>,
    /// Decode attention steps over at most this many positions run one split per query head
    /// (`attn_single_kv`; 0: never; `None`: boostr's `DECODE_SINGLE_KV`).
    pub attn_single_kv: Option<u32>,
    /// The prefill attention kernel (`prefill_attn` = `coop`, `subgroup`, `tiled` or `auto`;
    /// `None`: the best the adapter and the cache allow).
    pub prefill_attn: Option<DecodeKernel>,

    /// Whether the GEMMs of prefill and batched steps read their activations as f16, rounded
    /// once per projection by boostr's `HalfRowsPlan` into a scratch the plan's GEMMs share
    /// (`gemm_f16_input` = 0, 1 or `auto`). `None` (auto): where the coopmat GEMM runs, which
    /// rounds f32 activations the same way as it stages them, so the results are the same bits
    /// and only the bytes read change (two a value instead of four, in every column block).
    /// `Some(true)` also rounds them for the tiled GEMM (wherever the adapter has shader-f16),
    /// whose results then change by the rounding; `Some(false)`: never, the default: on the
    /// H200 (2026-12-07, `bash scripts/h200.sh f16`) the coopmat GEMM itself is slower on f16
    /// input at every block shape (llama-8b's 512-row projections at 128x128x64: 119-137
    /// against 158-166 TFLOP/s), and llama-8b Q4_0 prefills 8,181 / 7,634 tok/s at pp512 /
    /// pp2048 with it against 10,452 / 9,586 without; a 64-sequence decode step takes 31.5
    /// against 26.0 ms.
    pub gemm_f16_input: Option<bool>,
    /// Whether a prefill's Q/K/V GEMM of few coopmat blocks is split over K into two partial
    /// sums that the RoPE kernel after it adds (`prefill_split_k` = 1: off, 2: on).
    pub prefill_split_k: bool,
    /// A prefill's Q/K/V GEMM of at most this many coopmat blocks is split over K (Llama-3-8B's
    /// 192 blocks on the H200's 132 compute units leave the GPU unevenly filled).
    pub qkv_split_max_blocks: usize,
    /// Dispatches of a prefill chunk submitted first; each further submit takes twice the one
    /// before, the last one the rest with the step's tail (`prefill_lead`; 0 submits a chunk at
    /// once). Encoding costs the host about 4 us per dispatch on the H200, a prompt's dispatch
    /// runs 20 us or more, so each submit is encoded while the GPU runs the one before and the
    /// GPU waits only for the first.
    pub prefill_lead: usize,
    /// A batched step of a model split across devices runs in micro-batches of at least this
    /// many tokens, one device per micro-batch at once (`split_micro_tokens`; 0: off). Each
    /// micro-batch reads the device's weights again, so only steps whose GEMMs are bound by
    /// arithmetic gain: a decode-only step of 64 sequences stays one batch. Chosen, not
    /// measured: no machine with two GPUs has been lent.
    pub split_micro_tokens: usize,

    /// Whether the decode step runs each layer's dependent dispatches as chains
    /// (`chain` = `auto`, `on`, `off`, `all` (= `on`) or a comma list of kernel-name prefixes,
    /// which sets `on` and [`Self::chain_kernels`]).
    pub chains: Chains,
    /// Kernel-name prefixes a chain stage must start with (for example `quant_gemv_q8`;
    /// empty: every kernel).
    pub chain_kernels: Vec<String>,
    /// Layers per chain (`chain_layers`; at least 1). One layer per chain gives every chain
    /// of a model with identical layers the same WGSL (one pipeline).
    pub chain_layers: usize,
    /// Stages per chain at most (`chain_max`; `None`: no limit).
    pub chain_max: Option<usize>,
    /// Which invocations of a waiting workgroup poll (`chain_poll` = `every` or `first`).
    pub chain_poll: ChainPoll,
}

/// The shape of the decode-row GEMV of batched steps (boostr's `QuantGemv` with `step_rows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchGemv {
    /// Weight rows per workgroup.
    pub rows: u32,
    /// Activation rows per pass of the workgroup's loop over the step's decode rows.
    pub group: u32,
    /// Invocations per workgroup.
    pub threads: u32,
    /// f16 products (f32 sums) where the adapter has f16.
    pub f16: bool,
}

impl BatchGemv {
    /// The default shape.
    pub const DEFAULT: BatchGemv = BatchGemv { rows: 2, group: 4, threads: 128, f16: false };
}

/// The shape of the integer-dot decode-row GEMV of batched steps (boostr's `QuantGemvQ8`
/// with `step_rows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchQ8 {
    /// Weight rows per workgroup.
    pub rows: u32,
    /// Activation rows per pass of the workgroup's loop over the step's decode rows.
    pub group: u32,
    /// Invocations per workgroup.
    pub threads: u32,
    /// Chunks of 32 per invocation per step.
    pub unroll: u32,
}

impl BatchQ8 {
    /// The default shape.
    pub const DEFAULT: BatchQ8 = BatchQ8 { rows: 2, group: 4, threads: 64, unroll: 1 };
    /// The default shape of a verification step's rows (`GpuTuning::verify_q8`).
    pub const VERIFY: BatchQ8 = BatchQ8 { rows: 2, group: 3, threads: 64, unroll: 1 };
}

impl Default for GpuTuning {
    fn default() -> Self {
        GpuTuning {
            decode_fusions: DecodeFusions::ALL,
            norm_fuse_max_k: usize::MAX,
            norm_stage_k: 0,
            gemv_eight_rows_min_k: 2048,
            gemv_small: 1024,
            gemv_rows: None,
            gemv_threads: None,
            batch_gemv: BatchGemv::DEFAULT,
            batch_gemv_max_seqs: 16,
            batch_split_k: None,
            batch_attn_split_keys: None,
            batch_lanes: true,
            batch_q8: Some(BatchQ8::DEFAULT),
            verify_q8: Some(BatchQ8::VERIFY),
            q8_min_rows: 2,
            q8_tall_above: 8192,
            q8_tall_min_rows: 4,
            q8_wide_k: 4096,
            q8_max_wgs: 0,
            q8: Q8Override::default(),
            q8_wide: Q8Override::default(),
            q8_tall: Q8Override::default(),
            q8_small: Q8Override::default(),
            q8_subgroup_rows: None,
            q8_prefetch: None,
            glu_local: Some(WorkgroupShape::new(64, 512, 1, 2)),
            norm_local_max_k: 4096,
            norm_local_small: Some(WorkgroupShape::new(32, 1024, 1, 1)),
            norm_local_wide: None,
            attn_tuning: None,
            attn_single_kv: None,
            prefill_attn: None,
            gemm_f16_input: Some(false),
            prefill_split_k: true,
            qkv_split_max_blocks: 256,
            prefill_lead: 16,
            split_micro_tokens: 256,
            chains: Chains::Auto,
            chain_kernels: Vec::new(),
            chain_layers: 1,
            chain_max: None,
            chain_poll: ChainPoll::Every,
        }
    }
}

#[cfg(test)]
mod tests;
