//! Machines as process trees: creation starts a detached process group with the documented files and environment,
//! creation is idempotent, status and listing follow the class's tags, deletion stops the whole tree and removes the
//! machine, and a restarted provider finds its machines on disk.

mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::PermissionsExt as _,
    path::Path,
    time::{Duration, Instant},
};

use mcm_driver::{Driver as _, MachineCode};
use mcm_provider_local::{LocalMachine, env};
use pretty_assertions::assert_eq;
use support::{
    BOOT, Env, class, class_with, create, create_with, delete, delete_with, eventually, list, pgrp,
    provider_spec, running, status, status_with,
};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Waits until no process of the list runs.
async fn wait_gone(pids: &[i32]) {
    eventually(&format!("processes {pids:?} are gone"), || async {
        pids.iter().all(|&pid| !running(pid)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn creation_starts_a_detached_process_group_that_boots_from_user_data() {
    let env = Env::new();
    let answer = env.driver.create_machine(&create("m-1", BOOT)).await.unwrap();
    assert_eq!(answer.provider_id, "local:///default/m-1");
    assert_eq!(answer.node_name, "m-1");
    let addresses: Vec<(String, String)> = answer
        .addresses
        .iter()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect();
    assert_eq!(
        addresses,
        [
            ("InternalIP".to_owned(), "127.0.0.1".to_owned()),
            ("Hostname".to_owned(), "m-1".to_owned())
        ]
    );
    assert!(
        answer.last_known_state.starts_with("created"),
        "{}",
        answer.last_known_state
    );

    env.wait_log("m-1", "booted m-1").await;
    let record = env
        .driver
        .machine("default", "m-1")
        .unwrap()
        .expect("the machine exists");
    let pgid = record.pgid.expect("a process group");
    assert_eq!(record.pid, Some(pgid), "the script leads its own group");
    assert!(running(pgid));
    assert_eq!(pgrp(pgid), Some(pgid));
    assert_ne!(
        pgrp(i32::try_from(std::process::id()).unwrap()),
        Some(pgid),
        "not the test's own group"
    );
    assert!(record.is_running());
    assert_eq!(
        (
            record.machine_name.as_str(),
            record.namespace.as_str(),
            record.class_name.as_str()
        ),
        ("m-1", "default", "local-small")
    );
    assert_eq!(
        (record.vm_pool.as_str(), record.size.as_str(), record.root_fs_size),
        ("test-worker-pool", "small", Some(10))
    );
    assert_eq!(
        record.tags.get(support::CLUSTER_TAG).map(String::as_str),
        Some("1")
    );
    assert!(
        record.created_at.parse::<jiff::Timestamp>().is_ok(),
        "{}",
        record.created_at
    );
}

#[tokio::test]
async fn the_machine_directory_holds_its_files_with_private_modes() {
    let env = Env::new();
    env.driver.create_machine(&create("m-1", BOOT)).await.unwrap();
    let dir = env.driver.machine_dir("default", "m-1");
    assert_eq!(dir, env.state_dir().join("machines/default/m-1"));
    assert_eq!(mode(&env.state_dir()), 0o700);
    assert_eq!(mode(&env.state_dir().join("machines")), 0o700);
    assert_eq!(mode(&env.state_dir().join("machines/default")), 0o700);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("userdata.sh")), 0o600);
    assert_eq!(mode(&dir.join("machine.json")), 0o600);
    assert_eq!(mode(&dir.join("machine.log")), 0o600);
    assert_eq!(mode(&dir.join("conditions")), 0o700);
    assert_eq!(std::fs::read(dir.join("userdata.sh")).unwrap(), BOOT.as_bytes());
    assert_eq!(std::fs::read_dir(dir.join("conditions")).unwrap().count(), 0);
    let names: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["conditions", "machine.json", "machine.log", "userdata.sh"].map(String::from))
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("machine.json")).unwrap()).unwrap();
    for key in [
        "providerID",
        "machineName",
        "namespace",
        "className",
        "vmPool",
        "size",
        "rootFsSize",
        "tags",
        "createdAt",
        "pid",
        "pgid",
    ] {
        assert!(json.get(key).is_some(), "machine.json has {key}: {json}");
    }
    assert_eq!(json["providerID"], "local:///default/m-1");
}

