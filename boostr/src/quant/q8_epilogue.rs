//! [`Q8Epilogue`]: an integer-dot GEMV ([`super::QuantGemvQ8`]) that also quantizes its own
//! output to int8 for the next projection, so a decode step needs no quantizer dispatch between
//! two GEMVs.
//!
//! A block of 32 activations is quantized from all of its values at once, and the GEMV's
//! workgroups each produce one or two output rows, so the block is finished by whichever
//! workgroup completes it last:
//! 1. each workgroup stores its rows (`y`), runs `storageBarrier()`, and one invocation adds the
//!    number of rows it stored to the block's arrival counter (`cnt`, `atomicAdd`, relaxed,
//!    device scope);
//! 2. the workgroup whose addition completes the block (32 rows; 64 for the GLU, 32 of the gate
//!    and 32 of the up half) runs `storageBarrier()` again, resets the counter for the next
//!    dispatch, and quantizes the block from `y` into the consumer's `oq`/`os`
//!    (the layout of [`super::Q8Activations`]): eight of its invocations load a `vec4` of the
//!    block each and pack their own word, sharing the block's maximum through workgroup memory,
//!    so the block costs one round trip to `y` instead of one invocation's 32 (or 64) loads
//!    in a row. That is the tail every such GEMV ends on: on the H200 it took Llama-3-8B's
//!    gate/up GEMV with the GLU epilogue from 27.4 to 26.4 us in a dependent chain (20.1 without
//!    the epilogue) and llama-8b tg128 from 421 to 436-452 tok/s.
//!
//! The memory-model argument is the attention's fused merge
//! ([`crate::attention::DecodeAttnSg`]): naga lowers `storageBarrier()` to a workgroup execution
//! barrier with device-scope acquire-release semantics over storage memory, the counter's
//! read-modify-write chain makes every earlier arrival's release synchronize with the last
//! arrival's acquire, and `y` is declared `@coherent` (so needs `env.coherent`), so every row the
//! block's workgroups stored is visible to the one that quantizes it. Nothing waits on another
//! workgroup, so there is no forward-progress assumption; rows are spread over consecutive
//! workgroups, so the quantization is spread over the dispatch instead of serialised at its end.
//!
//! Four forms:
//! - [`Q8Epilogue::Quantize`]: the block's values, times the norm weight `nw` when `norm` (the
//!   RMSNorm of the residual stream an accumulating GEMV has just updated), with the block's
//!   `sum(y^2)` in `xs.w`: the RMSNorm's `1 / rms` is left to the consumer
//!   ([`super::QuantGemvQ8::rms_scale`], see [`super::DeferredRmsQuantizeQ8`] for why the codes
//!   do not depend on it).
//! - [`Q8Epilogue::Glu`]: the output rows are `[gate | up]` (`p.epf` rows each); block `j`
//!   quantizes `act(gate) * up` of rows `32 j ..`, the input of the FFN's down projection.
//!
//! - [`Q8Epilogue::QuantizeLocal`]: the same without arrivals, for workgroups that own whole
//!   blocks of 32 rows: each keeps the values it stored (the sums, when it accumulates) in
//!   workgroup memory and quantizes its blocks from there (on the H200: the O projection at 32
//!   rows, one per subgroup of 1024 invocations, took llama-8b tg128 from 480.2 to 483.8 tok/s
//!   and llama-1b from 1,408 to 1,439; Llama-3-8B's down projection, 14336 inputs, was slower).
//! - [`Q8Epilogue::GluLocal`]: the GLU without arrivals. Each workgroup owns whole blocks: its
//!   `rows_per_workgroup` (a multiple of 64) are the gate rows of outputs `row0 / 2 ..` and the
//!   up rows of the same outputs, so it reduces them into workgroup memory (`gl_v`) and
//!   quantizes its blocks there, with no counter, no `storageBarrier` and no `@coherent`
//!   storage. The cost of the arrivals is every workgroup's fence and atomic round trip, which
//!   keeps it resident longer: on the H200 Llama-3-8B's gate/up took 24.3 us with arrivals
//!   (four rows per workgroup) and 22.1 us with 64 rows over 512 invocations (sixteen subgroups
//!   of two rows at a time), and llama-8b tg128 went from 459.8 to 480.5 tok/s.
//!
//! Limits (checked by [`super::Q8GemvPlan::with_epilogue`]): one activation row, one part, a
//! plain output; with arrivals, rows per workgroup dividing 32; workgroup-local, rows per
//! workgroup a multiple of the block's rows (32, or 64 for the GLU) that divides the rows.

