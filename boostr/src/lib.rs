
pub mod formats;
pub mod quant;