#[tokio::test]
async fn the_script_gets_only_the_documented_environment() {
    let env = Env::new();
    let script = "#!/bin/sh\necho ENV-BEGIN\nenv\necho ENV-END\nexec sleep 300\n";
    env.driver.create_machine(&create("m-env", script)).await.unwrap();
    let log = env.wait_log("m-env", "ENV-END").await;
    let vars: BTreeMap<String, String> = log
        .lines()
        .skip_while(|line| *line != "ENV-BEGIN")
        .skip(1)
        .take_while(|line| *line != "ENV-END")
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    // What a shell adds by itself (dash: PWD; bash as sh: also SHLVL, _ and OLDPWD).
    let shell: BTreeSet<&str> = ["PWD", "SHLVL", "_", "OLDPWD"].into();
    let ours: BTreeSet<&str> = env::ALL.into_iter().chain(["PATH", "HOME"]).collect();
    let unexpected: Vec<&String> = vars
        .keys()
        .filter(|key| !ours.contains(key.as_str()) && !shell.contains(key.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "variables leaked into the machine: {unexpected:?}"
    );
    // The test process has variables of its own (cargo sets CARGO_* for tests): none of them reached the script.
    let parent_only: Vec<String> = std::env::vars_os()
        .filter_map(|(key, _)| key.into_string().ok())
        .filter(|key| !ours.contains(key.as_str()) && !shell.contains(key.as_str()))
        .collect();
    assert!(
        !parent_only.is_empty(),
        "the test process has variables of its own"
    );
    for key in &parent_only {
        assert!(!vars.contains_key(key), "{key} leaked into the machine");
    }

    let dir = env.driver.machine_dir("default", "m-env");
    let state = env.dir.path();
    let expected = [
        ("MCM_LOCAL_API_SERVER", "https://127.0.0.1:6443".to_owned()),
        ("MCM_LOCAL_CA_FILE", state.join("ca.crt").display().to_string()),
        ("MCM_LOCAL_MACHINE_DIR", dir.display().to_string()),
        ("MCM_LOCAL_PROVIDER_ID", "local:///default/m-env".to_owned()),
        ("MCM_LOCAL_CPU", "2".to_owned()),
        ("MCM_LOCAL_MEMORY", "4Gi".to_owned()),
        ("MCM_LOCAL_NODE_NAME", "m-env".to_owned()),
        ("HOME", dir.display().to_string()),
    ];
    for (key, value) in expected {
        assert_eq!(vars.get(key), Some(&value), "{key}");
    }
    let path = &vars["PATH"];
    let bin = format!("{}:", state.join("bin").display());
    assert!(path.starts_with(&bin), "PATH {path} starts with the bin dir");
    assert!(
        path.len() > bin.len(),
        "PATH {path} goes on with the provider's PATH"
    );
    assert_eq!(
        vars.get("PWD"),
        Some(&dir.display().to_string()),
        "runs in the machine directory"
    );
}

#[tokio::test]
async fn the_size_tells_cpu_and_memory() {
    let env = Env::new();
    let script = "#!/bin/sh\necho \"cpu=$MCM_LOCAL_CPU memory=$MCM_LOCAL_MEMORY\"\nexec sleep 300\n";
    env.driver
        .create_machine(&create_with(
            "m-large",
            class_with(provider_spec("large", "1")),
            script,
        ))
        .await
        .unwrap();
    env.wait_log("m-large", "cpu=8 memory=16Gi").await;
}

#[tokio::test]
async fn creation_is_idempotent_and_starts_no_second_process() {
    let env = Env::new();
    let first = env.driver.create_machine(&create("m-1", BOOT)).await.unwrap();
    env.wait_log("m-1", "booted m-1").await;
    let pgid = env.pgid("m-1");
    // Another userData and another size: the machine is adopted as it is.
    let again = env
        .driver
        .create_machine(&create_with(
            "m-1",
            class_with(provider_spec("medium", "1")),
            "#!/bin/sh\necho other\n",
        ))
        .await
        .unwrap();
    assert_eq!(again.provider_id, first.provider_id);
    assert_eq!(again.node_name, first.node_name);
    assert_eq!(again.addresses, first.addresses);
    assert_eq!(env.pgid("m-1"), pgid, "the same process");
    assert!(running(pgid));
    assert_eq!(
        std::fs::read(env.driver.machine_dir("default", "m-1").join("userdata.sh")).unwrap(),
        BOOT.as_bytes(),
        "the machine keeps its userData"
    );
    assert_eq!(env.log("m-1").matches("booted").count(), 1, "booted once");
    assert_eq!(env.driver.machines().unwrap().len(), 1);

    // The same name in another cluster: not compatible.
    let err = env
        .driver
        .create_machine(&create_with("m-1", class_with(provider_spec("small", "2")), BOOT))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::AlreadyExists, "{err}");
    assert!(err.message.contains("default/m-1"), "{err}");
}

