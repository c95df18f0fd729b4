//! The integration tests' helpers live in the `deltacast-testkit` crate (shared with the other
//! crates' tests, benches and examples); this module hands them on to `mod common;`.

pub use deltacast_testkit::*;
