//! The subgroup flash-decoding kernel.
//!
//! # [`DecodeAttnSg`]
//! One workgroup of [`DECODE_SG_WG`] invocations handles one split (a range of positions) of one
//! KV head for `heads` of the query heads that share it. Eight lanes (of one subgroup) form a
//! *slot* that owns one key at a time: lane `c` holds the values `8(c + 8j) .. 8(c + 8j) + 8`
//! (`j < head_dim / 64`) of every query head in registers, loads the same values of the key's K
//! and V rows (16-byte loads of packed f16, the eight lanes reading one contiguous row), dots them
//! with the queries and sums the dot across the eight lanes with three `subgroupShuffleXor`.
//! Each slot runs its own online softmax in registers over `KEYS_PER_STEP` keys per step; the
//! workgroup's 16 slots merge once at the end through workgroup memory. Nothing in the key loop
//! touches workgroup memory or barriers, and every K/V byte is read once per workgroup.
//!
//! Slots are made from the subgroup builtins only: slot `sg_idx * (sg_size / 8) + sg_id / 8`,
//! lane `sg_id % 8` (never `lidx / sg_size`, which neither WGSL nor Vulkan ties to the subgroup
//! index). That is a bijection onto the 16 slots when the workgroup's subgroups are full
//! (`sg_count * sg_size == 128`, which every driver we know gives a 128-wide workgroup with
//! subgroups of 8..=128); a workgroup whose subgroups are not writes NaN (never a silently wrong
//! value), and every slot index is clamped so workgroup memory stays in bounds regardless.
//!
//! # Bounds invariant (the plans compile this kernel without runtime checks)
//! - K/V: key positions are clamped into `seg_start .. min(split end, seg_start + seg_len)`
//!   before the row is formed (`rowb + min(p, hi - 1) - seg_start`, and the loop runs only when
//!   `hi > lo >= seg_start`), `kvh < n_kv` (grid y is `n_kv * group / heads`), and lane `c < 8`
//!   reads vec4 `c + 8j < head_dim / 8` of the row: inside the segment's `[n_kv][seg_len][row]`.
//! - q: reads `q_off + tok * tok_stride + n_q * head_dim` f32 at most (`tok < n_tok`); the plan
//!   checks the binding holds that for its largest step.
//! - o_part / ml: row `(split * rows + row)` with `split = split_base + wid.x` below the split
//!   count the plan sized the buffers for (at build, for the largest `kv_len`), `row < rows`;
//!   normalised: `o_base + row * head_dim / 4 + i` inside the output binding (checked).
//! - fused: `cnt[wid.y]` (one counter per grid row), `out[out_off + row * head_dim + ..]`
//!   (checked), merge reads of splits `< p.splits <=` [`DECODE_SG_WG`] (the plan caps it).
//!
//! # The fused merge and the memory model
//! Each workgroup stores its partial (`o_part`, `ml`), then `storageBarrier()`, then one
//! invocation bumps the row's arrival counter (`atomicAdd`, relaxed, device scope); the workgroup
//! that sees `splits - 1` runs `storageBarrier()` again and reads every split's partial. naga
//! lowers `storageBarrier()` to `OpControlBarrier(Workgroup, Device, AcquireRelease |
//! UniformMemory)`: a workgroup-wide execution barrier that is also a device-scope release (before
//! the counter) and acquire (after it) fence over storage-buffer memory. The counter's RMW chain
//! makes each earlier arrival's release fence synchronize with the last arrival's acquire fence
//! (fence-fence synchronization through an atomic, SPIR-V / Vulkan memory model), so every
//! partial store happens-before the merge's loads. The module uses the GLSL450 memory model, in
//! which stores and loads are only guaranteed to reach or see device-coherent memory when the
//! variable is `Coherent`: the fused variant therefore declares `o_part`, `ml` and `out`
//! `@coherent` and needs `env.coherent` ([`super::fused_merge_supported`]; plans without it merge
//! in a second dispatch, ordered by the barrier wgpu puts between dispatches). Limits: the
//! argument covers workgroups of one dispatch on one queue; nothing waits on another workgroup
//! (no forward-progress assumption); the counter is reset by the last arrival and read again only
//! by a later dispatch (ordered by the inter-dispatch barrier).

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::*;

#[path = "decode_wgsl.rs"]
mod wgsl;
use wgsl::SgWgsl;

/// Invocations per subgroup decode workgroup.
pub const DECODE_SG_WG: u32 = 128;
/// Lanes per slot (one key at a time per slot).
const SLOT: u32 = 8;
/// Keys a slot takes per step by default (their loads are all issued before any math).
pub const KEYS_PER_STEP: u32 = 2;
/// Keys per slot step the decode plans use (1 token: 4 measured ~1 us better than 2 at 32K on
/// the H200 with the fused merge; prefill keeps [`KEYS_PER_STEP`]).
pub const DECODE_KEYS_PER_STEP: u32 = 4;

