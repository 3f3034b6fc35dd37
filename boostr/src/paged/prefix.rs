//! The prefix cache: sequences that share a token prefix share its KV blocks, and finished
//! prefixes stay cached while memory allows.
//!
//! A full block is identified by a hash of its tokens and of the hash of the block before it, so
//! equal hashes mean equal token prefixes up to the end of the block (a 64-bit hash; with the
//! token ids themselves compared on a hit, a collision can never share wrong rows). When a
//! sequence's block fills up it is registered under its hash; the cache then holds a reference of
//! its own on the block, so the rows outlive the sequence. A new sequence looks its prompt up block
//! by block and takes a reference on every cached block of its prefix: it prefills only the tokens
//! after them.
//!
//! Sharing is by whole blocks. Where two prompts part inside a block, [`PrefixCache::start_with_copy`]
//! copies the cached block whose first tokens match the new prompt's longest into a block of the
//! sequence's own (copy on write: the executor copies the rows, the source block stays cached),
//! and the sequence computes only from the divergence on; [`PrefixCache::start`] shares whole
//! blocks alone. A cached block is never written again: a sequence writes only into blocks it
//! holds alone. When a whole prompt is cached, its last block is not taken (its last token must
//! run again to give logits), so the write of that token never lands in a shared block; its
//! other tokens may come from a copy.
//!
//! Eviction: when an allocation finds too few free blocks, the cache drops its reference on the
//! least recently used cached blocks that no sequence holds, oldest first, until enough are free.
//! Blocks some sequence still holds are never evicted.

use std::collections::{HashMap, VecDeque};

use super::blocks::{BlockAllocator, BlockTable};
use crate::ops_common::{Result, bad};

/// A cached block: its tokens (compared on a hit), the hash of the block before it, and when it
/// was last used.
#[derive(Clone, Debug)]
struct Entry {
    block: u32,
    tokens: Vec<u32>,
    parent: u64,
    last_use: u64,
}

/// A copy on write that [`PrefixCache::start_with_copy`] asks for: the executor copies every
/// layer's rows of block `src` (cached) into block `dst` (the new sequence's own, at the end of
/// its table), whose first `tokens` positions are then the sequence's. The source holds a
/// reference until [`PrefixCache::copied`], so that it is not evicted and written before the copy
/// runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    /// The cached block.
    pub src: u32,
    /// The sequence's block.
    pub dst: u32,
    /// Leading positions of `src` that equal the new prompt's.
    pub tokens: usize,
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Blocks held by sequences or by the cache.
    pub used_blocks: usize,
    /// Blocks free.
    pub free_blocks: usize,
    /// Cached blocks no sequence holds (evictable).
    pub evictable_blocks: usize,
    /// Prompt tokens found in the cache, summed over every lookup.
    pub hit_tokens: u64,
    /// Blocks evicted so far.
    pub evicted_blocks: u64,
}

/// The prefix cache over a [`BlockAllocator`]: blocks shared by token prefix, copy-free (a cached
/// block is never written again), evicted least recently used first when no sequence holds them.
#[derive(Debug)]
pub struct PrefixCache {
    alloc: BlockAllocator,
    block_len: usize,
    by_hash: HashMap<u64, Entry>,
    hash_of: HashMap<u32, u64>,
    /// Hashes in the order they were last used (stale duplicates skipped on eviction).
    lru: VecDeque<(u64, u64)>,
    clock: u64,
    stats: PrefixStats,
}

/// The hash of a block's tokens after the block whose hash is `parent` (FNV-1a over the parent
/// hash and the ids).
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parent.to_le_bytes().into_iter().chain(tokens.iter().flat_map(|t| t.to_le_bytes())) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The hash before a sequence's first block.
const ROOT: u64 = 0;

impl PrefixCache {
    /// A cache over `n_blocks` blocks of `block_len` positions, all free.
    pub fn new(n_blocks: usize, block_len: usize) -> PrefixCache {
        PrefixCache {
            alloc: BlockAllocator::new(n_blocks),
            block_len: block_len.max(1),
            by_hash: HashMap::new(),
            hash_of: HashMap::new(),
            lru: VecDeque::new(),
            clock: 0,
            stats: PrefixStats::default(),
        }
    }

    /// Positions per block.
    pub fn block_len(&self) -> usize {
        self.block_len
    }

    /// The allocator (reference counts, free blocks).
    pub fn allocator(&self) -> &BlockAllocator {
        &self.alloc
    }

    /// Current counters.
    pub fn stats(&self) -> PrefixStats {
        let evictable = self.by_hash.values().filter(|e| self.alloc.ref_count(e.block) == 1).count();
        PrefixStats { used_blocks: self.alloc.used_count(), free_blocks: self.alloc.free_count(), evictable_blocks: evictable, ..self.stats }
    }

