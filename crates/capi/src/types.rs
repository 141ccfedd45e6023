//! `infrastructure.machine.sapcloud.io/v1beta1`: `MCMMachine` and `MCMMachineTemplate` (spec 001 "Data Types").

use k8s_openapi::{
    api::core::v1::SecretReference,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the kinds.
pub const GROUP: &str = "infrastructure.machine.sapcloud.io";
/// The version of the kinds.
pub const VERSION: &str = "v1beta1";
/// `GROUP/VERSION`.
pub const API_VERSION: &str = "infrastructure.machine.sapcloud.io/v1beta1";
/// The finalizer the controller puts on an `MCMMachine` (spec 001 "Add the provider-specific finalizer").
pub const FINALIZER: &str = "mcmmachine.infrastructure.machine.sapcloud.io";

macro_rules! kind {
    ($ty:ident, kind = $kind:literal, plural = $plural:literal, list = $list:ident, fields = { $($field:ident : $json:literal $(skip_if $cond:path)?),* $(,)? }) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = API_VERSION;
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = VERSION;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = k8s_openapi::NamespaceResourceScope;
        }

        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }

        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("apiVersion", API_VERSION)?;
                map.serialize_entry("kind", $kind)?;
                $(
                    let skip = false $(|| $cond(&self.$field))?;
                    if !skip {
                        map.serialize_entry($json, &self.$field)?;
                    }
                )*
                map.end()
            }
        }

        #[doc = concat!("A list of `", $kind, "` (spec 001 \"List Resources\").")]
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
        pub struct $list {
            /// `apiVersion`.
            #[serde(rename = "apiVersion", default)]
            pub api_version: String,
            /// `kind`.
            #[serde(default)]
            pub kind: String,
            /// List metadata.
            #[serde(default)]
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta,
            /// The objects.
            #[serde(default)]
            pub items: Vec<$ty>,
        }
    };
}

/// The infrastructure machine of a Cluster API `Machine`, made by one of our providers.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct MCMMachine {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Desired state.
    #[serde(default)]
    pub spec: MCMMachineSpec,
    /// Observed state, written by the controller.
    #[serde(default)]
    pub status: Option<MCMMachineStatus>,
}

kind!(MCMMachine, kind = "MCMMachine", plural = "mcmmachines", list = MCMMachineList, fields = {
    metadata: "metadata",
    spec: "spec",
    status: "status" skip_if Option::is_none,
});

/// Desired state of an `MCMMachine`. Exactly one source of provider configuration: `classRef`, or `providerSpec`
/// (with `secretRef`, as a MachineClass has them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MCMMachineSpec {
    /// The provider's ID of the VM; matches the Node's `spec.providerID`. Set by the controller once the VM exists.
    #[serde(rename = "providerID", default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The failure domain the machine runs in (tolerated for v1beta1 compatibility; prefer the Machine's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// A MachineClass of machine.sapcloud.io in the same namespace: its providerSpec, secretRef and
    /// credentialsSecretRef are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_ref: Option<ClassReference>,
    /// Inline provider configuration, passed to the provider unchanged (instead of `classRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "mcm_api::crd::preserve_unknown_object")]
    pub provider_spec: Option<serde_json::Value>,
    /// With `providerSpec`: the secret with the provider credentials (as a MachineClass's `secretRef`). Its
    /// `userData` is replaced by the bootstrap data of the Cluster API Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretReference>,
    /// With `providerSpec`: a secret whose keys override those of `secretRef` (as a MachineClass's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretReference>,
}

/// A reference to a MachineClass in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClassReference {
    /// The MachineClass's name.
    pub name: String,
}

/// Observed state of an `MCMMachine`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MCMMachineStatus {
    /// The VM exists and is ready (v1beta1 contract).
    #[serde(default)]
    pub ready: bool,
    /// Initialization state (v1beta2 contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Addresses of the VM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    /// A terminal problem, for programs (once set, the controller stops: delete and recreate the Machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// A terminal problem, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// The failure domain the VM runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Conditions in the Cluster API shape: `Ready` and `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// `status.initialization` of the v1beta2 contract.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Initialization {
    /// The infrastructure is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// One address of a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MachineAddress {
    /// `Hostname`, `ExternalIP`, `InternalIP`, `ExternalDNS` or `InternalDNS`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// A condition in the Cluster API shape.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition type (`Ready`, `Paused`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// `Error`, `Warning` or `Info` for a False condition (v1beta1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
}

/// A template of `MCMMachine` for Cluster API MachineDeployments and control planes.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct MCMMachineTemplate {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The template.
    #[serde(default)]
    pub spec: MCMMachineTemplateSpec,
}

kind!(MCMMachineTemplate, kind = "MCMMachineTemplate", plural = "mcmmachinetemplates", list = MCMMachineTemplateList, fields = {
    metadata: "metadata",
    spec: "spec",
});

/// `spec` of an `MCMMachineTemplate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MCMMachineTemplateSpec {
    /// The machines made from the template.
    pub template: MCMMachineTemplateResource,
}

/// `spec.template` of an `MCMMachineTemplate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MCMMachineTemplateResource {
    /// Labels and annotations of the machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The spec of the machines.
    pub spec: MCMMachineSpec,
}

/// Labels and annotations of templated objects (Cluster API's `ObjectMeta`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TemplateMeta {
    /// Labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
}

impl MCMMachine {
    /// The status, or an empty one.
    pub fn status_or_default(&self) -> MCMMachineStatus {
        self.status.clone().unwrap_or_default()
    }

    /// The condition of this type, if any.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }
}
