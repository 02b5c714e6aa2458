#![no_main]
// The logic and its assertions live in the crate: src/fuzz_logic/scram_server.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| mongoguard::fuzz_logic::scram_server::run(data));