#[tokio::test]
async fn concurrent_creations_of_one_machine_make_one_process() {
    let env = Env::new();
    let requests: Vec<_> = (0..4).map(|_| create("m-1", BOOT)).collect();
    let calls = requests.iter().map(|request| env.driver.create_machine(request));
    let answers = futures::future::join_all(calls).await;
    for answer in &answers {
        assert_eq!(answer.as_ref().unwrap().provider_id, "local:///default/m-1");
    }
    env.wait_log("m-1", "booted m-1").await;
    assert_eq!(env.log("m-1").matches("booted").count(), 1, "booted once");
}

#[tokio::test]
async fn status_and_list_follow_the_class_tags() {
    let env = Env::new();
    let other_cluster = class_with(provider_spec("small", "2"));
    env.driver.create_machine(&create("m-1", BOOT)).await.unwrap();
    env.driver.create_machine(&create("m-2", BOOT)).await.unwrap();
    env.driver
        .create_machine(&create_with("m-3", other_cluster.clone(), BOOT))
        .await
        .unwrap();

    let found = env.driver.get_machine_status(&status("m-1")).await.unwrap();
    assert_eq!(found.provider_id, "local:///default/m-1");
    assert_eq!(found.node_name, "m-1");
    assert_eq!(found.addresses.len(), 2);

    let missing = env.driver.get_machine_status(&status("m-9")).await.unwrap_err();
    assert_eq!(missing.code, MachineCode::NotFound);
    assert!(missing.message.contains("default/m-9"), "{missing}");
    let foreign = env
        .driver
        .get_machine_status(&status_with("m-1", other_cluster.clone()))
        .await
        .unwrap_err();
    assert_eq!(
        foreign.code,
        MachineCode::NotFound,
        "another cluster's class does not see it"
    );

    let listed = env.driver.list_machines(&support::list(class())).await.unwrap();
    assert_eq!(
        listed.machine_list,
        BTreeMap::from([
            ("local:///default/m-1".to_owned(), "m-1".to_owned()),
            ("local:///default/m-2".to_owned(), "m-2".to_owned()),
        ])
    );
    let listed = env.driver.list_machines(&list(other_cluster)).await.unwrap();
    assert_eq!(
        listed.machine_list,
        BTreeMap::from([("local:///default/m-3".to_owned(), "m-3".to_owned())])
    );
}

#[tokio::test]
async fn deletion_stops_the_whole_process_tree_and_removes_the_machine() {
    let env = Env::new();
    let script = "#!/bin/sh\nsleep 301 &\necho \"child $!\"\necho ready\nwait\n";
    env.driver
        .create_machine(&create("m-tree", script))
        .await
        .unwrap();
    let log = env.wait_log("m-tree", "ready").await;
    let child: i32 = log
        .lines()
        .find_map(|line| line.strip_prefix("child "))
        .and_then(|pid| pid.trim().parse().ok())
        .expect("the child's pid");
    let leader = env.pgid("m-tree");
    assert!(running(leader) && running(child));
    assert_eq!(
        pgrp(child),
        Some(leader),
        "the background child is in the machine's group"
    );

    env.driver.delete_machine(&delete("m-tree")).await.unwrap();
    wait_gone(&[leader, child]).await;
    assert!(!env.driver.machine_dir("default", "m-tree").exists());
    assert_eq!(env.driver.machine("default", "m-tree").unwrap(), None);
    let leftovers: Vec<_> = std::fs::read_dir(env.state_dir().join("machines/default"))
        .unwrap()
        .collect();
    assert!(leftovers.is_empty(), "nothing left: {leftovers:?}");
    let err = env
        .driver
        .get_machine_status(&status("m-tree"))
        .await
        .unwrap_err();
    assert_eq!(err.code, MachineCode::NotFound);
    assert!(
        env.driver
            .list_machines(&list(class()))
            .await
            .unwrap()
            .machine_list
            .is_empty()
    );

    // Idempotent: deleting it again, and a machine that never existed, is OK.
    env.driver.delete_machine(&delete("m-tree")).await.unwrap();
    env.driver.delete_machine(&delete("never-existed")).await.unwrap();
}

