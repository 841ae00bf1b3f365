//! Fuzz target `binning_ops`: see `rmm_checks::check_target` for what it checks; the same checker
//! runs in CI (`cargo test -p rmm-checks`) over random inputs and fuzz/corpus/binning_ops/.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = rmm_checks::check_target("binning_ops", data) {
        panic!("binning_ops: {e}");
    }
});
