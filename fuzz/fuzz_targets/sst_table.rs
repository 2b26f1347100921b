//! Fuzzes the decoder of a whole SST file (open, scan both ways, point reads): no input may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    phoenix_engine::table::fuzz::fuzz_table(data);
});
