//! The simulated provider (not built yet; the first machine controller issue fills it): in-memory machines,
//! simulated kubelets, fault and latency injection. The provider of the integration tests and the benchmark.
