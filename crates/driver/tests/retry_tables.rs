//! The retry tables in `mcm_driver::retry` are the spec's tables, row by row.
//!
//! Spec 000: "If the conditions defined below are encountered, the provider MUST return the specified machine error
//! code. The MCM MUST implement the specified error recovery behavior when it encounters the machine error code."
//! This test reads every "... Errors" table out of spec 000 (markdown) and spec 002 (plain text, which adds the
//! InitializeMachine table and the code-17 rows of section 11) and compares them with the data.
//!
//! The specification is not part of the repository. The tests that compare with it read it from `$MCM_SPEC_DIR`,
//! else from `../shared/spec` beside the workspace (where CI puts it). Without it they say so on stderr and pass,
//! unless `MCM_REQUIRE_SPEC` is set (CI sets it): then they fail. This is the one place that looks for the spec.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
};

use mcm_driver::{DriverMethod, MachineCode, retry};
use pretty_assertions::assert_eq;

/// The spec folder: `$MCM_SPEC_DIR` when set (it must exist), else `../shared/spec` relative to the workspace root
/// when it exists. `None` when there is no spec and `MCM_REQUIRE_SPEC` is unset: the caller then skips, after a line
/// on stderr (written to the process's stderr, so it shows even when the test harness captures output).
///
/// # Panics
/// When `MCM_SPEC_DIR` names no folder, or no spec is found and `MCM_REQUIRE_SPEC` is set.
fn spec_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MCM_SPEC_DIR") {
        let dir = PathBuf::from(dir);
        assert!(dir.is_dir(), "MCM_SPEC_DIR={} is not a folder", dir.display());
        return Some(dir);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let workspace = workspace.canonicalize().unwrap_or(workspace);
    // ../shared/spec relative to the workspace root.
    let beside = workspace.parent().unwrap_or(&workspace).join("shared/spec");
    if beside.is_dir() {
        return Some(beside);
    }
    let missing = format!(
        "the specification was not found (set MCM_SPEC_DIR, or put it at {}): the retry tables are not compared \
         with it",
        beside.display()
    );
    assert!(
        std::env::var_os("MCM_REQUIRE_SPEC").is_none(),
        "MCM_REQUIRE_SPEC is set and {missing}"
    );
    let _ = writeln!(std::io::stderr(), "retry_tables: skipped: {missing}");
    None
}

/// The text of the spec file whose name starts with `prefix` (for example `"000_"`) in `dir`.
///
/// # Panics
/// When the file is missing or unreadable.
fn spec_text(dir: &Path, prefix: &str) -> String {
    let entry = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("cannot list {}: {err}", dir.display()))
        .filter_map(Result::ok)
        .find(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .unwrap_or_else(|| panic!("no spec file {prefix}* in {}", dir.display()));
    std::fs::read_to_string(entry.path())
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", entry.path().display()))
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    code: MachineCode,
    condition: String,
    recovery: String,
    auto_retry: bool,
}

/// Backticks dropped, typographic apostrophes made plain, white space folded: the two spec files differ in exactly
/// these ways (one is markdown, the other was extracted from HTML).
fn normalize(text: &str) -> String {
    let plain = text.replace('`', "").replace(['\u{2019}', '\u{2018}'], "'");
    plain.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Parses a table row (`0 OK | Successful | description | recovery | N |`), with or without a leading `|`.
fn parse_row(line: &str) -> Option<Row> {
    let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
    let (number, name) = cells.first()?.split_once(' ')?;
    let number: u32 = number.parse().ok()?;
    if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        return None;
    }
    assert_eq!(cells.len(), 5, "a code row has five columns: {line:?}");
    let code =
        MachineCode::from_number(number).unwrap_or_else(|| panic!("the spec lists unknown code {number}"));
    assert_eq!(
        code.spec_name(),
        name,
        "code {number} is named {name} in the spec"
    );
    let auto_retry = match cells[4] {
        "Y" => true,
        "N" => false,
        other => panic!("Auto Retry Required is {other:?} in {line:?}"),
    };
    Some(Row {
        code,
        condition: normalize(cells[1]),
        recovery: normalize(cells[3]),
        auto_retry,
    })
}

