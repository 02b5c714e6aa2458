#![no_main]
// The logic and its assertions live in the crate: src/fuzz_logic/reply_facts.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| mongoguard::fuzz_logic::reply_facts::run(data));