    /// Blocks an allocation could get now: free ones and evictable cached ones.
    pub fn available(&self) -> usize {
        let s = self.stats();
        s.free_blocks + s.evictable_blocks
    }

    fn touch(&mut self, hash: u64) {
        self.clock += 1;
        if let Some(e) = self.by_hash.get_mut(&hash) {
            e.last_use = self.clock;
            self.lru.push_back((hash, self.clock));
        }
        // Stale entries (a block used again later, or evicted) are skipped on eviction; rebuild
        // the queue when they outnumber the live ones.
        if self.lru.len() > 2 * self.by_hash.len() + 64 {
            let mut live: Vec<(u64, u64)> = self.by_hash.iter().map(|(&h, e)| (h, e.last_use)).collect();
            live.sort_by_key(|&(_, t)| t);
            self.lru = live.into();
        }
    }

    /// A new sequence for `prompt`: a table holding the cached blocks of its longest cached
    /// prefix of whole blocks (never the whole prompt), and that prefix's length in tokens (the
    /// positions already computed). Nothing is allocated for the rest: [`Self::grow`] does that.
    pub fn start(&mut self, prompt: &[u32]) -> Result<(BlockTable, usize)> {
        let bl = self.block_len;
        // The last token always runs (its logits are wanted).
        let usable = prompt.len().saturating_sub(1) / bl;
        let mut parent = ROOT;
        let mut blocks = Vec::new();
        for chunk in prompt.chunks(bl).take(usable) {
            let h = block_hash(parent, chunk);
            match self.by_hash.get(&h) {
                Some(e) if e.tokens == chunk => blocks.push((h, e.block)),
                _ => break,
            }
            parent = h;
        }
        let mut table = BlockTable::new();
        for &(h, b) in &blocks {
            self.alloc.retain(b)?;
            self.touch(h);
        }
        table.adopt(blocks.iter().map(|&(_, b)| b).collect(), blocks.len() * bl);
        let hit = blocks.len() * bl;
        self.stats.hit_tokens += hit as u64;
        Ok((table, hit))
    }

    /// [`Self::start`], then copy on write inside the next block: among the cached blocks that
    /// follow the shared prefix, the one whose first tokens match the prompt's longest (at least
    /// one, never the prompt's last token) is to be copied into a new block of the sequence
    /// ([`BlockCopy`]); the positions computed are the shared blocks' and the copied tokens.
    /// No copy when nothing matches or no block is free for it (evicting as [`Self::grow`]
    /// does).
    pub fn start_with_copy(&mut self, prompt: &[u32]) -> Result<(BlockTable, usize, Option<BlockCopy>)> {
        let (mut table, hit) = self.start(prompt)?;
        let bl = self.block_len;
        let limit = prompt.len().saturating_sub(1).saturating_sub(hit).min(bl);
        if limit == 0 {
            return Ok((table, hit, None));
        }
        let parent = prompt[..hit].chunks(bl).fold(ROOT, block_hash);
        let want = &prompt[hit..hit + limit];
        let common = |t: &[u32]| t.iter().zip(want).take_while(|(a, b)| a == b).count();
        let best = self
            .by_hash
            .iter()
            .filter(|(_, e)| e.parent == parent)
            .map(|(&h, e)| (common(&e.tokens), h, e.block))
            .max_by_key(|&(j, h, _)| (j, std::cmp::Reverse(h)));
        let Some((tokens, h, src)) = best.filter(|&(j, ..)| j > 0) else { return Ok((table, hit, None)) };
        // Held while the copy is pending, so that the eviction below cannot free it.
        self.alloc.retain(src)?;
        self.touch(h);
        if self.grow(&mut table, hit + 1).is_err() {
            self.alloc.release(src)?;
            return Ok((table, hit, None));
        }
        let dst = table.blocks()[hit / bl];
        self.stats.hit_tokens += tokens as u64;
        Ok((table, hit + tokens, Some(BlockCopy { src, dst, tokens })))
    }

    /// The copy was recorded (or dropped with its sequence): releases its source block's
    /// reference.
    pub fn copied(&mut self, c: BlockCopy) -> Result<()> {
        self.alloc.release(c.src)
    }

    /// Makes room in `table` for positions up to `len`, evicting cached blocks no sequence holds
    /// (least recently used first) when too few are free. [`OpsError::KvBlocksExhausted`] (and
    /// nothing changed but evictions) when even that is not enough.
    ///
    /// [`OpsError::KvBlocksExhausted`]: crate::ops_common::OpsError::KvBlocksExhausted
    pub fn grow(&mut self, table: &mut BlockTable, len: usize) -> Result<()> {
        let need = len.div_ceil(self.block_len).saturating_sub(table.blocks().len());
        if need > self.alloc.free_count() {
            self.evict(need - self.alloc.free_count());
        }
        table.grow(&mut self.alloc, self.block_len, len)
    }

