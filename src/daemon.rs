//! IO threads, acceptor and the application glue (placeholder; being written).
