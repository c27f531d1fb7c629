//! The optimisation loop: one gated, revertible iteration over the whole tree,
//! and the summary drawn from the ledger it appends to (`crate::ledger`).

pub mod iterate;
pub mod summary;