use numr::gpu::{Access, KernelBuilder};

use crate::act::ActKind;

/// What a GEMV writes besides its output (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Q8Epilogue {
    /// Nothing.
    None,
    /// Quantize the output rows in blocks of 32 (times the norm weight with `norm`, by `1 + w`
    /// with `gemma`), with each block's `sum(y^2)` for a consumer that applies `1 / rms`.
    Quantize {
        /// Multiply by a norm weight (binding `nw`) before quantizing.
        norm: bool,
        /// Gemma's weight offset: `1 + w`.
        gemma: bool,
    },
    /// Quantize `act(gate) * up` of the `[gate | up]` output rows.
    Glu {
        /// The gate's nonlinearity.
        act: ActKind,
    },
    /// [`Q8Epilogue::Quantize`] with no arrival counter: each workgroup owns whole blocks (its
    /// `rows_per_workgroup` a multiple of 32) and quantizes them from workgroup memory as soon
    /// as it has stored them (with `accumulate`, the sums it stored).
    QuantizeLocal {
        /// Multiply by a norm weight (binding `nw`) before quantizing.
        norm: bool,
        /// Gemma's weight offset: `1 + w`.
        gemma: bool,
    },
    /// [`Q8Epilogue::Glu`] with no arrival counter: each workgroup owns whole blocks, the first
    /// half of its `rows_per_workgroup` (a multiple of 64) gate rows and the second half the up
    /// rows of the same outputs, and quantizes them from workgroup memory as soon as it has
    /// reduced them. No coherent storage, no atomics, nothing waits for another workgroup.
    GluLocal {
        /// The gate's nonlinearity.
        act: ActKind,
    },
}

impl Q8Epilogue {
    /// Invocations that quantize a block together (one `vec4` of its 32 values each): the
    /// workgroup needs at least this many.
    pub const QUANT_LANES: u32 = 8;

    /// True unless [`Q8Epilogue::None`].
    pub fn is_some(&self) -> bool {
        *self != Q8Epilogue::None
    }

    /// Output rows that make one quantized block.
    pub fn block_rows(&self) -> u32 {
        match self {
            Q8Epilogue::Glu { .. } | Q8Epilogue::GluLocal { .. } => 64,
            _ => 32,
        }
    }

    /// Whether the epilogue quantizes `act(gate) * up` (the output is half the rows).
    pub fn is_glu(&self) -> bool {
        matches!(self, Q8Epilogue::Glu { .. } | Q8Epilogue::GluLocal { .. })
    }

    /// Whether blocks are finished by the last workgroup to arrive (an arrival counter and
    /// `@coherent` storage), rather than inside the workgroup that owns them.
    pub fn uses_arrivals(&self) -> bool {
        matches!(self, Q8Epilogue::Quantize { .. } | Q8Epilogue::Glu { .. })
    }

    /// Whether each workgroup owns whole blocks and quantizes them itself (the `*Local` forms).
    pub fn is_local(&self) -> bool {
        matches!(self, Q8Epilogue::QuantizeLocal { .. } | Q8Epilogue::GluLocal { .. })
    }

    /// Whether the norm weight is bound.
    pub(crate) fn has_norm(&self) -> bool {
        matches!(self, Q8Epilogue::Quantize { norm: true, .. } | Q8Epilogue::QuantizeLocal { norm: true, .. })
    }

