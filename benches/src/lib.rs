//! Benches live in rust/ (criterion) and python/.
