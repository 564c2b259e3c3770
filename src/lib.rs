pub mod budget;
pub mod check;
pub mod cli;
pub mod fork;
pub mod gc;
pub mod identity;
pub mod policy;
pub mod run;
pub mod rundir;
pub mod sandbox;
pub mod units;
pub mod patch {
    pub mod gates {
        #[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct GatePolicy {}
    }
}
