//! [`MachineSetBuilder`] and [`MachineDeploymentBuilder`]: the two kinds with a replica count, a selector and a
//! machine template, built the same way.

use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};

use super::meta::{builder, string_map};
use crate::{MachineDeployment, MachineDeploymentStatus, MachineSet, MachineSetStatus, MachineSpec};

/// Adds the replica, selector and template methods to a builder whose object (a set or a deployment) is in `$field`.
macro_rules! template_methods {
    ($field:ident) => {
        /// Sets `spec.replicas`.
        #[must_use]
        pub fn replicas(mut self, replicas: i32) -> Self {
            self.$field.spec.replicas = replicas;
            self
        }

        /// Selects machines by exactly `pairs` (`spec.selector.matchLabels`).
        #[must_use]
        pub fn selector<'a>(mut self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
            self.$field.spec.selector = Some(LabelSelector {
                match_labels: Some(string_map(pairs)),
                ..LabelSelector::default()
            });
            self
        }

        /// Sets the template's labels to exactly `pairs`.
        #[must_use]
        pub fn template_labels<'a>(mut self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
            self.$field
                .spec
                .template
                .metadata
                .get_or_insert_default()
                .labels = Some(string_map(pairs));
            self
        }

        /// Selects machines by `pairs` and makes them with those labels: [`Self::selector`] and
        /// [`Self::template_labels`] with the same pairs.
        #[must_use]
        pub fn matching<'a>(self, pairs: impl IntoIterator<Item = (&'a str, &'a str)> + Clone) -> Self {
            self.selector(pairs.clone()).template_labels(pairs)
        }

        /// Makes its machines from the MachineClass `name` (the template's `spec.class`).
        #[must_use]
        pub fn class(mut self, name: &str) -> Self {
            let class = &mut self.$field.spec.template.spec.class;
            "MachineClass".clone_into(&mut class.kind);
            name.clone_into(&mut class.name);
            self
        }

        /// Replaces the template's machine spec.
        #[must_use]
        pub fn template_spec(mut self, spec: MachineSpec) -> Self {
            self.$field.spec.template.spec = spec;
            self
        }

        /// Sets `spec.minReadySeconds`.
        #[must_use]
        pub fn min_ready_seconds(mut self, seconds: i32) -> Self {
            self.$field.spec.min_ready_seconds = seconds;
            self
        }
    };
}

builder!(
    /// Builds a [`MachineSet`]: `MachineSetBuilder::new("ms").namespace("ns").replicas(3).matching([("app", "web")])
    /// .class("small").build()`.
    MachineSetBuilder,
    set: MachineSet
);

impl MachineSetBuilder {
    template_methods!(set);

    /// Sets the status.
    #[must_use]
    pub fn status(mut self, status: MachineSetStatus) -> Self {
        self.set.status = Some(status);
        self
    }
}

builder!(
    /// Builds a [`MachineDeployment`]: `MachineDeploymentBuilder::new("md").replicas(3).matching([("pool", "a")])
    /// .strategy("RollingUpdate").max_surge(IntOrString::Int(1)).build()`.
    MachineDeploymentBuilder,
    deployment: MachineDeployment
);

impl MachineDeploymentBuilder {
    template_methods!(deployment);

    /// Sets the strategy type as written (`RollingUpdate`, `Recreate`, `OnDelete`, or a wrong one for validation).
    #[must_use]
    pub fn strategy(mut self, r#type: &str) -> Self {
        r#type.clone_into(&mut self.deployment.spec.strategy.r#type);
        self
    }

    /// Sets the rolling update's maxSurge.
    #[must_use]
    pub fn max_surge(mut self, surge: IntOrString) -> Self {
        self.deployment
            .spec
            .strategy
            .rolling_update
            .get_or_insert_default()
            .max_surge = Some(surge);
        self
    }

    /// Sets the rolling update's maxUnavailable.
    #[must_use]
    pub fn max_unavailable(mut self, unavailable: IntOrString) -> Self {
        self.deployment
            .spec
            .strategy
            .rolling_update
            .get_or_insert_default()
            .max_unavailable = Some(unavailable);
        self
    }

    /// Pauses the deployment.
    #[must_use]
    pub fn paused(mut self, paused: bool) -> Self {
        self.deployment.spec.paused = paused;
        self
    }

    /// Sets how many old sets are kept.
    #[must_use]
    pub fn revision_history_limit(mut self, limit: i32) -> Self {
        self.deployment.spec.revision_history_limit = Some(limit);
        self
    }

    /// Sets the status.
    #[must_use]
    pub fn status(mut self, status: MachineDeploymentStatus) -> Self {
        self.deployment.status = Some(status);
        self
    }
}
