//! `fork`: evaluate a self-modification patch for a running agent runtime in a hard
//! sandbox and emit a signed verdict. See README.md, "Architecture".
//!
//! One module per lifecycle phase and per isolation layer:
//! plan ([`manifest`], [`policy`], [`patch`]), fork ([`fork`]), patch ([`patch`]),
//! evaluate ([`sandbox`], [`budget`], [`task`]), verdict ([`verdict`], [`identity`]),
//! destroy ([`sandbox::Sandbox::destroy`], [`gc`]).

#![deny(unsafe_code)]

pub mod budget;
pub mod check;
pub mod cli;
pub mod critical;
pub mod evaluation;
pub mod fork;
pub mod fsx;
pub mod gateway;
pub mod gc;
pub mod identity;
pub mod ioerr;
pub mod keyformat;
pub mod ledger;
pub mod manifest;
pub mod mesh;
pub mod outfile;
pub mod patch;
pub mod policy;
pub mod run;
pub mod rundir;
pub mod sandbox;
pub mod task;
pub mod text;
pub mod trace;
pub mod units;
pub mod verdict;
