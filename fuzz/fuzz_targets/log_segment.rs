//! Fuzzes the log store's segment scanner (frame checks, op decoding, tail handling): no
//! input may panic; ops found must lie inside the scanned bytes. The input is used both as
//! raw segment bytes and as payloads wrapped in frames with valid checksums.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    phoenix_log::fuzz::fuzz_segment(data);
    phoenix_log::fuzz::fuzz_framed_segment(data);
});
