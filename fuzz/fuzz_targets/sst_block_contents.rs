//! Fuzzes the decoder of a checksummed SST block with lz4/zstd/no compression: no input may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    phoenix_engine::table::fuzz::fuzz_block_contents(data);
});
