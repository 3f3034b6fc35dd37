//! [`PrefillAttnCoop`]: causal flash attention of a prefill chunk on cooperative matrices (f16
//! 16x16x16 tiles, f32 accumulate).
//!
//! One workgroup takes [`COOP_BQ`] queries and `heads` query heads that share one KV head, one
//! subgroup of 32 per head (so every subgroup walks the same keys, and each K/V tile is staged
//! once for all of them). Per subgroup, 16 query rows:
//! - Q is loaded once (f32 -> f16, pre-multiplied by `scale * log2(e)`) through workgroup memory
//!   into `head_dim / 16` A fragments that stay in registers.
//! - Keys go in tiles of `bk`: the workgroup stages the tile's K and V rows in workgroup memory
//!   as `vec4<f16>` (the next tile's share loaded into registers while this one is used; the
//!   fragments read straight from the cache measured slower than the subgroup kernel, about one
//!   load latency per fragment, and scalar f16 stores cost half the speed). `S = Q Kᵀ` (`Kᵀ` is the staged rows read column-major)
//!   is stored row-major to workgroup memory, where two lanes per row mask it (causal, window,
//!   past `kv_len`) and take the row max.
//! - The online softmax rescales lazily: the running max `m` moves only when some row's tile
//!   max exceeds it by more than [`LAZY_RESCALE`] (in log2 units), so `p = exp2(s - m)` stays
//!   below 2^8 and fits f16. Only then is the output rescaled, through workgroup memory (an
//!   accumulator's elements cannot be addressed); with real scores that happens in the first
//!   tiles and rarely after. The decision is workgroup-uniform (`workgroupUniformLoad` of the
//!   subgroups' flags) so that its barriers are too.
//! - `P` (f16) goes to workgroup memory, and `O += P V` reads the staged V rows row-major.
//!
//! At the end each row is divided by its sum and written as f32 (`[n_tok, n_q, head_dim]`).
//!
//! A tile's rows past the cache's end are staged as copies of its last row; with the rows past
//! `kv_len` they are masked (zero weight; the cache's rows are zeroed or stale, always finite).
//!
//! Needs an unsegmented f16 cache, head_dim 64 or 128, no soft-capping, and cooperative matrices
//! with subgroups of 32 ([`PrefillAttnCoop::supported`]); the plan falls back to the other
//! kernels elsewhere.

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::*;

#[path = "prefill_coop_wgsl.rs"]
mod wgsl;
use wgsl::CoopWgsl;

/// Queries per workgroup (one 16-row fragment per subgroup).
pub const COOP_BQ: u32 = 16;

/// How far (log2 units) a row's tile max may exceed the running max before the output is
/// rescaled: probabilities stay below `2^LAZY_RESCALE`.
pub const LAZY_RESCALE: f32 = 8.0;

/// The cooperative-matrix prefill kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefillAttnCoop {
    /// Elements per head: 64 or 128.
    pub head_dim: u32,
    /// Query heads per workgroup (1..=4, dividing the GQA group): one subgroup each.
    pub heads: u32,
    /// Keys per tile: 32 or 64.
    pub bk: u32,
}

impl PrefillAttnCoop {
    /// The variant for a GQA `group`: the most heads per workgroup (up to 4) that divide it,
    /// tiles of 32 keys (64 for head_dim 64), which fit 48 KiB of workgroup memory.
    pub fn for_group(head_dim: u32, group: u32) -> PrefillAttnCoop {
        let heads = [4, 3, 2, 1].into_iter().find(|h| group.is_multiple_of(*h)).unwrap_or(1);
        PrefillAttnCoop { head_dim, heads, bk: if head_dim <= 64 { 64 } else { 32 } }
    }

    /// Every variant the tests validate with naga.
    pub fn all() -> Vec<PrefillAttnCoop> {
        let mut v = Vec::new();
        for head_dim in [64, 128] {
            for heads in 1..=4 {
                for bk in [32, 64] {
                    v.push(PrefillAttnCoop { head_dim, heads, bk });
                }
            }
        }
        v
    }

    /// Workgroup memory in bytes: the staged Q rows (then K rows), V rows, S (f32) and P (f16).
    pub fn shared_bytes(&self) -> u32 {
        let (rows, hs) = (16 * self.heads, self.head_dim + 8);
        2 * rows.max(self.bk) * hs + 2 * self.bk * hs + 4 * rows * (self.bk + 4) + 2 * rows * (self.bk + 8) + 4 * rows + 16
    }

    /// Whether `env` runs this variant: f16, subgroups of exactly 32 and cooperative matrices
    /// (the caller checks the adapter's f16 16x16x16 support), and the workgroup memory fits.
    pub fn supported(&self, env: &KernelEnv, coopmat: bool, max_shared: u32) -> bool {
        coopmat && env.f16 && env.subgroups && env.subgroup_min_size == 32 && self.valid() && self.shared_bytes() <= max_shared
    }

    fn valid(&self) -> bool {
        [64, 128].contains(&self.head_dim) && (1..=4).contains(&self.heads) && [32, 64].contains(&self.bk)
    }

    /// WGSL. Bindings `q` (f32), `kc`, `vc` (the cache's f16 rows), `out` (f32). Grid
    /// `[ceil(n_tok / 16), n_kv * group / heads]`. A typed error for a variant outside
    /// [`PrefillAttnCoop::all`] or an `env` without f16 and subgroups.
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        if !self.valid() {
            return Err(OpsError::Unsupported {
                what: "coopmat prefill attention",
                reason: format!(
                    "head size {}, {} heads per workgroup, {} keys per tile (head size 64 or 128, 1 to 4 heads, 32 or 64 keys)",
                    self.head_dim, self.heads, self.bk
                ),
            });
        }
        if !(env.f16 && env.subgroups) {
            return Err(OpsError::Unsupported { what: "coopmat prefill attention", reason: "needs f16 and subgroups".into() });
        }
        let g = CoopWgsl::new(self);
        Ok(KernelBuilder::new(g.name(), *env)
            .enable_f16()
            .enable("wgpu_cooperative_matrix")
            .workgroup(32 * self.heads, 1, 1)
            .subgroup_builtins()
            .storage("q", Access::Read, "array<f32>")
            .storage("kc", Access::Read, "array<vec4<f16>>")
            .storage("vc", Access::Read, "array<vec4<f16>>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["n_tok", "n_q", "group", "p0", "kv_len", "seg_len", "q_off", "tok_stride", "out_off", "scale", "window"])
            .prelude(&g.workgroup_memory())
            .body(&g.body())
            .build())
    }
}
