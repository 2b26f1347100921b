//! Fuzzes the decoder of an SST data block's contents: no input may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    phoenix_engine::table::fuzz::fuzz_block(data);
});
