//! Constrained decoding: a [`TokenConstraint`] says which ids the next step may choose
//! (structured output: a JSON schema, a regular expression, a grammar). Give a generation one
//! through [`GenerateOpts::constraint`](super::GenerateOpts::constraint); a [`Constraint`] makes
//! a fresh one per generation, so the options stay reusable.
//!
//! A constrained generation reads each step's whole logits row, sets the ids the constraint
//! refuses to minus infinity, and samples (or takes the argmax) from the rest with its own
//! sampler; the chosen id is then handed back to the constraint. When the constraint is
//! complete (nothing more may follow) the generation ends with
//! [`FinishReason::Stop`](super::FinishReason::Stop). The server's JSON schema and Lark
//! support (`llguidance`) is one implementation; any other can be plugged in.
//!
//! ```
//! use cera::engine::{Constraint, TokenConstraint};
//!
//! /// Allows exactly the ids of `script`, in order.
//! struct Script { ids: Vec<u32>, at: usize, mask: Vec<u32> }
//! impl TokenConstraint for Script {
//!     fn allowed(&mut self, vocab: usize) -> Result<&[u32], String> {
//!         self.mask = vec![0; vocab.div_ceil(32)];
//!         let id = self.ids[self.at] as usize;
//!         self.mask[id / 32] |= 1 << (id % 32);
//!         Ok(&self.mask)
//!     }
//!     fn accept(&mut self, _id: u32) -> Result<(), String> { self.at += 1; Ok(()) }
//!     fn is_finished(&self) -> bool { self.at == self.ids.len() }
//! }
//! let c = Constraint::new(|| Ok(Box::new(Script { ids: vec![5, 7], at: 0, mask: Vec::new() })));
//! let mut one = c.start().unwrap();
//! assert_eq!(one.allowed(64).unwrap()[0], 1 << 5);
//! ```

use std::fmt;
use std::sync::Arc;

/// Which ids one generation may choose next, step by step.
pub trait TokenConstraint: Send {
    /// The ids allowed at the next step, as a bit set over a vocabulary of `vocab` ids (bit
    /// `id % 32` of word `id / 32`; missing words allow nothing). An error ends the generation
    /// with it.
    fn allowed(&mut self, vocab: usize) -> Result<&[u32], String>;
    /// The id chosen at this step (one the last [`allowed`](Self::allowed) allowed).
    fn accept(&mut self, id: u32) -> Result<(), String>;
    /// Whether the constrained text is complete: the generation ends (with
    /// [`FinishReason::Stop`](super::FinishReason::Stop)).
    fn is_finished(&self) -> bool;
}

type Factory = dyn Fn() -> Result<Box<dyn TokenConstraint>, String> + Send + Sync;

/// Makes a fresh [`TokenConstraint`] for each generation. Cheap to clone; two are equal when
/// they are clones of one another.
#[derive(Clone)]
pub struct Constraint(Arc<Factory>);

impl Constraint {
    /// A constraint from its factory.
    pub fn new(f: impl Fn() -> Result<Box<dyn TokenConstraint>, String> + Send + Sync + 'static) -> Constraint {
        Constraint(Arc::new(f))
    }

    /// A fresh constraint for one generation.
    pub fn start(&self) -> Result<Box<dyn TokenConstraint>, String> {
        (self.0)()
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint(..)")
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Constraint) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Whether bit `id` of `mask` is set.
pub(crate) fn allows(mask: &[u32], id: u32) -> bool {
    mask.get(id as usize / 32).is_some_and(|w| w >> (id % 32) & 1 == 1)
}