    /// Drops the cache's reference on up to `n` least recently used blocks that no sequence
    /// holds; returns how many were freed.
    pub fn evict(&mut self, n: usize) -> usize {
        let mut freed = 0;
        let mut keep = VecDeque::new();
        while freed < n {
            let Some((h, stamp)) = self.lru.pop_front() else { break };
            let Some(e) = self.by_hash.get(&h) else { continue };
            if e.last_use != stamp {
                continue; // a later use is queued further back
            }
            if self.alloc.ref_count(e.block) != 1 {
                keep.push_back((h, stamp)); // a sequence holds it
                continue;
            }
            let e = self.by_hash.remove(&h).expect("present");
            self.hash_of.remove(&e.block);
            // The cache held the only reference: the block is free again.
            let _ = self.alloc.release(e.block);
            freed += 1;
            self.stats.evicted_blocks += 1;
        }
        // Held blocks keep their place at the front.
        while let Some(x) = keep.pop_back() {
            self.lru.push_front(x);
        }
        freed
    }

    /// Registers the full blocks of a sequence whose first `tokens.len()` positions are written
    /// (its prompt and generated ids so far): each block that filled up since the last call is
    /// cached under its hash. A block whose prefix is cached already under another block stays
    /// the sequence's own. Typed error when the table holds fewer positions than `tokens`.
    pub fn register(&mut self, table: &BlockTable, tokens: &[u32]) -> Result<()> {
        let bl = self.block_len;
        if table.blocks().len() * bl < tokens.len() {
            return Err(bad("PrefixCache::register", format!("{} tokens in a table of {} blocks", tokens.len(), table.blocks().len())));
        }
        let mut parent = ROOT;
        for (i, chunk) in tokens.chunks(bl).enumerate() {
            if chunk.len() < bl {
                break;
            }
            let h = block_hash(parent, chunk);
            let b = table.blocks()[i];
            match self.hash_of.get(&b) {
                Some(&known) if known == h => {}
                Some(_) => return Err(bad("PrefixCache::register", format!("block {b} is cached under another prefix"))),
                None if !self.by_hash.contains_key(&h) => {
                    self.alloc.retain(b)?;
                    self.by_hash.insert(h, Entry { block: b, tokens: chunk.to_vec(), parent, last_use: 0 });
                    self.hash_of.insert(b, h);
                    self.touch(h);
                }
                None => {}
            }
            parent = h;
        }
        Ok(())
    }

    /// Releases a finished, cancelled or preempted sequence's blocks; its cached blocks stay in
    /// the cache (evictable once no other sequence holds them).
    pub fn release(&mut self, table: &mut BlockTable) -> Result<()> {
        table.release(&mut self.alloc)
    }

