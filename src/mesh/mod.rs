pub mod approve;
pub mod consensus;
pub mod messages;
pub mod propose;
pub mod serve;
pub mod steward;
pub mod transport;
pub mod wire;
