//! The manifests of `deploy/` as the deploy tests read them (every YAML document each layout's kustomization renders
//! through `kubectl kustomize`, the Deployment's containers, the RBAC of its service account), and the RBAC rules
//! evaluated as kube-apiserver's RBAC authorizer evaluates them.
//! Used by `deploy_manifests.rs` and `deploy_rbac.rs`.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Container, PodSpec},
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
};
use serde_json::Value;

/// The name of the controller container of the Deployment.
pub const CONTROLLER: &str = "machine-controller";
/// The name of the provider sidecar.
pub const PROVIDER: &str = "provider";

/// The layouts `deploy/` ships, as (name, kustomization directory under `deploy/`): each renders, through
/// `kubectl kustomize`, everything a user applies to the control cluster for it. The base (`kubectl apply -k deploy/`)
/// comes first and alone holds the CRDs.
pub const LAYOUTS: [(&str, &str); 4] = [
    ("base", "."),
    ("single", "overlays/single"),
    ("aws-grpc", "overlays/aws-grpc"),
    ("seed-aws", "overlays/seed-aws"),
];

/// What the seed layout applies to the target cluster (its RBAC there).
pub const SEED_TARGET: &str = "overlays/seed-aws/target-cluster";

/// `deploy/` of this checkout.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The YAML documents of `text` (empty ones skipped), each tagged with `file`.
fn documents(file: &str, text: &str) -> Vec<Document> {
    let values: Vec<Value> =
        serde_saphyr::from_multiple(text).unwrap_or_else(|err| panic!("{file} is not YAML: {err}"));
    values
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|value| Document {
            file: file.to_owned(),
            value,
        })
        .collect()
}

/// One YAML document of a file of `deploy/`.
#[derive(Clone, Debug)]
pub struct Document {
    /// Where it comes from (`deploy/overlays/single`, `deploy/validating-admission-policy.yaml`).
    pub file: String,
    /// The document, as JSON.
    pub value: Value,
}

impl Document {
    /// `apiVersion`.
    pub fn api_version(&self) -> &str {
        self.value["apiVersion"].as_str().unwrap_or_default()
    }

    /// `kind`.
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// `metadata.namespace` (empty for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        self.value["metadata"]["namespace"].as_str().unwrap_or_default()
    }

    /// The typed object.
    pub fn typed<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_value(self.value.clone())
            .unwrap_or_else(|err| panic!("{} {} in {}: {err}", self.kind(), self.name(), self.file))
    }
}

/// Every manifest of `deploy/`.
pub struct Manifests {
    /// The documents, in the order kustomize (or the file) gives them.
    pub documents: Vec<Document>,
}

impl Manifests {
    /// The base: what `kubectl apply -k deploy/` applies.
    pub fn load() -> Self {
        Self::render(LAYOUTS[0].1)
    }

    /// What `kubectl kustomize deploy/<dir>` renders (the real kubectl, whose kustomize `kubectl apply -k` runs).
    pub fn render(dir: &str) -> Self {
        let mut command = std::process::Command::new("kubectl");
        command.arg("kustomize").arg(deploy_dir().join(dir));
        let output = super::Background::spawn(command, format!("kubectl kustomize deploy/{dir}"))
            .finish(super::COMMAND_DEADLINE);
        assert!(
            output.status.success(),
            "kubectl kustomize deploy/{dir}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).expect("UTF-8");
        Self {
            documents: documents(&format!("deploy/{dir}"), &text),
        }
    }

    /// The documents of one file under `deploy/` as they are written.
    pub fn file(name: &str) -> Self {
        let text = std::fs::read_to_string(deploy_dir().join(name))
            .unwrap_or_else(|err| panic!("deploy/{name}: {err}"));
        Self {
            documents: documents(&format!("deploy/{name}"), &text),
        }
    }

    /// Every layout: (its name, what it renders).
    pub fn layouts() -> Vec<(&'static str, Self)> {
        LAYOUTS
            .iter()
            .map(|(name, dir)| (*name, Self::render(dir)))
            .collect()
    }

    /// The documents of one kind.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Document> + 'a {
        self.documents.iter().filter(move |d| d.kind() == kind)
    }

