//! Fuzzes the log store's segment scanner (frame checks, op decoding, tail handling): no
//! input may panic; ops found must lie inside the scanned bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    phoenix_log::fuzz::fuzz_segment(data);
});