/// Spec 000's tables: a method heading "#### `Name`", then a markdown table.
fn tables_of_spec_000(spec: &Path) -> BTreeMap<DriverMethod, Vec<Row>> {
    let mut tables: BTreeMap<DriverMethod, Vec<Row>> = BTreeMap::new();
    let mut method = None;
    for line in spec_text(spec, "000_").lines() {
        if let Some(heading) = line.strip_prefix("#### `") {
            let name = heading.trim_end_matches('`');
            method = Some(DriverMethod::from_name(name).unwrap_or_else(|| panic!("unknown method {name}")));
        } else if line.starts_with("| ")
            && let Some(row) = parse_row(line)
        {
            let method = method.expect("a code table before any method heading");
            tables.entry(method).or_default().push(row);
        }
    }
    tables
}

/// Spec 002's tables: a line "<Method> Errors", then plain rows.
fn tables_of_spec_002(spec: &Path) -> BTreeMap<DriverMethod, Vec<Row>> {
    let mut tables: BTreeMap<DriverMethod, Vec<Row>> = BTreeMap::new();
    let mut method = None;
    for line in spec_text(spec, "002_").lines() {
        if let Some(name) = line.strip_suffix(" Errors")
            && name.chars().all(char::is_alphanumeric)
        {
            let name = if name == "MigrateMachineClass" {
                "GenerateMachineClassForMigration"
            } else {
                name
            };
            method = DriverMethod::from_name(name);
        } else if let Some(method) = method
            && line.contains(" | ")
            && let Some(row) = parse_row(line)
        {
            tables.entry(method).or_default().push(row);
        }
    }
    tables
}

fn data_table(method: DriverMethod) -> Vec<Row> {
    retry::table(method)
        .iter()
        .map(|rule| Row {
            code: rule.code,
            condition: rule.condition.to_owned(),
            recovery: rule.recovery.to_owned(),
            auto_retry: rule.auto_retry,
        })
        .collect()
}

#[test]
fn every_method_table_matches_the_spec_row_by_row() {
    let Some(spec) = spec_dir() else { return };
    let spec_000 = tables_of_spec_000(&spec);
    let spec_002 = tables_of_spec_002(&spec);
    for method in DriverMethod::ALL {
        // Spec 000 is the contract; spec 002 section 11 adds InitializeMachine and rows for codes 000 lacks.
        let mut expected = spec_000.get(&method).cloned().unwrap_or_default();
        for row in spec_002.get(&method).into_iter().flatten() {
            if !expected.iter().any(|known| known.code == row.code) {
                expected.push(row.clone());
            }
        }
        assert!(
            !expected.is_empty(),
            "the spec has no table for {}",
            method.name()
        );
        assert_eq!(data_table(method), expected, "table of {}", method.name());
    }
}

#[test]
fn spec_002_agrees_with_spec_000_where_both_list_a_code() {
    let Some(spec) = spec_dir() else { return };
    let spec_000 = tables_of_spec_000(&spec);
    let spec_002 = tables_of_spec_002(&spec);
    assert!(
        spec_002.contains_key(&DriverMethod::InitializeMachine),
        "spec 002 has the InitializeMachine table"
    );
    for (method, rows) in &spec_002 {
        for row in rows {
            if let Some(known) = spec_000
                .get(method)
                .into_iter()
                .flatten()
                .find(|known| known.code == row.code)
            {
                assert_eq!(
                    (known.auto_retry, &known.condition),
                    (row.auto_retry, &row.condition),
                    "{} code {}",
                    method.name(),
                    row.code
                );
            }
        }
    }
}

#[test]
fn section_11_adds_uninitialized_to_initialize_and_get_machine_status() {
    let initialize = retry::rule_for(DriverMethod::InitializeMachine, MachineCode::Uninitialized).unwrap();
    assert!(
        initialize.auto_retry,
        "InitializeMachine 17: 'Initialization is reattempted', Auto Retry Y"
    );
    let status = retry::rule_for(DriverMethod::GetMachineStatus, MachineCode::Uninitialized).unwrap();
    assert!(!status.auto_retry);
    // Spec 002 section 11: NotFound and Unimplemented skip initialization.
    for code in [MachineCode::NotFound, MachineCode::Unimplemented] {
        let rule = retry::rule_for(DriverMethod::InitializeMachine, code).unwrap();
        assert!(
            rule.recovery.starts_with("Skip Initialization"),
            "{code}: {}",
            rule.recovery
        );
    }
}

#[test]
fn codes_no_table_lists_are_never_auto_retried() {
    for method in DriverMethod::ALL {
        for code in MachineCode::ALL {
            if retry::rule_for(method, code).is_none() {
                assert!(!retry::auto_retry(method, code), "{} {code}", method.name());
            }
        }
    }
}
