//! kube-runtime controllers that observe, call `mcm-core`, and act (not built yet; the machine controller issues
//! fill it): machine, machine set, machine deployment, safety, and the node, class and secret watchers.
