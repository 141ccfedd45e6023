//! `mcm examples`: the repository's example manifests (`examples/local`, `examples/sim`, `examples/aws`), built into the binary so
//! that `mcm examples local | kubectl apply -f -` works from any directory, and so that `mcm provider test` has a
//! class and a secret to use when none is given.

use std::{
    fmt::Write as _,
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Context;
use clap::{Args, ValueEnum};

/// One example file.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Example {
    /// The file name, such as `00-secret.yaml`.
    pub(crate) name: &'static str,
    /// Its text, exactly as in the repository.
    pub(crate) text: &'static str,
}

/// Embeds `examples/<set>/<file>` for each file named.
macro_rules! examples {
    ($set:literal: $($file:literal),+ $(,)?) => {
        &[$(Example {
            name: $file,
            text: include_str!(concat!("../../../examples/", $set, "/", $file)),
        }),+]
    };
}

/// A set of examples: the manifests of one provider, in the order they are applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Set {
    /// For `mcm up` (the local provider: machines are local process trees).
    Local,
    /// For `mcm run --provider sim` (in-memory VMs with simulated kubelets).
    Sim,
    /// For `mcm run --provider aws` (EC2 instances from a Gardener-shaped AWS MachineClass).
    Aws,
}

impl Set {
    /// Every set, in the order listed.
    const ALL: [Self; 3] = [Self::Local, Self::Sim, Self::Aws];

