//! The metadata calls every builder has (name, namespace, uid, labels, owners, timestamps), written once as a macro
//! so that each builder offers them as its own methods.

use std::collections::BTreeMap;

use k8s_openapi::{
    Metadata, Resource,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};

/// `pairs` as the string map labels, annotations and selectors are.
pub(crate) fn string_map<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, String> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Adds `key=value` to an optional map, creating it when absent.
pub(crate) fn insert(map: &mut Option<BTreeMap<String, String>>, key: &str, value: &str) {
    map.get_or_insert_default()
        .insert(key.to_owned(), value.to_owned());
}

/// The controller owner reference to `owner`, as a Kubernetes controller writes it (`controller` and
/// `blockOwnerDeletion` true), from the owner's kind, name and uid.
pub fn controller_reference<K>(owner: &K) -> OwnerReference
where
    K: Resource + Metadata<Ty = ObjectMeta>,
{
    let meta = owner.metadata();
    OwnerReference {
        api_version: K::API_VERSION.to_owned(),
        kind: K::KIND.to_owned(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Declares a builder `$builder` of `$object` (kept in the field `$field`) with `new(name)` and the metadata methods;
/// the builder's own methods go in a second `impl` block.
macro_rules! builder {
    ($(#[$doc:meta])* $builder:ident, $field:ident : $object:ty) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $builder {
            $field: $object,
        }

        impl $builder {
            /// An object named `name` and nothing else.
            pub fn new(name: &str) -> Self {
                let mut $field = <$object>::default();
                $field.metadata.name = Some(name.to_owned());
                Self { $field }
            }

            $crate::builders::meta::metadata_methods!($field: $object);
        }
    };
}

pub(crate) use builder;

/// Adds the metadata methods, `with` and `build` to a builder whose `$object` (with a `metadata: ObjectMeta`) is in
/// the field `$field`.
macro_rules! metadata_methods {
    ($field:ident : $object:ty) => {
        /// Sets the namespace.
        #[must_use]
        pub fn namespace(mut self, namespace: &str) -> Self {
            self.$field.metadata.namespace = Some(namespace.to_owned());
            self
        }

        /// Sets the uid.
        #[must_use]
        pub fn uid(mut self, uid: &str) -> Self {
            self.$field.metadata.uid = Some(uid.to_owned());
            self
        }

        /// Sets the resourceVersion.
        #[must_use]
        pub fn resource_version(mut self, version: &str) -> Self {
            self.$field.metadata.resource_version = Some(version.to_owned());
            self
        }

        /// Sets the generation.
        #[must_use]
        pub fn generation(mut self, generation: i64) -> Self {
            self.$field.metadata.generation = Some(generation);
            self
        }

        /// Adds one label.
        #[must_use]
        pub fn label(mut self, key: &str, value: &str) -> Self {
            $crate::builders::meta::insert(&mut self.$field.metadata.labels, key, value);
            self
        }

        /// Sets the labels to exactly `pairs` (an empty list gives an empty, present map).
        #[must_use]
        pub fn labels<'a>(mut self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
            self.$field.metadata.labels = Some($crate::builders::meta::string_map(pairs));
            self
        }

        /// Adds one annotation.
        #[must_use]
        pub fn annotation(mut self, key: &str, value: &str) -> Self {
            $crate::builders::meta::insert(&mut self.$field.metadata.annotations, key, value);
            self
        }

        /// Sets the annotations to exactly `pairs` (an empty list gives an empty, present map).
        #[must_use]
        pub fn annotations<'a>(mut self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
            self.$field.metadata.annotations = Some($crate::builders::meta::string_map(pairs));
            self
        }

        /// Adds one finalizer.
        #[must_use]
        pub fn finalizer(mut self, finalizer: &str) -> Self {
            self.$field
                .metadata
                .finalizers
                .get_or_insert_default()
                .push(finalizer.to_owned());
            self
        }

        /// Adds an owner reference as it is given.
        #[must_use]
        pub fn owner(
            mut self,
            reference: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
        ) -> Self {
            self.$field
                .metadata
                .owner_references
                .get_or_insert_default()
                .push(reference);
            self
        }

        /// Adds the controller owner reference to `owner`
        /// ([`controller_reference`](crate::builders::controller_reference)).
        #[must_use]
        pub fn owned_by<K>(self, owner: &K) -> Self
        where
            K: k8s_openapi::Resource
                + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
        {
            self.owner($crate::builders::controller_reference(owner))
        }

        /// Sets the creationTimestamp.
        #[must_use]
        pub fn created_at(mut self, at: k8s_openapi::jiff::Timestamp) -> Self {
            self.$field.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
            self
        }

        /// Sets the deletionTimestamp: the object is being deleted since `at`.
        #[must_use]
        pub fn deleting_at(mut self, at: k8s_openapi::jiff::Timestamp) -> Self {
            self.$field.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
            self
        }

        /// Changes the object in a way no other call covers; the escape hatch for a field only one test sets.
        #[must_use]
        pub fn with(mut self, change: impl FnOnce(&mut $object)) -> Self {
            change(&mut self.$field);
            self
        }

        /// The object.
        pub fn build(self) -> $object {
            self.$field
        }
    };
}

pub(crate) use metadata_methods;
