//! Fuzz target `csv_parser`: see `rmm_checks::check_target` for what it checks; the same checker
//! runs in CI (`cargo test -p rmm-checks`) over random inputs and fuzz/corpus/csv_parser/.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = rmm_checks::check_target("csv_parser", data) {
        panic!("csv_parser: {e}");
    }
});