    /// The one Deployment.
    pub fn deployment(&self) -> Deployment {
        let deployments: Vec<&Document> = self.of_kind("Deployment").collect();
        assert_eq!(deployments.len(), 1, "one Deployment in deploy/");
        deployments[0].typed()
    }

    /// A container of the Deployment.
    pub fn container(&self, name: &str) -> Container {
        self.deployment()
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().find(|c| c.name == name))
            .unwrap_or_else(|| panic!("the Deployment has a container {name:?}"))
    }

    /// The service account the Deployment runs as: (namespace, name).
    pub fn service_account(&self) -> (String, String) {
        let deployment = self.deployment();
        let namespace = deployment
            .metadata
            .namespace
            .clone()
            .expect("the Deployment names its namespace");
        let name = deployment
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.service_account_name)
            .expect("the Deployment names its service account");
        (namespace, name)
    }

    /// The user name of the service account (`system:serviceaccount:<namespace>:<name>`).
    pub fn service_account_user(&self) -> String {
        let (namespace, name) = self.service_account();
        format!("system:serviceaccount:{namespace}:{name}")
    }

    /// The containers of the Deployment's pod.
    pub fn containers(&self) -> Vec<Container> {
        self.deployment()
            .spec
            .and_then(|s| s.template.spec)
            .map(|s| s.containers)
            .unwrap_or_default()
    }

    /// The rules granted to the service account the Deployment runs as, through the bindings of `deploy/`.
    pub fn rbac(&self) -> Rbac {
        let (namespace, name) = self.service_account();
        Rbac::for_service_account(self, &namespace, &name)
    }
}

/// The value of a `--flag=value` or `--flag value` argument of `container`.
pub fn flag_value(container: &Container, flag: &str) -> Option<String> {
    let args = container.args.clone().unwrap_or_default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if let Some(value) = arg.strip_prefix(&format!("{flag}=")) {
            return Some(value.to_owned());
        }
        if arg == flag {
            return iter.next().cloned();
        }
    }
    None
}

/// Where a grant applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// In one namespace (a Role, or a ClusterRole bound by a RoleBinding).
    Namespace(String),
    /// Everywhere: cluster-scoped resources and every namespace (a ClusterRole bound by a ClusterRoleBinding).
    Cluster,
}

/// One rule granted to a subject, with where it applies and where it comes from.
#[derive(Clone, Debug)]
pub struct Grant {
    /// Where it applies.
    pub scope: Scope,
    /// The rule.
    pub rule: PolicyRule,
    /// `Role machine-controller-manager/x, rule 3` (for messages).
    pub source: String,
}

/// A resource request as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The API group (`""` for core).
    pub group: String,
    /// The plural.
    pub resource: String,
    /// The subresource, if any.
    pub subresource: Option<String>,
    /// The namespace; None at the cluster scope or across all namespaces.
    pub namespace: Option<String>,
    /// The object's name; None for collections and creates.
    pub name: Option<String>,
}

impl Request {
    /// From a counter of the API server: `resource` is `plural[.group][/subresource]`, namespace and name empty when
    /// the request had none.
    pub fn from_counter(verb: &str, resource: &str, namespace: &str, name: &str) -> Self {
        let (qualified, subresource) = match resource.split_once('/') {
            Some((q, sub)) => (q, Some(sub.to_owned())),
            None => (resource, None),
        };
        let (plural, group) = qualified.split_once('.').unwrap_or((qualified, ""));
        let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Self {
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: plural.to_owned(),
            subresource,
            namespace: non_empty(namespace),
            name: non_empty(name),
        }
    }

    /// `plural` or `plural/subresource`, as rules name it.
    pub fn combined(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {} ({group})", self.verb, self.combined())?;
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}")?,
            None => write!(f, " cluster-wide")?,
        }
        if let Some(name) = &self.name {
            write!(f, " name {name}")?;
        }
        Ok(())
    }
}

