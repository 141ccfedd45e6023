//! Identity of the four kinds (group, version, kind, plural) and their wire envelope (`apiVersion` and `kind`).

/// API group of the four kinds.
pub const GROUP: &str = "machine.sapcloud.io";
/// API version of the four kinds.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the four kinds.
pub const API_VERSION: &str = "machine.sapcloud.io/v1alpha1";

/// Implements the k8s-openapi resource traits (and so `kube::Resource`) for a namespaced kind of this group, and a
/// `Serialize` that writes `apiVersion` and `kind` before the listed fields. Deserialization is derived and ignores
/// `apiVersion` and `kind`, as kube-derive's types do.
macro_rules! namespaced_kind {
    ($ty:ident, kind = $kind:literal, plural = $plural:literal, fields = { $($field:ident : $json:literal $(skip_if $cond:path)?),* $(,)? }) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = $crate::resource::API_VERSION;
            const GROUP: &'static str = $crate::resource::GROUP;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $crate::resource::VERSION;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = k8s_openapi::NamespaceResourceScope;
        }

        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("apiVersion", $crate::resource::API_VERSION)?;
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
    };
}

pub(crate) use namespaced_kind;

/// Deserializes an optional string enum, reading an empty string as absent (Go writes `""` for "not set").
pub(crate) fn empty_as_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::{Deserialize, de::IntoDeserializer};
    match Option::<String>::deserialize(deserializer)? {
        None => Ok(None),
        Some(text) if text.is_empty() => Ok(None),
        Some(text) => T::deserialize(text.into_deserializer()).map(Some),
    }
}