/// Variant of the subgroup decode kernel (needs subgroups of at least 8 invocations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeAttnSg {
    /// Elements per head: 64, 128 or 256.
    pub head_dim: u32,
    /// Query heads per KV head.
    pub group: u32,
    /// Query heads per workgroup (divides `group`); the others go to sibling workgroups.
    pub heads: u32,
    /// Element type of the KV cache.
    pub dtype: KvDtype,
    /// Apply logit soft-capping (`cap * tanh(s / cap)`, the cap a parameter).
    pub softcap: bool,
    /// Keys a slot takes per step (1..=4).
    pub keys: u32,
    /// Write the normalised output (`[n_tok][n_q][head_dim]` f32 in the `o_part` binding) instead
    /// of a partial: for a single split over an unsegmented cache.
    pub normalised: bool,
    /// Merge the splits in the same dispatch (partials only, one query token): each workgroup
    /// writes its partial, then bumps a per-(KV head, head block) counter in `cnt`; the last one
    /// to arrive merges all splits of its heads into `out` and resets the counter to 0 (at most
    /// [`DECODE_SG_WG`] splits: one invocation per split computes the merge weights).
    pub fused: bool,
    /// With `fused` (or `normalised`: a single split): the merge also writes its output
    /// quantized to int8 per block of 32
    /// (`xq`/`xs`, the layout of [`crate::quant::Q8Activations`], block `out index / 32`), the
    /// input of an integer-dot output projection, so no quantizer dispatch runs between them.
    pub quantize: bool,
    /// Read K/V through block tables ([`crate::paged`]): bindings `tokinfo` and `tables` follow
    /// `ml`; token `wid.z` takes its table offset and position from `tokinfo` (or, with
    /// `step_mode = 1`, offset 0 and `q_pos + wid.z`), and its keys are cut into `splits` chunks
    /// of whole workgroup steps. Not with `fused` or `quantize`.
    pub paged: bool,
}

impl DecodeAttnSg {
    /// The variant for a shape: as many heads per workgroup as keep about 64 floats of queries
    /// and accumulators per lane (more heads per workgroup re-read K/V less but hold more
    /// registers, so fewer workgroups fit; measured best on the H200 at head_dim 128: 2 heads,
    /// 2 keys per step).
    /// Typed error for a head_dim other than 64, 128, 256 or a group outside 1..=16.
    pub fn new(head_dim: u32, group: u32, dtype: KvDtype, softcap: bool) -> Result<Self> {
        check_head_dim("DecodeAttnSg", head_dim)?;
        if !(1..=16).contains(&group) {
            return Err(OpsError::Unsupported { what: "DecodeAttnSg", reason: format!("group {group} (1..=16)") });
        }
        let nv = head_dim / 64;
        let mut heads = (4 / nv).clamp(1, group);
        while !group.is_multiple_of(heads) {
            heads -= 1;
        }
        Ok(DecodeAttnSg { head_dim, group, heads, dtype, softcap, keys: KEYS_PER_STEP, normalised: false, fused: false, quantize: false, paged: false })
    }

    /// Checks the variant (every field; [`Self::source`] calls it): head_dim 64, 128 or 256,
    /// group 1..=16, heads dividing group, keys 1..=4, not both normalised and fused.
    pub fn validate(&self) -> Result<()> {
        check_head_dim("DecodeAttnSg", self.head_dim)?;
        let bad = |reason: String| Err(OpsError::Unsupported { what: "DecodeAttnSg", reason });
        if !(1..=16).contains(&self.group) || self.heads == 0 || !self.group.is_multiple_of(self.heads) {
            return bad(format!("group {} (1..=16), heads {} (must divide it)", self.group, self.heads));
        }
        if !(1..=4).contains(&self.keys) {
            return bad(format!("keys {} (1..=4)", self.keys));
        }
        if self.normalised && self.fused {
            return bad("normalised and fused together".into());
        }
        if self.paged && (self.fused || self.quantize) {
            return bad("a paged variant with the fused merge or a quantized output".into());
        }
        if self.quantize && !self.fused && !self.normalised {
            return bad("a quantized output needs the fused merge or the normalised output".into());
        }
        Ok(())
    }

    /// Positions one workgroup step covers (splits are multiples of it).
    pub fn step_keys(&self) -> u32 {
        DECODE_SG_WG / SLOT * self.keys
    }

