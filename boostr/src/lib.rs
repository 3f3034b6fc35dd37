
pub mod formats;
