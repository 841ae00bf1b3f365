//! # rmm-mr: memory resources (placeholder until the trait lands)
pub mod arena;
pub mod binning;
pub mod fixed_size;
pub mod logging;
pub mod pool;
pub mod statistics;
pub mod tracking;
