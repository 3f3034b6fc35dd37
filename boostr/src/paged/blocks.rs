//! Block ownership on the CPU: the allocator (free list and reference counts) and one sequence's
//! block table.

use crate::ops_common::{OpsError, Result, bad};

/// Hands out the cache's block numbers. Freed blocks are reused first (last freed, first reused).
/// Each block has a reference count: [`Self::retain`] shares a block (a common prefix), and it
/// returns to the free list when the last holder releases it.
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    free: Vec<u32>,
    refs: Vec<u32>,
}

impl BlockAllocator {
    /// `n_blocks` free blocks (numbers `0 .. n_blocks`; block 0 is handed out first).
    pub fn new(n_blocks: usize) -> BlockAllocator {
        let n = u32::try_from(n_blocks).unwrap_or(u32::MAX);
        BlockAllocator { free: (0..n).rev().collect(), refs: vec![0; n as usize] }
    }

    /// Blocks in all.
    pub fn capacity(&self) -> usize {
        self.refs.len()
    }

    /// Blocks free.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Blocks held by at least one sequence.
    pub fn used_count(&self) -> usize {
        self.capacity() - self.free_count()
    }

    /// Holders of `block` (0 when free).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.refs.get(block as usize).copied().unwrap_or(0)
    }

    /// `n` blocks, or [`OpsError::KvBlocksExhausted`] (and none taken) when fewer are free.
    pub fn alloc(&mut self, n: usize) -> Result<Vec<u32>> {
        if n > self.free.len() {
            return Err(OpsError::KvBlocksExhausted { needed: n, free: self.free.len() });
        }
        let out: Vec<u32> = self.free.split_off(self.free.len() - n).into_iter().rev().collect();
        for &b in &out {
            self.refs[b as usize] = 1;
        }
        Ok(out)
    }

    /// One more holder of a held block. [`OpsError::BadArgs`] for a free or unknown block.
    pub fn retain(&mut self, block: u32) -> Result<()> {
        match self.refs.get_mut(block as usize) {
            Some(r) if *r > 0 => {
                *r += 1;
                Ok(())
            }
            _ => Err(bad("BlockAllocator::retain", format!("block {block} is not held"))),
        }
    }

    /// One holder fewer; the block is free again when none remain. [`OpsError::BadArgs`] for a
    /// free or unknown block (a double free).
    pub fn release(&mut self, block: u32) -> Result<()> {
        match self.refs.get_mut(block as usize) {
            Some(r) if *r > 0 => {
                *r -= 1;
                if *r == 0 {
                    self.free.push(block);
                }
                Ok(())
            }
            _ => Err(bad("BlockAllocator::release", format!("block {block} is not held"))),
        }
    }
}

/// One sequence's blocks, in position order: position `p` lives in block `blocks[p / block_len]`
/// at row `p % block_len`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<u32>,
    len: usize,
}

impl BlockTable {
    /// An empty table.
    pub fn new() -> BlockTable {
        BlockTable::default()
    }

    /// The blocks, in position order.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Positions written (or reserved).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes `blocks` (already held for this table) as its first blocks and `len` as its length.
    pub(super) fn adopt(&mut self, blocks: Vec<u32>, len: usize) {
        self.blocks = blocks;
        self.len = len;
    }

    /// Makes room for positions up to `len` (allocating whole blocks) and records `len` as the
    /// table's length. On [`OpsError::KvBlocksExhausted`] nothing changes.
    pub fn grow(&mut self, alloc: &mut BlockAllocator, block_len: usize, len: usize) -> Result<()> {
        let need = len.div_ceil(block_len.max(1));
        if need > self.blocks.len() {
            let more = alloc.alloc(need - self.blocks.len())?;
            self.blocks.extend(more);
        }
        self.len = self.len.max(len);
        Ok(())
    }

    /// Drops positions from `len` on, releasing the blocks no longer needed.
    pub fn truncate(&mut self, alloc: &mut BlockAllocator, block_len: usize, len: usize) -> Result<()> {
        let keep = len.div_ceil(block_len.max(1));
        while self.blocks.len() > keep {
            let b = self.blocks.pop().expect("non-empty");
            alloc.release(b)?;
        }
        self.len = self.len.min(len);
        Ok(())
    }

    /// Releases every block (a finished or preempted sequence).
    pub fn release(&mut self, alloc: &mut BlockAllocator) -> Result<()> {
        self.truncate(alloc, 1, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_handed_out_freed_and_reused_first() {
        let mut a = BlockAllocator::new(4);
        let mut t = BlockTable::new();
        t.grow(&mut a, 16, 17).unwrap();
        assert_eq!(t.blocks(), &[0, 1]);
        assert_eq!((a.free_count(), a.used_count()), (2, 2));
        let mut u = BlockTable::new();
        assert!(matches!(u.grow(&mut a, 16, 48), Err(OpsError::KvBlocksExhausted { needed: 3, free: 2 })));
        assert_eq!((u.blocks().len(), a.free_count()), (0, 2), "a refused grow takes nothing");
        t.release(&mut a).unwrap();
        u.grow(&mut a, 16, 48).unwrap();
        assert_eq!(u.blocks(), &[0, 1, 2], "freed blocks come back first");
        u.truncate(&mut a, 16, 20).unwrap();
        assert_eq!((u.blocks(), u.len()), (&[0u32, 1][..], 20));
        a.retain(0).unwrap();
        u.release(&mut a).unwrap();
        assert_eq!(a.ref_count(0), 1, "a shared block stays held");
        a.release(0).unwrap();
        assert!(a.release(0).is_err(), "double free");
        assert_eq!(a.free_count(), 4);
    }
}