#[tokio::test]
async fn a_group_that_ignores_sigterm_is_killed_after_the_stop_grace() {
    let grace = Duration::from_millis(300);
    let env = Env::with_grace(grace);
    let script = "#!/bin/sh\ntrap '' TERM\nsleep 302 &\necho ready\nwhile :; do sleep 1; done\n";
    env.driver
        .create_machine(&create("m-stubborn", script))
        .await
        .unwrap();
    env.wait_log("m-stubborn", "ready").await;
    let leader = env.pgid("m-stubborn");
    let started = Instant::now();
    env.driver.delete_machine(&delete("m-stubborn")).await.unwrap();
    assert!(started.elapsed() >= grace, "SIGKILL only after the grace");
    assert!(!running(leader));
    assert!(!env.driver.machine_dir("default", "m-stubborn").exists());
}

#[tokio::test]
async fn deletion_leaves_a_machine_of_another_cluster_alone() {
    let env = Env::new();
    env.driver.create_machine(&create("m-1", BOOT)).await.unwrap();
    env.driver
        .delete_machine(&delete_with("m-1", class_with(provider_spec("small", "2"))))
        .await
        .unwrap();
    let pgid = env.pgid("m-1");
    assert!(running(pgid), "still running");
    env.driver.get_machine_status(&status("m-1")).await.unwrap();
}

#[tokio::test]
async fn a_restarted_provider_finds_the_running_machine() {
    let env = Env::new();
    env.driver.create_machine(&create("m-1", BOOT)).await.unwrap();
    env.wait_log("m-1", "booted m-1").await;
    let pgid = env.pgid("m-1");

    let restarted = env.restarted();
    let record: LocalMachine = restarted
        .machine("default", "m-1")
        .unwrap()
        .expect("found on disk");
    assert!(record.is_running());
    let found = restarted.get_machine_status(&status("m-1")).await.unwrap();
    assert_eq!(found.provider_id, "local:///default/m-1");
    assert_eq!(
        restarted
            .list_machines(&list(class()))
            .await
            .unwrap()
            .machine_list
            .len(),
        1
    );
    let again = restarted.create_machine(&create("m-1", BOOT)).await.unwrap();
    assert_eq!(again.provider_id, "local:///default/m-1");
    assert_eq!(
        restarted.machine("default", "m-1").unwrap().unwrap().pgid,
        Some(pgid),
        "no second process"
    );

    restarted.delete_machine(&delete("m-1")).await.unwrap();
    wait_gone(&[pgid]).await;
    assert_eq!(env.driver.machine("default", "m-1").unwrap(), None);
}

#[tokio::test]
async fn a_script_that_fails_leaves_a_broken_machine_with_the_error_in_its_log() {
    let env = Env::new();
    let script = "#!/bin/sh\necho 'cannot reach the API server' >&2\nexit 3\n";
    env.driver
        .create_machine(&create("m-broken", script))
        .await
        .unwrap();
    let log = env.wait_log("m-broken", "exited").await;
    assert!(log.contains("cannot reach the API server"), "{log}");
    assert!(log.contains("exit status: 3"), "{log}");
    let record = env.driver.machine("default", "m-broken").unwrap().unwrap();
    assert!(!record.is_running());
    let pgid = record.pgid.unwrap();
    assert!(!running(pgid), "reaped: no zombie is left");

    // The VM still exists: found, listed, and not started again by CreateMachine.
    env.driver.get_machine_status(&status("m-broken")).await.unwrap();
    assert!(
        env.driver
            .list_machines(&list(class()))
            .await
            .unwrap()
            .machine_list
            .contains_key("local:///default/m-broken")
    );
    env.driver
        .create_machine(&create("m-broken", script))
        .await
        .unwrap();
    assert_eq!(env.log("m-broken").matches("cannot reach").count(), 1);
    assert_eq!(
        env.restarted()
            .machine("default", "m-broken")
            .unwrap()
            .unwrap()
            .pgid,
        Some(pgid)
    );

    env.driver.delete_machine(&delete("m-broken")).await.unwrap();
    assert!(!env.driver.machine_dir("default", "m-broken").exists());
}

#[tokio::test]
async fn machines_of_other_namespaces_are_apart() {
    let env = Env::new();
    let mut request = create("m-1", BOOT);
    request.machine.metadata.namespace = Some("team-a".into());
    let answer = env.driver.create_machine(&request).await.unwrap();
    assert_eq!(answer.provider_id, "local:///team-a/m-1");
    assert!(env.state_dir().join("machines/team-a/m-1/machine.json").exists());
    assert_eq!(
        env.driver
            .get_machine_status(&status("m-1"))
            .await
            .unwrap_err()
            .code,
        MachineCode::NotFound
    );
    // ListMachines sees every namespace.
    assert_eq!(
        env.driver
            .list_machines(&list(class()))
            .await
            .unwrap()
            .machine_list
            .get("local:///team-a/m-1"),
        Some(&"m-1".to_owned())
    );
    env.driver.delete_machine(&delete("m-1")).await.unwrap();
    assert!(
        env.state_dir().join("machines/team-a/m-1").exists(),
        "another namespace's m-1 stays"
    );
}