/// Whether `rule` allows `request`, as kube-apiserver's RBAC `RuleAllows`: the verb, the API group and the
/// resource (`plural`, `plural/subresource`, `*`, or `*/subresource`) match, and `resourceNames`, when given, holds
/// the request's name (a request without a name never matches a rule with names).
pub fn rule_allows(rule: &PolicyRule, request: &Request) -> bool {
    let any = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
    let groups = rule.api_groups.as_deref().unwrap_or_default();
    let resources = rule.resources.as_deref().unwrap_or_default();
    let combined = request.combined();
    let resource_matches = resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || request
                .subresource
                .as_ref()
                .is_some_and(|sub| *r == format!("*/{sub}"))
    });
    let names = rule.resource_names.as_deref().unwrap_or_default();
    let name_matches = names.is_empty()
        || request
            .name
            .as_ref()
            .is_some_and(|name| names.iter().any(|n| n == name));
    any(&rule.verbs, &request.verb) && any(groups, &request.group) && resource_matches && name_matches
}

/// Whether a grant applies to a request's namespace: a namespaced grant only to requests in its namespace; a
/// cluster-wide grant to all.
pub fn scope_allows(scope: &Scope, request: &Request) -> bool {
    match scope {
        Scope::Cluster => true,
        Scope::Namespace(ns) => request.namespace.as_deref() == Some(ns.as_str()),
    }
}

/// The rules of one subject.
#[derive(Clone, Debug, Default)]
pub struct Rbac {
    /// Every rule bound to the subject.
    pub grants: Vec<Grant>,
}

impl Rbac {
    /// The rules bound to the service account `namespace/name` by the RoleBindings and ClusterRoleBindings of
    /// `manifests`; a binding whose role is not in `manifests` fails the test.
    pub fn for_service_account(manifests: &Manifests, namespace: &str, name: &str) -> Self {
        let names_subject = |subjects: &[k8s_openapi::api::rbac::v1::Subject]| {
            subjects.iter().any(|s| {
                s.kind == "ServiceAccount" && s.name == name && s.namespace.as_deref() == Some(namespace)
            })
        };
        let roles: Vec<Role> = manifests.of_kind("Role").map(Document::typed).collect();
        let cluster_roles: Vec<ClusterRole> = manifests.of_kind("ClusterRole").map(Document::typed).collect();
        let cluster_role = |role: &str| {
            cluster_roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(role))
                .unwrap_or_else(|| panic!("ClusterRole {role} is in deploy/"))
        };
        let mut grants = Vec::new();
        let mut add = |scope: Scope, rules: &Option<Vec<PolicyRule>>, source: &str| {
            for (index, rule) in rules.iter().flatten().enumerate() {
                grants.push(Grant {
                    scope: scope.clone(),
                    rule: rule.clone(),
                    source: format!("{source}, rule {}", index + 1),
                });
            }
        };
        for binding in manifests.of_kind("RoleBinding") {
            let binding: RoleBinding = binding.typed();
            if !names_subject(binding.subjects.as_deref().unwrap_or_default()) {
                continue;
            }
            let ns = binding
                .metadata
                .namespace
                .clone()
                .expect("a RoleBinding has a namespace");
            let role = &binding.role_ref.name;
            match binding.role_ref.kind.as_str() {
                "Role" => {
                    let found = roles
                        .iter()
                        .find(|r| {
                            r.metadata.name.as_deref() == Some(role.as_str())
                                && r.metadata.namespace.as_deref() == Some(ns.as_str())
                        })
                        .unwrap_or_else(|| panic!("Role {ns}/{role} is in deploy/"));
                    add(
                        Scope::Namespace(ns.clone()),
                        &found.rules,
                        &format!("Role {ns}/{role}"),
                    );
                }
                "ClusterRole" => add(
                    Scope::Namespace(ns.clone()),
                    &cluster_role(role).rules,
                    &format!("ClusterRole {role} in {ns}"),
                ),
                other => panic!("RoleBinding {ns}/{role}: unknown roleRef kind {other}"),
            }
        }
        for binding in manifests.of_kind("ClusterRoleBinding") {
            let binding: ClusterRoleBinding = binding.typed();
            if !names_subject(binding.subjects.as_deref().unwrap_or_default()) {
                continue;
            }
            assert_eq!(
                binding.role_ref.kind, "ClusterRole",
                "a ClusterRoleBinding binds a ClusterRole"
            );
            let role = &binding.role_ref.name;
            add(
                Scope::Cluster,
                &cluster_role(role).rules,
                &format!("ClusterRole {role}"),
            );
        }
        Self { grants }
    }

    /// The first grant that allows `request`.
    pub fn allows(&self, request: &Request) -> Option<&Grant> {
        self.grants
            .iter()
            .find(|g| scope_allows(&g.scope, request) && rule_allows(&g.rule, request))
    }

    /// Every (grant, group, resource, verb) the rules name, one per combination (`resourceNames` kept).
    pub fn permissions(&self) -> Vec<Permission> {
        let mut out = Vec::new();
        for grant in &self.grants {
            for group in grant.rule.api_groups.iter().flatten() {
                for resource in grant.rule.resources.iter().flatten() {
                    for verb in &grant.rule.verbs {
                        out.push(Permission {
                            grant: grant.clone(),
                            group: group.clone(),
                            resource: resource.clone(),
                            verb: verb.clone(),
                        });
                    }
                }
            }
        }
        out
    }
}

