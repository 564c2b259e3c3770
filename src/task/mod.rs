//! Evaluation tasks: reading and parsing what a task leaves in its reports directory.
//! (The task runner joins this module later.)

pub mod results;

pub use results::{
    parse_go_test_json, parse_junit, parse_libtest_json, parse_metrics, parse_tap,
    read_report_file, ResultsError, TestCase, TestOutcome, TestReport, DEFAULT_MAX_REPORT_BYTES,
};
