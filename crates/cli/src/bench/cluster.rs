//! Where the benchmark runs: a fresh embedded API server in this process (in memory or on disk in a temporary
//! directory), whose controllers get an identity of their own from a static token file; or any cluster given by a
//! kubeconfig, in a namespace of its own created for the run and deleted afterwards.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::Read,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};

/// The user the controllers authenticate as on the embedded server (static token file, group `system:masters`).
pub(super) const CONTROLLERS_USER: &str = "mcm-controllers";

/// Requests counted by the server: user → `"<verb> <resource>"` → count.
pub(super) type Counts = BTreeMap<String, BTreeMap<String, u64>>;

/// The cluster of one benchmark run.
pub(super) struct Cluster {
    /// What it is, for the report: `embedded in-memory`, `embedded on disk (<dir>)` or `kubeconfig <url>`.
    pub(super) description: String,
    /// The namespace of the benchmark's objects (and of the controllers).
    pub(super) namespace: String,
    /// The admin's client (the benchmark driver).
    pub(super) client: kube::Client,
    /// The kubeconfig of the benchmark driver and the sim provider.
    pub(super) admin_kubeconfig: PathBuf,
    /// The kubeconfig `mcm run` gets: its own identity on the embedded server, the given one otherwise.
    pub(super) controllers_kubeconfig: PathBuf,
    /// The user whose requests are the controllers'.
    pub(super) controllers_user: String,
    /// A private scratch directory (logs, socket, kubeconfigs, the embedded server's data); removed at the end.
    pub(super) dir: PathBuf,
    server: Option<mcm_apiserver::ApiServer>,
    created_namespace: bool,
}

/// A private temporary directory named for this process.
fn scratch_dir() -> anyhow::Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("mcm-bench-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("securing {}", dir.display()))?;
    Ok(dir)
}

/// 32 random hex digits from the kernel.
fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    }))
}

/// A copy of a kubeconfig written by the embedded server with another bearer token.
fn with_token(kubeconfig: &str, token: &str) -> String {
    kubeconfig
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed.starts_with("token:") {
                let indent = &line[..line.len() - trimmed.len()];
                format!("{indent}token: \"{token}\"")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("securing {}", path.display()))
}

impl Cluster {
    /// Starts a fresh embedded API server (Events expiring after `event_ttl`) with a static token file giving the
    /// controllers their own user.
    pub(super) async fn embedded(in_memory: bool, event_ttl: Duration) -> anyhow::Result<Self> {
        let dir = scratch_dir()?;
        let token = random_token()?;
        let token_file = dir.join("tokens.csv");
        write_private(
            &token_file,
            &format!("{token},{CONTROLLERS_USER},{CONTROLLERS_USER},\"system:masters\"\n"),
        )?;
        let mut config = mcm_apiserver::Config::new(dir.join("apiserver"));
        config.in_memory = in_memory;
        config.token_auth_file = Some(token_file);
        config.event_ttl = event_ttl;
        let server = mcm_apiserver::ApiServer::start(config)
            .await
            .context("starting the embedded API server")?;
        let admin_kubeconfig = server.kubeconfig().to_path_buf();
        let admin = std::fs::read_to_string(&admin_kubeconfig).context("reading the admin kubeconfig")?;
        let controllers_kubeconfig = dir.join("controllers.kubeconfig");
        write_private(&controllers_kubeconfig, &with_token(&admin, &token))?;
        let client = crate::client::from_kubeconfig(&admin_kubeconfig).await?;
        let description = if in_memory {
            "embedded in-memory".to_owned()
        } else {
            format!("embedded on disk ({})", dir.join("apiserver").display())
        };
        Ok(Self {
            description,
            namespace: "default".into(),
            client,
            admin_kubeconfig,
            controllers_kubeconfig,
            controllers_user: CONTROLLERS_USER.into(),
            dir,
            server: Some(server),
            created_namespace: false,
        })
    }

    /// Uses the cluster of `kubeconfig` in a namespace created for this run. The controllers share the kubeconfig's
    /// identity with the driver and the sim provider.
    pub(super) async fn external(kubeconfig: &Path) -> anyhow::Result<Self> {
        let dir = scratch_dir()?;
        let client = crate::client::from_kubeconfig(kubeconfig).await?;
        let namespace = format!("mcm-bench-{}", &random_token()?[..8]);
        create_namespace(&client, &namespace).await?;
        let url = kube::config::Kubeconfig::read_from(kubeconfig)
            .ok()
            .and_then(|k| k.clusters.into_iter().next())
            .and_then(|c| c.cluster.and_then(|c| c.server))
            .unwrap_or_default();
        let user = Self::whoami(&client).await.unwrap_or_default();
        Ok(Self {
            description: format!("kubeconfig {url}"),
            namespace,
            client,
            admin_kubeconfig: kubeconfig.to_path_buf(),
            controllers_kubeconfig: kubeconfig.to_path_buf(),
            controllers_user: user,
            dir,
            server: None,
            created_namespace: true,
        })
    }

    /// The user of this client as the server counts it: the one user with requests in `/debug/requests` right after
    /// a request of ours, if the server has that endpoint (an `mcm apiserver`).
    async fn whoami(client: &kube::Client) -> anyhow::Result<String> {
        let body = Self::debug_requests(client).await?;
        let users: std::collections::BTreeSet<&str> = body
            .iter()
            .filter(|r| r["verb"] == "create" && r["resource"] == "namespaces")
            .filter_map(|r| r["user"].as_str())
            .collect();
        match users.len() {
            1 => Ok(users.into_iter().next().unwrap_or_default().to_owned()),
            _ => bail!("cannot tell which user this kubeconfig is"),
        }
    }

