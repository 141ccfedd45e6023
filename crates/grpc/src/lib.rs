//! The provider gRPC protocol (not built yet; the out-of-process providers issue fills it): a `Driver` backed by a
//! remote provider, `serve(driver, endpoint)` for Rust providers, and the provider conformance suite.
