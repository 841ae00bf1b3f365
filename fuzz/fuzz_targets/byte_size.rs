//! Fuzz target `byte_size`: see `rmm_checks::check_target` for what it checks; the same checker
//! runs in CI (`cargo test -p rmm-checks`) over random inputs and fuzz/corpus/byte_size/.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = rmm_checks::check_target("byte_size", data) {
        panic!("byte_size: {e}");
    }
});