#[tokio::test]
async fn log_tail_reads_the_end_of_the_log() {
    let env = Env::new();
    let script = "#!/bin/sh\necho first line\necho last line\nexec sleep 300\n";
    env.driver.create_machine(&create("m-1", script)).await.unwrap();
    env.wait_log("m-1", "last line").await;
    assert_eq!(env.driver.log_tail("default", "m-1", 10).unwrap(), "last line\n");
    assert_eq!(env.driver.log_tail("default", "nobody", 10).unwrap(), "");
}

/// Set for [`provider_process_helper`] when it runs as a provider process of its own.
const HELPER_DIR: &str = "MCM_LOCAL_TEST_HELPER_DIR";

/// Not a test of its own: run by [`a_machine_outlives_the_provider_process`] in a child process (this test binary
/// again), it creates a machine in the directory it is given and exits. Without the variable it does nothing.
#[tokio::test]
async fn provider_process_helper() {
    let Some(dir) = std::env::var_os(HELPER_DIR) else {
        return;
    };
    let config = mcm_provider_local::LocalConfig::new(
        Path::new(&dir).join("state"),
        Path::new(&dir).join("bin"),
        "https://127.0.0.1:6443",
        Path::new(&dir).join("ca.crt"),
    );
    let driver = mcm_provider_local::LocalDriver::new(config).unwrap();
    driver.create_machine(&create("m-outlives", BOOT)).await.unwrap();
}

#[tokio::test]
async fn a_machine_outlives_the_provider_process() {
    let env = Env::new();
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "provider_process_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_DIR, env.dir.path())
        .output()
        .expect("the provider process runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The provider process is gone; its machine runs on, and a new provider finds it.
    let record = env
        .driver
        .machine("default", "m-outlives")
        .unwrap()
        .expect("created by the other process");
    assert!(record.is_running(), "the machine outlived its provider");
    env.wait_log("m-outlives", "booted m-outlives").await;
    let pgid = record.pgid.unwrap();
    env.driver.delete_machine(&delete("m-outlives")).await.unwrap();
    wait_gone(&[pgid]).await;
}

#[tokio::test]
async fn a_provider_that_stopped_mid_creation_leaves_nothing_half_done() {
    let env = Env::new();
    // A provider that stopped after the machine directory was in place but before its process started.
    env.driver.create_machine(&create("m-1", BOOT)).await.unwrap();
    env.wait_log("m-1", "booted m-1").await;
    let first = env.pgid("m-1");
    env.driver.delete_machine(&delete("m-1")).await.unwrap();
    wait_gone(&[first]).await;
    env.driver.create_machine(&create("m-1", BOOT)).await.unwrap();
    env.wait_log("m-1", "booted m-1").await;
    let dir = env.driver.machine_dir("default", "m-1");
    let second = env.pgid("m-1");
    rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(second).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    wait_gone(&[second]).await;
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("machine.json")).unwrap()).unwrap();
    record["pid"] = serde_json::Value::Null;
    record["pgid"] = serde_json::Value::Null;
    std::fs::write(dir.join("machine.json"), serde_json::to_vec(&record).unwrap()).unwrap();
    // And one that stopped while staging a machine, and while removing one.
    let namespace_dir = env.state_dir().join("machines/default");
    std::fs::create_dir(namespace_dir.join(".creating-m-2-1-0")).unwrap();
    std::fs::create_dir(namespace_dir.join(".deleting-m-3-1-0")).unwrap();

    let restarted = env.restarted();
    assert!(!namespace_dir.join(".creating-m-2-1-0").exists());
    assert!(!namespace_dir.join(".deleting-m-3-1-0").exists());
    assert_eq!(
        restarted.machines().unwrap().len(),
        1,
        "staging directories are no machines"
    );
    // CreateMachine starts the process the machine never got.
    restarted.create_machine(&create("m-1", BOOT)).await.unwrap();
    let third = restarted.machine("default", "m-1").unwrap().unwrap();
    assert!(third.is_running());
    assert_ne!(third.pgid, Some(second));
    eventually("the machine booted again", || async {
        (env.log("m-1").matches("booted m-1").count() == 2).then_some(())
    })
    .await;
}
