//! A small NVMe/TCP host for tests and benchmarks (placeholder; being written).
