//! Read-only file bytes: a memory map of a file on disk, or an owned buffer (tests, fuzzing,
//! files received over the network).

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

/// The bytes of a model file. Dereferences to `[u8]`.
#[derive(Debug)]
pub enum Storage {
    /// A read-only memory map. Pages are read from disk only when touched.
    Mapped(Mmap),
    /// Bytes held in memory.
    Owned(Vec<u8>),
}

impl Storage {
    /// Memory-maps `path` read-only.
    ///
    /// The map assumes the file is not truncated or rewritten while it is open, as every
    /// memory-mapping model loader does.
    pub fn map(path: &Path) -> std::io::Result<Storage> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            // Mapping an empty file fails on some platforms; an empty buffer behaves the same.
            return Ok(Storage::Owned(Vec::new()));
        }
        // SAFETY: the map is read-only; like all mmap-based loaders we rely on the file not
        // being modified underneath us while it is open.
        let map = unsafe { Mmap::map(&file)? };
        Ok(Storage::Mapped(map))
    }
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}