    async fn debug_requests(client: &kube::Client) -> anyhow::Result<Vec<serde_json::Value>> {
        let request = http::Request::get("/debug/requests")
            .body(Vec::new())
            .context("building GET /debug/requests")?;
        let text = client
            .request_text(request)
            .await
            .context("GET /debug/requests")?;
        let value: serde_json::Value = serde_json::from_str(&text).context("the body of /debug/requests")?;
        Ok(value.as_array().cloned().unwrap_or_default())
    }

    /// The requests counted so far per user (all namespaces on the embedded server, this run's namespace and the
    /// cluster-scoped ones otherwise). None when the server does not count requests.
    pub(super) async fn counts(&self) -> Option<Counts> {
        let mut counts = Counts::new();
        if let Some(server) = &self.server {
            for (key, n) in server.requests().snapshot() {
                *counts
                    .entry(key.user)
                    .or_default()
                    .entry(format!("{} {}", key.verb, key.resource))
                    .or_default() += n;
            }
            return Some(counts);
        }
        let list = Self::debug_requests(&self.client).await.ok()?;
        for record in list {
            let namespace = record["namespace"].as_str().unwrap_or_default();
            if !namespace.is_empty() && namespace != self.namespace {
                continue;
            }
            let (Some(user), Some(verb), Some(resource), Some(n)) = (
                record["user"].as_str(),
                record["verb"].as_str(),
                record["resource"].as_str(),
                record["count"].as_u64(),
            ) else {
                continue;
            };
            *counts
                .entry(user.to_owned())
                .or_default()
                .entry(format!("{verb} {resource}"))
                .or_default() += n;
        }
        Some(counts)
    }

    /// What the embedded server stores now; None against a kubeconfig's cluster.
    pub(super) fn store_figures(&self) -> Option<StoreFigures> {
        let server = self.server.as_ref()?;
        let counts = server.store().counts();
        let events = mcm_apiserver::event_ttl::EVENT_RESOURCES
            .iter()
            .filter_map(|resource| counts.get(*resource))
            .sum();
        #[allow(clippy::cast_precision_loss)] // a store's size fits f64 well enough for MiB with two decimals
        let disk_mib = std::fs::metadata(self.dir.join("apiserver").join(mcm_apiserver::server::STORE_FILE))
            .ok()
            .map(|m| (m.len() as f64 / 1_048_576.0 * 100.0).round() / 100.0);
        Some(StoreFigures {
            objects: counts.values().sum(),
            events,
            disk_mib,
        })
    }

    /// Stops the embedded server or deletes the run's namespace, and removes the scratch directory.
    pub(super) async fn finish(self) {
        if self.created_namespace {
            let namespaces: Api<Namespace> = Api::all(self.client.clone());
            if let Err(err) = namespaces.delete(&self.namespace, &DeleteParams::default()).await {
                eprintln!(
                    "mcm bench: could not delete the namespace {}: {err}",
                    self.namespace
                );
            }
        }
        if let Some(server) = self.server {
            server.shutdown().await;
        }
        // Give the children a moment to release files under the directory.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the embedded server stores at one moment.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub(super) struct StoreFigures {
    /// Objects of every resource.
    pub(super) objects: usize,
    /// Of which Events (both API groups).
    pub(super) events: usize,
    /// Size of the server's database file; none in memory.
    pub(super) disk_mib: Option<f64>,
}

/// `after - before` for one user.
pub(super) fn difference(before: &Counts, after: &Counts, user: &str) -> BTreeMap<String, u64> {
    let empty = BTreeMap::new();
    let old = before.get(user).unwrap_or(&empty);
    after
        .get(user)
        .unwrap_or(&empty)
        .iter()
        .filter_map(|(kind, n)| {
            let delta = n.saturating_sub(old.get(kind).copied().unwrap_or_default());
            (delta > 0).then(|| (kind.clone(), delta))
        })
        .collect()
}

/// Writes in a `"<verb> <resource>"` map: every verb but get, list and watch.
pub(super) fn writes(requests: &BTreeMap<String, u64>) -> u64 {
    requests
        .iter()
        .filter(|(kind, _)| {
            kind.split_once(' ')
                .is_some_and(|(verb, _)| mcm_apiserver::requests::is_write(verb))
        })
        .map(|(_, n)| n)
        .sum()
}

/// Creates the namespace `name` (the run's, or the ceiling's scratch namespace).
pub(super) async fn create_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let object: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating the namespace {name}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_only_the_token() {
        let text = "users:\n- name: admin\n  user:\n    token: \"old\"\ncurrent-context: mcm\n";
        assert_eq!(
            with_token(text, "new"),
            "users:\n- name: admin\n  user:\n    token: \"new\"\ncurrent-context: mcm\n"
        );
    }

    #[test]
    fn differences_count_writes_per_user() {
        let before: Counts = [(
            "c".to_owned(),
            [("create machines".to_owned(), 2), ("list machines".to_owned(), 1)].into(),
        )]
        .into();
        let after: Counts = [(
            "c".to_owned(),
            [
                ("create machines".to_owned(), 5),
                ("list machines".to_owned(), 1),
                ("watch nodes".to_owned(), 4),
                ("patch machines/status".to_owned(), 7),
            ]
            .into(),
        )]
        .into();
        let delta = difference(&before, &after, "c");
        assert_eq!(delta.len(), 3);
        assert_eq!(writes(&delta), 10);
        assert!(difference(&before, &after, "other").is_empty());
    }
}