    /// A suffix for the kernel name.
    pub(crate) fn name(&self) -> String {
        match self {
            Q8Epilogue::None => String::new(),
            Q8Epilogue::Quantize { norm, gemma } => format!("_epq{}{}", if *norm { "n" } else { "" }, if *gemma { "g" } else { "" }),
            Q8Epilogue::QuantizeLocal { norm, gemma } => format!("_epql{}{}", if *norm { "n" } else { "" }, if *gemma { "g" } else { "" }),
            Q8Epilogue::Glu { act } => format!("_epglu_{}", act.name()),
            Q8Epilogue::GluLocal { act } => format!("_epglul_{}", act.name()),
        }
    }

    /// Storage bindings the epilogue adds after `y`.
    pub(crate) fn extra_bindings(&self) -> usize {
        match self {
            Q8Epilogue::None => 0,
            // oq, os; the counter with arrivals; the norm weight.
            _ => 2 + usize::from(self.uses_arrivals()) + usize::from(self.has_norm()),
        }
    }

    /// Declares the epilogue's bindings (`cnt` with arrivals, `oq`, `os`, and `nw` with a
    /// norm), after `y`.
    pub(crate) fn bind(&self, kb: KernelBuilder) -> KernelBuilder {
        if !self.is_some() {
            return kb;
        }
        let kb = if self.uses_arrivals() { kb.storage("cnt", Access::ReadWrite, "array<atomic<u32>>") } else { kb };
        let kb = kb.storage("oq", Access::ReadWrite, "array<vec4<u32>>").storage("os", Access::ReadWrite, "array<vec4<f32>>");
        if self.has_norm() { kb.storage("nw", Access::Read, "array<f32>") } else { kb }
    }

    /// WGSL functions and workgroup variables: `ep_quant(b, o0, l)`, called by every invocation
    /// `l` of the workgroup in uniform control flow, quantizes block `b` from the values at `o0`
    /// (in `y` for the arrival forms, in the workgroup's own `gl_v` of `rows` values for the
    /// local forms): invocations `0..8` each
    /// load and scale one `vec4` of the block (one round trip for the whole block), then share
    /// the block's `max |v|` and `sum(y^2)` through workgroup memory and pack their own word;
    /// invocation 0 stores the block. The arithmetic and its order are those of
    /// `quant_block` (module `q8_activations`), so the codes and scales match the standalone
    /// quantizers bit for bit.
    pub(crate) fn prelude(&self, rows: u32) -> String {
        let load = |base: &str| format!("vec4<f32>(y[{base}], y[{base} + 1u], y[{base} + 2u], y[{base} + 3u])");
        let glu = |act: &ActKind, g: String, u: String| {
            (
                format!("{}{}", crate::ops_common::SAFE_TANH, act.wgsl()),
                format!(
                    "        let g = {g};
        v = vec4<f32>(act(g.x), act(g.y), act(g.z), act(g.w)) * {u};
"
                ),
            )
        };
        let gl = |e: String| e.replace("y[", "gl_v[");
        let (pre, value) = match self {
            Q8Epilogue::None => return String::new(),
            Q8Epilogue::Quantize { norm, gemma } | Q8Epilogue::QuantizeLocal { norm, gemma } => {
                let w = load("ob").replace("y[", "nw[");
                let scale = match (norm, gemma) {
                    (false, _) => String::new(),
                    (true, false) => format!(" * {w}"),
                    (true, true) => format!(" * (vec4<f32>(1.0) + {w})"),
                };
                (
                    String::new(),
                    format!(
                        "        let xv = {};
        ss = dot(xv, xv);
        v = xv{scale};
",
                        if self.is_local() { gl(load("o")) } else { load("o") }
                    ),
                )
            }
            Q8Epilogue::Glu { act } => glu(act, load("o"), load("(p.epf + o)")),
            Q8Epilogue::GluLocal { act } => glu(act, gl(load("o")), gl(load(&format!("({}u + o)", rows / 2)))),
        };
        let pre = if self.is_local() { format!("var<workgroup> gl_v: array<f32, {rows}>;\n{pre}") } else { pre };
        format!(
            "var<workgroup> ep_last: u32;
var<workgroup> ep_red: array<vec2<f32>, 8>;
var<workgroup> ep_word: array<vec2<u32>, 8>;
{pre}fn ep_round_away4(t: vec4<f32>) -> vec4<f32> {{
    let tr = trunc(t);
    return select(round(t), tr + sign(t), abs(t - tr) == vec4<f32>(0.5));
}}
fn ep_quant(b: u32, o0: u32, l: u32) {{
    var v = vec4<f32>(0.0);
    var ss = 0.0;
    if (l < 8u) {{
        let o = o0 + l * 4u;
        let ob = b * 32u + l * 4u;
{value}        let a = abs(v);
        ep_red[l] = vec2<f32>(max(max(a.x, a.y), max(a.z, a.w)), ss);
    }}
    workgroupBarrier();
    var am = 0.0;
    var sst = 0.0;
    if (l < 8u) {{
        for (var i = 0u; i < 8u; i++) {{
            am = max(am, ep_red[i].x);
            sst += ep_red[i].y;
        }}
        let inv = select(0.0, 127.0 / am, am > 0.0);
        let q = vec4<i32>(ep_round_away4(v * inv));
        ep_word[l] = vec2<u32>(pack4xI8(q), bitcast<u32>(q.x + q.y + q.z + q.w));
    }}
    workgroupBarrier();
    if (l == 0u) {{
        var lo = 0i;
        var hi = 0i;
        for (var i = 0u; i < 4u; i++) {{
            lo += bitcast<i32>(ep_word[i].y);
            hi += bitcast<i32>(ep_word[i + 4u].y);
        }}
        oq[b * 2u] = vec4<u32>(ep_word[0].x, ep_word[1].x, ep_word[2].x, ep_word[3].x);
        oq[b * 2u + 1u] = vec4<u32>(ep_word[4].x, ep_word[5].x, ep_word[6].x, ep_word[7].x);
        let d = am / 127.0;
        os[b] = vec4<f32>(d, d * f32(lo), d * f32(hi), sst);
    }}
}}
"
        )
    }

