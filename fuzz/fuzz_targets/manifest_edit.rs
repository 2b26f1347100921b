//! Fuzzes the engine's manifest edit decoder: no input may panic; errors name the file and offset.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    phoenix_engine::version_set::fuzz::fuzz_version_edit(data);
});
