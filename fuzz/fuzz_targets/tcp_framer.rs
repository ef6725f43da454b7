//! `tcp_framer`: see `src/tcp_framer.rs`. Under cargo-fuzz (`--cfg fuzzing`) a libFuzzer target;
//! otherwise a bounded replay/mutation driver for stable toolchains (`src/runner.rs`).
#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nvmf_target_fuzz::tcp_framer::run(data));

#[cfg(not(fuzzing))]
fn main() {
    nvmf_target_fuzz::runner::main(
        "tcp_framer",
        nvmf_target_fuzz::tcp_framer::run,
        nvmf_target_fuzz::tcp_framer::seeds(),
        MAX_LEN,
    );
}

#[cfg(not(fuzzing))]
const MAX_LEN: usize = 1 << 16;