    /// The WGSL run after the workgroup's stores, in uniform control flow: `first` is the
    /// workgroup's first output row, `n` how many rows it stored (both `u32` expressions),
    /// `rows` its rows per workgroup. The local forms expect the workgroup's stored values in
    /// `gl_v` (local row `j` at `gl_v[j]`).
    pub(crate) fn body(&self, first: &str, n: &str, rows: u32) -> String {
        if !self.is_some() {
            return String::new();
        }
        if self.is_local() {
            return format!(
                "    // Epilogue: the workgroup's own blocks, from workgroup memory (module q8_epilogue).
    workgroupBarrier();
    for (var bi = 0u; bi < {nb}u; bi++) {{
        ep_quant(({first}) / {br}u + bi, bi * 32u, lidx);
        workgroupBarrier(); // ep_red / ep_word are reused by the next block
    }}
",
                nb = rows / self.block_rows(),
                br = self.block_rows()
            );
        }
        let block = match self {
            Q8Epilogue::Glu { .. } => "select(g, g - p.epf, g >= p.epf) / 32u",
            _ => "g / 32u",
        };
        format!(
            "    // Epilogue: the workgroup completing a block quantizes it (module q8_epilogue).
    storageBarrier();
    if (lidx == 0u) {{
        let g = {first};
        let n = {n};
        let blk = {block};
        ep_last = select(0u, blk + 1u, atomicAdd(&cnt[blk], n) + n == {}u);
    }}
    let ep = workgroupUniformLoad(&ep_last);
    if (ep != 0u) {{
        storageBarrier();
        if (lidx == 0u) {{
            atomicStore(&cnt[ep - 1u], 0u);
        }}
        ep_quant(ep - 1u, (ep - 1u) * 32u, lidx);
    }}
",
            self.block_rows()
        )
    }
}
