//! `auth`: see `src/auth.rs`. Under cargo-fuzz (`--cfg fuzzing`) a libFuzzer target;
//! otherwise a bounded replay/mutation driver for stable toolchains (`src/runner.rs`).
#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nvmf_target_fuzz::auth::run(data));

#[cfg(not(fuzzing))]
fn main() {
    nvmf_target_fuzz::runner::main(
        "auth",
        nvmf_target_fuzz::auth::run,
        nvmf_target_fuzz::auth::seeds(),
        MAX_LEN,
    );
}

#[cfg(not(fuzzing))]
const MAX_LEN: usize = 1 << 13;
