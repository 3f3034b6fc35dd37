
pub mod formats;
pub mod quant;
pub mod act;
pub mod attention;
pub mod conv;
pub mod embedding;
pub mod kv_cache;
pub mod norm;
pub mod ops_common;
pub mod rope;
pub mod sampling;