    /// Drops every cached block no sequence holds.
    pub fn clear(&mut self) {
        self.evict(usize::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops_common::OpsError;

    fn ids(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| seed.wrapping_mul(7919).wrapping_add(i * 31) % 50_000).collect()
    }

    /// Runs a request: start, grow to the prompt, register what was prefilled, generate
    /// `n_gen` tokens (registering as blocks fill), release. Returns the cached prefix length.
    fn request(c: &mut PrefixCache, prompt: &[u32], n_gen: usize) -> usize {
        let (mut t, hit) = c.start(prompt).unwrap();
        c.grow(&mut t, prompt.len()).unwrap();
        let mut toks = prompt.to_vec();
        c.register(&t, &toks).unwrap();
        for i in 0..n_gen {
            toks.push(90_000 + i as u32);
            c.grow(&mut t, toks.len()).unwrap();
            c.register(&t, &toks).unwrap();
        }
        c.release(&mut t).unwrap();
        hit
    }

    #[test]
    fn a_shared_system_prompt_is_prefilled_once() {
        let mut c = PrefixCache::new(64, 16);
        let system = ids(1, 300);
        let a = [system.clone(), ids(2, 20)].concat();
        let b = [system.clone(), ids(3, 9)].concat();
        assert_eq!(request(&mut c, &a, 5), 0);
        // 300 shared tokens hold 18 whole blocks: the second request prefills 300 - 288 + 9.
        assert_eq!(request(&mut c, &b, 5), 288);
        assert_eq!(c.stats().hit_tokens, 288);
        // The same prompt again: every whole block but the one holding its last token.
        assert_eq!(request(&mut c, &a, 0), 304);
        let whole = ids(4, 32);
        request(&mut c, &whole, 0);
        assert_eq!(request(&mut c, &whole, 0), 16, "a whole cached prompt still runs its last block");
    }

    #[test]
    fn evicts_least_recently_used_blocks_no_one_holds() {
        let mut c = PrefixCache::new(6, 4);
        let (p, q) = (ids(5, 9), ids(6, 9));
        request(&mut c, &p, 0); // caches 2 blocks of p
        request(&mut c, &q, 0); // and 2 of q
        assert_eq!(c.stats().evictable_blocks, 4);
        // p is used again, so q's blocks are the older ones.
        let (mut held, hit) = c.start(&p).unwrap();
        assert_eq!(hit, 8);
        // 5 blocks for a new sequence: 2 free, q's 2 evicted... and one more is not there (p's
        // blocks are held).
        let mut t = BlockTable::new();
        assert!(matches!(c.grow(&mut t, 20), Err(OpsError::KvBlocksExhausted { .. })));
        assert_eq!(c.stats().evicted_blocks, 2, "only blocks no sequence holds are evicted");
        assert_eq!(c.start(&q).unwrap().1, 0, "q's blocks are gone");
        c.grow(&mut t, 16).unwrap();
        c.release(&mut t).unwrap();
        c.release(&mut held).unwrap();
        c.clear();
        assert_eq!(c.stats().free_blocks, 6);
        assert_eq!(c.stats().used_blocks, 0);
    }

    #[test]
    fn a_prompt_that_parts_inside_a_block_shares_only_the_blocks_before() {
        let mut c = PrefixCache::new(16, 8);
        let a = ids(7, 30);
        request(&mut c, &a, 0);
        let mut b = a.clone();
        b[19] ^= 1; // parts inside the third block
        assert_eq!(request(&mut c, &b, 0), 16);
        // Equal hashes with other tokens are not taken: the ids are compared.
        assert_eq!(block_hash(0, &a[..8]), block_hash(0, &a[..8]));
        assert_ne!(block_hash(0, &a[..8]), block_hash(1, &a[..8]));
    }

    #[test]
    fn a_prompt_that_parts_inside_a_block_copies_its_shared_start() {
        let mut c = PrefixCache::new(16, 8);
        let a = ids(7, 30);
        request(&mut c, &a, 0);
        let mut b = a.clone();
        b[19] ^= 1; // parts inside the third block, after 3 of its tokens
        let (mut t, hit, copy) = c.start_with_copy(&b).unwrap();
        let copy = copy.expect("a copy of the third block's start");
        assert_eq!((hit, copy.tokens), (19, 3));
        // The source is a's third block (cached, held for the copy); the destination is the
        // sequence's own third block.
        assert_eq!(t.blocks().len(), 3);
        assert_eq!(t.blocks()[2], copy.dst);
        assert_ne!(copy.src, copy.dst);
        assert_eq!(c.allocator().ref_count(copy.src), 2, "the cache's reference and the copy's");
        assert_eq!(c.allocator().ref_count(copy.dst), 1);
        // Eviction cannot take the source while the copy is pending.
        c.evict(usize::MAX);
        assert_eq!(c.allocator().ref_count(copy.src), 2);
        c.copied(copy).unwrap();
        assert_eq!(c.allocator().ref_count(copy.src), 1);
        assert_eq!(c.stats().hit_tokens, 19);
        c.release(&mut t).unwrap();
        // A whole cached prompt: every token but the last from the cache, the last block's
        // start by a copy.
        let (mut t, hit, copy) = c.start_with_copy(&a[..24]).unwrap();
        assert_eq!((hit, copy.map(|x| x.tokens)), (23, Some(7)));
        c.copied(copy.unwrap()).unwrap();
        c.release(&mut t).unwrap();
        // Nothing in common after the shared blocks: no copy.
        let mut d = a.clone();
        d[16] ^= 1;
        let (mut t, hit, copy) = c.start_with_copy(&d).unwrap();
        assert_eq!((hit, copy), (16, None));
        c.release(&mut t).unwrap();
        // No free block for the copy: none is asked for.
        let mut small = PrefixCache::new(2, 8);
        let p = ids(9, 12);
        request(&mut small, &p, 0);
        let mut hold = BlockTable::new();
        small.grow(&mut hold, 8).unwrap();
        let mut q = p.clone();
        q[4] ^= 1;
        let (mut t, hit, copy) = small.start_with_copy(&q).unwrap();
        assert_eq!((hit, copy), (0, None));
        assert_eq!(small.allocator().ref_count(small.by_hash.values().next().unwrap().block), 1);
        small.release(&mut t).unwrap();
        small.release(&mut hold).unwrap();
    }
}