    /// The folder name under `examples/`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Sim => "sim",
            Self::Aws => "aws",
        }
    }

    /// The manifests, in the order they are applied.
    pub(crate) fn manifests(self) -> &'static [Example] {
        match self {
            Self::Local => examples!("local":
                "00-secret.yaml",
                "01-machine-class.yaml",
                "02-machine-class-medium.yaml",
                "10-machine.yaml",
                "20-machine-set.yaml",
                "30-machine-deployment.yaml",
            ),
            Self::Sim => examples!("sim":
                "00-secret.yaml",
                "01-machine-class.yaml",
                "10-machine.yaml",
                "20-machine-set.yaml",
                "30-machine-deployment.yaml",
            ),
            Self::Aws => examples!("aws":
                "00-secret.yaml",
                "01-machine-class.yaml",
                "30-machine-deployment.yaml",
            ),
        }
    }

    /// The set's README.
    fn readme(self) -> &'static str {
        match self {
            Self::Local => include_str!("../../../examples/local/README.md"),
            Self::Sim => include_str!("../../../examples/sim/README.md"),
            Self::Aws => include_str!("../../../examples/aws/README.md"),
        }
    }

    /// The manifest named `file` (with or without `.yaml`).
    pub(crate) fn manifest(self, file: &str) -> anyhow::Result<Example> {
        let wanted = file.strip_suffix(".yaml").unwrap_or(file);
        self.manifests()
            .iter()
            .find(|example| example.name.strip_suffix(".yaml") == Some(wanted))
            .copied()
            .with_context(|| {
                format!(
                    "FILE: no example {file:?} in {} (known: {})",
                    self.name(),
                    self.manifests()
                        .iter()
                        .map(|example| example.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
    }
}

/// `mcm examples`.
#[derive(Debug, Args)]
pub(crate) struct ExamplesArgs {
    /// Which examples: `local` (for `mcm up`) or `sim` (for `mcm run --provider sim`). Default: local; with --list,
    /// both.
    #[arg(value_enum)]
    set: Option<Set>,
    /// Only these files (such as `00-secret.yaml` or `00-secret`), in the order given. Default: all, in order.
    #[arg(value_name = "FILE")]
    files: Vec<String>,
    /// List the files with the object each holds instead of printing them.
    #[arg(long, conflicts_with = "dir")]
    list: bool,
    /// Write the files (and the set's README.md) into this directory, created if needed, instead of printing them.
    /// Files of the same names are replaced.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Runs `mcm examples`.
pub(crate) fn main(args: &ExamplesArgs) -> anyhow::Result<()> {
    let selected = |set: Set| -> anyhow::Result<Vec<Example>> {
        if args.files.is_empty() {
            Ok(set.manifests().to_vec())
        } else {
            args.files.iter().map(|file| set.manifest(file)).collect()
        }
    };
    let text = if args.list {
        let sets = match args.set {
            Some(set) => vec![set],
            None => Set::ALL.to_vec(),
        };
        let mut out = String::new();
        for set in sets {
            for example in selected(set)? {
                let _ = writeln!(out, "{}/{}\t{}", set.name(), example.name, describe(example.text));
            }
        }
        out
    } else {
        let set = args.set.unwrap_or(Set::Local);
        let examples = selected(set)?;
        if let Some(dir) = &args.dir {
            return write_into(dir, set, &examples);
        }
        join(set, &examples)
    };
    print(&text)
}

/// The manifests as one multi-document YAML stream (`---` between files), as `kubectl apply -f -` reads it.
pub(crate) fn join(set: Set, examples: &[Example]) -> String {
    let mut out = String::new();
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let _ = writeln!(out, "# examples/{}/{}", set.name(), example.name);
        out.push_str(example.text);
        if !example.text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// `Kind namespace/name` of a manifest, read from its YAML (`?` where a field is missing).
fn describe(text: &str) -> String {
    let value: serde_json::Value = serde_saphyr::from_str(text).unwrap_or_default();
    let field = |path: &[&str]| {
        path.iter()
            .try_fold(&value, |v, key| v.get(key))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("?")
            .to_owned()
    };
    format!(
        "{} {}/{}",
        field(&["kind"]),
        field(&["metadata", "namespace"]),
        field(&["metadata", "name"])
    )
}

fn write_into(dir: &Path, set: Set, examples: &[Example]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--dir: creating {}", dir.display()))?;
    let mut written = Vec::new();
    for (name, text) in examples
        .iter()
        .map(|example| (example.name, example.text))
        .chain([("README.md", set.readme())])
    {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("--dir: writing {}", path.display()))?;
        written.push(path.display().to_string());
    }
    print(&format!(
        "mcm examples: wrote {}\napply them with: kubectl apply -f {}\n",
        written.join(", "),
        dir.display()
    ))
}

/// Writes to standard output; a reader that went away (`| head`) is not an error.
fn print(text: &str) -> anyhow::Result<()> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result.context("writing to standard output"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every YAML file of `examples/<set>` is built in, in file-name order, and nothing else.
    #[test]
    fn every_example_file_is_built_in() {
        for set in Set::ALL {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../examples")
                .join(set.name());
            let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
                .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
                .collect();
            on_disk.sort();
            let built_in: Vec<&str> = set.manifests().iter().map(|example| example.name).collect();
            assert_eq!(on_disk, built_in, "examples/{}", set.name());
        }
    }

    /// Folders of `examples/` that are not built in, each for a reason: `providers` holds providers written in other
    /// languages (source, generated stubs, requirements), run from a checkout, not manifests to apply.
    const NOT_BUILT_IN: [&str; 1] = ["providers"];

    /// Every folder of `examples/` is a set built in, or left out on purpose ([`NOT_BUILT_IN`]).
    #[test]
    fn every_example_folder_is_built_in_or_left_out_on_purpose() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut folders: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.is_dir())
            .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        folders.sort();
        let mut known: Vec<&str> = Set::ALL
            .iter()
            .map(|set| set.name())
            .chain(NOT_BUILT_IN)
            .collect();
        known.sort_unstable();
        assert_eq!(folders, known);
    }

    #[test]
    fn a_file_is_found_with_or_without_its_extension_and_an_unknown_one_is_named() {
        assert_eq!(Set::Local.manifest("00-secret").unwrap().name, "00-secret.yaml");
        assert_eq!(
            Set::Sim.manifest("10-machine.yaml").unwrap().name,
            "10-machine.yaml"
        );
        let err = Set::Sim
            .manifest("02-machine-class-medium")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"02-machine-class-medium\"") && err.contains("in sim"),
            "{err}"
        );
        assert!(err.contains("00-secret.yaml"), "lists the known files: {err}");
    }

    #[test]
    fn the_list_names_each_object() {
        assert_eq!(
            describe(Set::Local.manifest("00-secret").unwrap().text),
            "Secret default/local-worker"
        );
        assert_eq!(
            describe(Set::Sim.manifest("01-machine-class").unwrap().text),
            "MachineClass default/sim-small"
        );
    }
}
