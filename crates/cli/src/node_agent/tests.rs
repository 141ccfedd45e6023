//! Unit tests of the node agent's pure parts: flags, tokens, condition files and merging, certificates, host names.

use std::collections::BTreeMap;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use mcm_core::node_report::condition;

use super::{
    conditions::{FILE_REASON, FileCondition, merged_conditions, read_condition_files, reported_conditions},
    credentials::{certificate_of, pem_blocks, to_pem},
    host::{go_arch, go_os},
    settings::{Token, TokenArg, is_quantity},
};

#[test]
fn quantities_are_recognized() {
    for good in ["2", "500m", "4Gi", "1.5", "16318412Ki", "1e3", "+1", "0.5G"] {
        assert!(is_quantity(good), "{good}");
    }
    for bad in ["", "Gi", "4 Gi", "4GB", "1..2", "abc", "1e"] {
        assert!(!is_quantity(bad), "{bad}");
    }
}

#[test]
fn tokens_have_the_bootstrap_shape() {
    assert!(Token::parse("abcdef.0123456789abcdef").is_some());
    for bad in [
        "abcdef",
        "abcde.0123456789abcdef",
        "ABCDEF.0123456789abcdef",
        "<<BOOTSTRAP_TOKEN>>",
    ] {
        assert!(Token::parse(bad).is_none(), "{bad}");
    }
    assert_eq!(
        format!("{:?}", TokenArg("abcdef.0123456789abcdef".into())),
        "[redacted]"
    );
}

#[test]
fn files_override_built_ins_and_add_conditions_and_others_are_kept() {
    let files = BTreeMap::from([
        (
            "Ready".to_owned(),
            FileCondition {
                status: "False".into(),
                path: "/m/conditions/Ready".into(),
            },
        ),
        (
            "KernelDeadlock".to_owned(),
            FileCondition {
                status: "True".into(),
                path: "/m/conditions/KernelDeadlock".into(),
            },
        ),
    ]);
    let reported = reported_conditions(&files);
    let types: Vec<&str> = reported.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        [
            "MemoryPressure",
            "DiskPressure",
            "PIDPressure",
            "Ready",
            "KernelDeadlock"
        ]
    );
    assert_eq!(reported[3].status, "False");
    assert_eq!(reported[3].reason.as_deref(), Some(FILE_REASON));
    let then = Timestamp::from_second(1_000).unwrap();
    let now = Timestamp::from_second(2_000).unwrap();
    let mut stale = condition(
        "OldFile",
        "True",
        FILE_REASON,
        "set by the file /m/conditions/OldFile",
    );
    stale.last_transition_time = Some(Time(then));
    let mut foreign = condition("NetworkUnavailable", "False", "RouteCreated", "routes");
    foreign.last_transition_time = Some(Time(then));
    let mut ready = condition("MemoryPressure", "False", "x", "y");
    ready.last_transition_time = Some(Time(then));
    let merged = merged_conditions(&[stale, foreign.clone(), ready], &reported, now);
    let types: Vec<&str> = merged.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        [
            "MemoryPressure",
            "DiskPressure",
            "PIDPressure",
            "Ready",
            "KernelDeadlock",
            "NetworkUnavailable"
        ]
    );
    assert_eq!(
        merged[0].last_transition_time,
        Some(Time(then)),
        "unchanged status keeps its transition"
    );
    assert_eq!(merged[0].last_heartbeat_time, Some(Time(now)));
    assert_eq!(merged[3].last_transition_time, Some(Time(now)));
    assert_eq!(merged[5], foreign);
}

#[test]
fn condition_files_are_read_and_bad_ones_reported() {
    let dir = std::env::temp_dir().join(format!("mcm-node-agent-unit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("KernelDeadlock"), "True\n").unwrap();
    std::fs::write(dir.join("Ready"), " False ").unwrap();
    std::fs::write(dir.join("Broken"), "maybe").unwrap();
    std::fs::write(dir.join(".hidden"), "True").unwrap();
    std::fs::write(dir.join("bad~name"), "True").unwrap();
    let mut problems = BTreeMap::new();
    let files = read_condition_files(&dir, &mut problems);
    let _ = std::fs::remove_dir_all(&dir);
    let statuses: Vec<(&str, &str)> = files
        .iter()
        .map(|(t, f)| (t.as_str(), f.status.as_str()))
        .collect();
    assert_eq!(statuses, [("KernelDeadlock", "True"), ("Ready", "False")]);
    assert_eq!(problems.len(), 2, "{problems:?}");
}

#[test]
fn pem_and_der_of_a_generated_certificate_are_read() {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:n1");
    params.not_after = rcgen::date_time_ymd(2040, 5, 6);
    let cert = params.self_signed(&key).unwrap();
    let info = certificate_of(&cert.pem()).unwrap();
    assert_eq!(info.common_name.as_deref(), Some("system:node:n1"));
    assert_eq!(info.not_after.to_string(), "2040-05-06T00:00:00Z");
    assert_eq!(
        info.public_key_info,
        rcgen::PublicKeyData::subject_public_key_info(&key)
    );
    let blocks = pem_blocks(&format!("{}{}", key.serialize_pem(), cert.pem()));
    assert_eq!(blocks.len(), 2);
    assert_eq!(
        to_pem(&blocks[1].0, &blocks[1].1),
        cert.pem().replace("\r\n", "\n")
    );
}

#[test]
fn architecture_uses_go_names() {
    if cfg!(target_arch = "x86_64") {
        assert_eq!(go_arch(), "amd64");
    }
    assert_eq!(go_os(), "linux");
}
