//! One model of "what this message asks for", whatever carried it.
//!
//! [`CommandView`] is a borrowed view over a parsed message: OP_MSG (body plus kind-1
//! sequences), OP_QUERY commands on `db.$cmd` and legacy queries, the legacy OP_INSERT /
//! OP_UPDATE / OP_DELETE, and MongoDB 8.0's `bulkWrite` (namespaces resolved through `nsInfo`).
//! OP_COMPRESSED is decompressed by the caller, who keeps the decompressed frame alive.
//! Nothing here allocates: statements, namespaces and pipeline stages are handed to closures.

mod error;
mod kind;
mod namespaces;
mod pipeline;
mod statements;
mod value;
mod view;

pub use error::CommandError;
pub use kind::Kind;
pub(crate) use pipeline::walk_pipeline;
pub use statements::{Statement, StatementRef, UpdateMods};
pub(crate) use value::Fields;
pub use value::{number, truthy};
pub use view::{CommandView, Namespace};

#[cfg(test)]
mod tests;
