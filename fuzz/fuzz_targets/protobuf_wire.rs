//! cargo-fuzz target: the body is `mcm_fuzz::protobuf_wire::run`, shared with the stable bounded run.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mcm_fuzz::protobuf_wire::run(data));
