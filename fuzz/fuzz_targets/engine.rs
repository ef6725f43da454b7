//! `engine`: see `src/engine.rs`. Under cargo-fuzz (`--cfg fuzzing`) a libFuzzer target;
//! otherwise a bounded replay/mutation driver for stable toolchains (`src/runner.rs`).
#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nvmf_target_fuzz::engine::run(data));

#[cfg(not(fuzzing))]
fn main() {
    nvmf_target_fuzz::runner::main(
        "engine",
        nvmf_target_fuzz::engine::run,
        nvmf_target_fuzz::engine::seeds(),
        MAX_LEN,
    );
}

#[cfg(not(fuzzing))]
const MAX_LEN: usize = 1 << 16;
