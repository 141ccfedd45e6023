//! Certificates, tokens and the kubeconfig (being written).
