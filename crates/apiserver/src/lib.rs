//! The embedded Kubernetes-compatible API server for the subset this project uses (not built yet; the embedded API
//! server issues fill it). It serves `mcm up` and every integration and end-to-end test.