/// One (group, resource, verb) of a grant.
#[derive(Clone, Debug)]
pub struct Permission {
    /// The grant it is part of.
    pub grant: Grant,
    /// The API group.
    pub group: String,
    /// `plural` or `plural/subresource`.
    pub resource: String,
    /// The verb.
    pub verb: String,
}

impl Permission {
    /// What it grants, wherever it comes from: its scope, API group, resource, verb and resourceNames.
    pub fn grants(&self) -> String {
        format!(
            "{:?} {:?} {} {} {:?}",
            self.grant.scope, self.group, self.resource, self.verb, self.grant.rule.resource_names
        )
    }

    /// Whether `request` is allowed by this one permission of the grant (its scope and resourceNames too).
    pub fn allows(&self, request: &Request) -> bool {
        let rule = PolicyRule {
            api_groups: Some(vec![self.group.clone()]),
            resources: Some(vec![self.resource.clone()]),
            verbs: vec![self.verb.clone()],
            resource_names: self.grant.rule.resource_names.clone(),
            non_resource_urls: None,
        };
        scope_allows(&self.grant.scope, request) && rule_allows(&rule, request)
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {} ({group})", self.verb, self.resource)?;
        if let Some(names) = &self.grant.rule.resource_names {
            write!(f, " names {}", names.join(","))?;
        }
        write!(f, " [{}]", self.grant.source)
    }
}

/// Where `after` lost or changed what `before` has (fields `after` added are fine: defaults of the type).
pub fn losses(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (key, value) in b {
                let path = format!("{path}.{key}");
                match a.get(key) {
                    Some(other) => losses(value, other, &path, out),
                    None => out.push(format!("{path}: unknown field (dropped by the type)")),
                }
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            for (index, (value, other)) in b.iter().zip(a).enumerate() {
                losses(value, other, &format!("{path}[{index}]"), out);
            }
        }
        _ if before == after => {}
        _ => out.push(format!("{path}: {before} became {after}")),
    }
}

/// The words of a container's args before the first flag: `run`, or `provider <name> serve`.
pub fn command(container: &Container) -> Vec<String> {
    container
        .args
        .iter()
        .flatten()
        .take_while(|a| !a.starts_with('-'))
        .cloned()
        .collect()
}

/// Whether a container runs the controllers (`mcm run`).
pub fn runs_controllers(container: &Container) -> bool {
    command(container) == ["run"]
}

/// The provider a container serves (`mcm provider <name> serve`).
pub fn serves_provider(container: &Container) -> Option<String> {
    match command(container).as_slice() {
        [provider, name, serve] if provider == "provider" && serve == "serve" => Some(name.clone()),
        _ => None,
    }
}

/// The pod spec of the Deployment.
pub fn pod(manifests: &Manifests) -> PodSpec {
    manifests
        .deployment()
        .spec
        .and_then(|s| s.template.spec)
        .expect("a pod template")
}

/// The name of the volume `container` mounts at `directory` (exactly).
pub fn mount_at(container: &Container, directory: &str) -> Option<String> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == directory)
        .map(|m| m.name.clone())
}
