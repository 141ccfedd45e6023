//! [`MachineClassBuilder`]: a MachineClass for a test.

use k8s_openapi::api::core::v1::SecretReference;

use super::meta::builder;
use crate::{MachineClass, NodeTemplate};

builder!(
    /// Builds a [`MachineClass`]: `MachineClassBuilder::new("small").namespace("default").provider("sim")
    /// .provider_spec(spec).secret_ref("boot", "default").build()`.
    MachineClassBuilder,
    class: MachineClass
);

impl MachineClassBuilder {
    /// Sets the provider name.
    #[must_use]
    pub fn provider(mut self, provider: &str) -> Self {
        provider.clone_into(&mut self.class.provider);
        self
    }

    /// Sets the provider-specific configuration.
    #[must_use]
    pub fn provider_spec(mut self, spec: serde_json::Value) -> Self {
        self.class.provider_spec = spec;
        self
    }

    /// Refers to the secret holding userData (and the credentials unless [`Self::credentials_secret_ref`] is set).
    #[must_use]
    pub fn secret_ref(mut self, name: &str, namespace: &str) -> Self {
        self.class.secret_ref = Some(secret_reference(name, namespace));
        self
    }

    /// Refers to the secret holding the credentials.
    #[must_use]
    pub fn credentials_secret_ref(mut self, name: &str, namespace: &str) -> Self {
        self.class.credentials_secret_ref = Some(secret_reference(name, namespace));
        self
    }

    /// Sets the node template (resources for scale-from-zero).
    #[must_use]
    pub fn node_template(mut self, template: NodeTemplate) -> Self {
        self.class.node_template = Some(template);
        self
    }
}

fn secret_reference(name: &str, namespace: &str) -> SecretReference {
    SecretReference {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
    }
}
