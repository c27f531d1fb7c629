//! The optimisation loop: one gated, revertible iteration over the whole tree,
//! the ledger it appends to, and the summary drawn from that ledger.

pub mod iterate;
pub mod ledger;
pub mod summary;
