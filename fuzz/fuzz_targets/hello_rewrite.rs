#![no_main]
// The logic and its assertions live in the crate: src/fuzz_logic/hello_rewrite.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| mongoguard::fuzz_logic::hello_rewrite::run(data));
