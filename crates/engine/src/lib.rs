//! phoenix-engine: PhoenixKV's LSM-tree storage engine.

pub mod error;
pub mod iter;
pub mod key;
pub mod table;

pub use error::{Error, Result};
