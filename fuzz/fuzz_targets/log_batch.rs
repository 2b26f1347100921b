//! Fuzzes the log store's op decoder: no input may panic, and whatever decodes must
//! re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    phoenix_log::fuzz::fuzz_batch(data);
});
