//! Every fuzz target run on stable inside `cargo test`: a fixed seed and a fixed number of cases per target, so a
//! run is reproducible and bounded (about 60 s for all targets on a 2-core machine). A failure is shrunk by
//! proptest to a small input; add that input to [`REGRESSIONS`] when fixing it. Long runs: docs/reliability.md.

use proptest::{
    collection::vec,
    num::u8,
    test_runner::{Config, RngAlgorithm, TestRng, TestRunner},
};

/// The seed of every bounded run (any fixed value; changing it explores other inputs).
const SEED: [u8; 32] = *b"mcm-issue-21-fuzz-bounded-seed!!";
/// The largest input, in bytes.
const MAX_INPUT: usize = 2048;

/// Inputs that once broke a target, run before the random ones: (target, bytes).
const REGRESSIONS: &[(&str, &[u8])] = &[];

/// Runs `cases` fixed-seed random inputs through the target.
fn bounded(name: &str, cases: u32) {
    let target = mcm_fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, target)| *target)
        .expect("a target of that name");
    for (_, input) in REGRESSIONS.iter().filter(|(n, _)| *n == name) {
        target(input);
    }
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let result = runner.run(&vec(u8::ANY, 0..MAX_INPUT), |input| {
        target(&input);
        Ok(())
    });
    if let Err(failure) = result {
        panic!("fuzz target {name} failed: {failure}");
    }
}

#[test]
fn api_request() {
    bounded("api_request", 3_000);
}

#[test]
fn selectors() {
    bounded("selectors", 8_000);
}

#[test]
fn patches() {
    bounded("patches", 8_000);
}

#[test]
fn provider_specs() {
    bounded("provider_specs", 8_000);
}

#[test]
fn grpc_wire() {
    bounded("grpc_wire", 10_000);
}

#[test]
fn protobuf_wire() {
    bounded("protobuf_wire", 5_000);
}