    /// The variants the tests validate with naga: every supported head_dim, group (up to 4, then
    /// multiples of 4), dtype and softcap as [`Self::new`] picks them, each partial, normalised
    /// and fused, plus a few other head/key splits.
    pub fn all() -> Vec<DecodeAttnSg> {
        let mut v = Vec::new();
        for head_dim in [64, 128, 256] {
            for group in 1..=16 {
                for dtype in [KvDtype::F16, KvDtype::Q8_0] {
                    for softcap in [false, true] {
                        let Ok(c) = DecodeAttnSg::new(head_dim, group, dtype, softcap) else { continue };
                        if !v.contains(&c) && (group <= 4 || group.is_multiple_of(4)) {
                            v.push(c);
                            v.push(DecodeAttnSg { normalised: true, ..c });
                            v.push(DecodeAttnSg { fused: true, ..c });
                            v.push(DecodeAttnSg { fused: true, keys: DECODE_KEYS_PER_STEP, ..c });
                            v.push(DecodeAttnSg { fused: true, quantize: true, keys: DECODE_KEYS_PER_STEP, ..c });
                            v.push(DecodeAttnSg { normalised: true, quantize: true, heads: 1, keys: DECODE_KEYS_PER_STEP, ..c });
                            v.push(DecodeAttnSg { paged: true, ..c });
                            v.push(DecodeAttnSg { paged: true, normalised: true, ..c });
                            if group == 4 && !softcap {
                                v.push(DecodeAttnSg { heads: 2, keys: 1, ..c });
                                v.push(DecodeAttnSg { heads: 1, keys: 4, ..c });
                            }
                        }
                    }
                }
            }
        }
        v
    }

    /// WGSL. Bindings `q`, `kc`, `vc`, `o_part` (rw, vec4 rows), `ml` (rw); fused: `cnt` (rw,
    /// atomic), `out` (rw). Grid `[splits, n_kv * group / heads, n_tok]`: query token `t` (at
    /// `q_off + t * tok_stride`) sits at position `q_pos + t` and sees keys `..= q_pos + t`
    /// (decode: one token; prefill: a chunk, the longest rows scheduled first).
    ///
    /// Typed errors: an invalid variant ([`Self::validate`]), an environment without subgroups of
    /// at least 8, a fused variant without `env.coherent`. The module is checked (naga bounds
    /// checks); plans that validated their bindings compile it unchecked (see the module docs).
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        self.validate()?;
        if DecodeKernel::best(env) != DecodeKernel::Subgroup {
            return Err(OpsError::Unsupported { what: "DecodeAttnSg", reason: "needs subgroups of at least 8 invocations".into() });
        }
        if self.fused && !env.coherent {
            return Err(OpsError::Unsupported { what: "DecodeAttnSg fused merge", reason: "needs @coherent storage (MEMORY_DECORATION_COHERENT)".into() });
        }
        let g = SgWgsl::new(self);
        let mut kb = KernelBuilder::new(g.name(), *env)
            .workgroup(DECODE_SG_WG, 1, 1)
            .subgroup_builtins()
            .storage("q", Access::Read, "array<f32>")
            .storage("kc", Access::Read, cache_ty(self.dtype))
            .storage("vc", Access::Read, cache_ty(self.dtype));
        // The fused merge reads other workgroups' partials: coherent storage (module docs).
        kb = if self.fused {
            kb.storage_coherent("o_part", "array<vec4<f32>>").storage_coherent("ml", "array<f32>")
        } else {
            kb.storage("o_part", Access::ReadWrite, "array<vec4<f32>>").storage("ml", Access::ReadWrite, "array<f32>")
        };
        let mut params =
            vec!["q_pos", "seg_start", "seg_len", "chunk", "split_base", "q_off", "rows", "scale", "softcap", "window", "tok_stride", "n_tok", "n_q"];
        if self.normalised {
            params.push("o_base");
        }
        if self.fused {
            kb = kb.storage("cnt", Access::ReadWrite, "array<atomic<u32>>").storage_coherent("out", "array<f32>");
            params.extend(["splits", "out_off"]);
        }
        if self.quantize {
            kb = kb.storage("xq", Access::ReadWrite, "array<vec4<u32>>").storage("xs", Access::ReadWrite, "array<vec4<f32>>");
        }
        if self.paged {
            kb = kb.storage("tokinfo", Access::Read, "array<u32>").storage("tables", Access::Read, "array<u32>");
            params.extend(["n_kv", "block_len", "head_stride", "blk_base", "blk_count", "splits", "split_keys", "step_mode"]);
        }
        Ok(kb.params(&params).prelude(&g.prelude()).body(&g.body()).build())
    }
}
