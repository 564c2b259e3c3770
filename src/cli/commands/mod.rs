//! One module per subcommand: its clap arguments, the library request built from them,
//! and what is printed.

pub mod approve;
pub mod check;
pub mod consensus;
pub mod evaluate;
pub mod gc;
pub mod history;
pub mod keygen;
pub mod mesh;
pub mod reverify;
pub mod run;
pub mod verify;
