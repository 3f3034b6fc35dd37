//! Cross-crate tests live in `tests/tests/`; golden files and the scripts that make them are in
//! `tests/golden/` and `scripts/`.
