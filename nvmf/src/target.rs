//! Subsystems and controllers (placeholder; being written).
