//! The retry tables in `mcm_driver::retry` are the spec's tables, row by row.
//!
//! Spec 000: "If the conditions defined below are encountered, the provider MUST return the specified machine error
//! code. The MCM MUST implement the specified error recovery behavior when it encounters the machine error code."
//! This test reads every "... Errors" table out of spec 000 (markdown) and spec 002 (plain text, which adds the
//! InitializeMachine table and the code-17 rows of section 11) and compares them with the data.

use std::collections::BTreeMap;

use mcm_driver::{DriverMethod, MachineCode, retry};
use pretty_assertions::assert_eq;

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
fn tables_of_spec_000() -> BTreeMap<DriverMethod, Vec<Row>> {
    let mut tables: BTreeMap<DriverMethod, Vec<Row>> = BTreeMap::new();
    let mut method = None;
    for line in mcm_testkit::spec_text("000_").lines() {
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
fn tables_of_spec_002() -> BTreeMap<DriverMethod, Vec<Row>> {
    let mut tables: BTreeMap<DriverMethod, Vec<Row>> = BTreeMap::new();
    let mut method = None;
    for line in mcm_testkit::spec_text("002_").lines() {
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
    let spec_000 = tables_of_spec_000();
    let spec_002 = tables_of_spec_002();
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
    let spec_000 = tables_of_spec_000();
    let spec_002 = tables_of_spec_002();
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
