//! NVMe/TCP transport (placeholder; being written).
