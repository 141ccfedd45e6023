//! A provider that quotes its requests in its error messages, as several cloud APIs do (`mcm provider sim serve
//! --echo-requests`): the test of the controllers' redaction.
//!
//! [`EchoRequests`] wraps a driver. The first call of each method for each machine (for each class, for the calls
//! without a machine) fails with a retryable code and a message quoting the whole request: the machine and class
//! names, every secret value as it is and base64-encoded (standard and URL-safe, with and without padding, in
//! turn), every line of it, every bootstrap token found in it (whole and its secret part, raw and base64), and the
//! secret as JSON (its data base64 as on the wire), base64-encoded once more. The next call of the same method for the same machine goes through to the wrapped
//! driver, so that the lifecycle completes. Never use it outside tests: it hands secrets to whoever reads errors.

use std::{
    collections::BTreeSet,
    sync::{Mutex, PoisonError},
};

use async_trait::async_trait;
use base64::{
    Engine as _,
    engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD},
};
use k8s_openapi::api::core::v1::Secret;
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    CreateMachineRequest, CreateMachineResponse, DeleteMachineRequest, DeleteMachineResponse, Driver,
    DriverError, DriverMethod, GenerateMachineClassForMigrationRequest,
    GenerateMachineClassForMigrationResponse, GetMachineStatusRequest, GetMachineStatusResponse,
    GetVolumeIdsRequest, GetVolumeIdsResponse, InitializeMachineRequest, InitializeMachineResponse,
    ListMachinesRequest, ListMachinesResponse, MachineCode,
};

/// A driver whose first call per method and machine fails quoting the whole request (see the module).
#[derive(Debug)]
pub struct EchoRequests<D> {
    inner: D,
    echoed: Mutex<BTreeSet<(DriverMethod, String)>>,
}

impl<D: Driver> EchoRequests<D> {
    /// Wraps `inner`.
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            echoed: Mutex::default(),
        }
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The echo to fail with, the first time `method` is called for `key`; None after.
    fn first(
        &self,
        method: DriverMethod,
        key: &str,
        machine: Option<&Machine>,
        class: Option<&MachineClass>,
        secret: Option<&Secret>,
    ) -> Option<DriverError> {
        let fresh = self
            .echoed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((method, key.to_owned()));
        fresh.then(|| DriverError::new(retryable(method), echo(method, machine, class, secret)))
    }
}

/// A code the controllers retry after a short back-off, for each method (the spec's tables).
fn retryable(method: DriverMethod) -> MachineCode {
    match method {
        DriverMethod::InitializeMachine => MachineCode::Uninitialized,
        DriverMethod::GenerateMachineClassForMigration => MachineCode::Internal,
        _ => MachineCode::Unavailable,
    }
}

/// The forms of a value a careless provider might quote: as it is, and in one base64 form, picked by `variant`
/// so that every form shows up over the values of a request. (Not all four at once: the message travels in a
/// gRPC trailer, which HTTP/2 limits to a few kilobytes.)
fn forms(label: &str, value: &str, variant: usize, out: &mut Vec<String>) {
    let engines = [
        ("base64", STANDARD),
        ("base64-nopad", STANDARD_NO_PAD),
        ("base64url", URL_SAFE),
        ("base64url-nopad", URL_SAFE_NO_PAD),
    ];
    let (name, engine) = &engines[variant % engines.len()];
    out.push(format!("{label}={value}"));
    out.push(format!("{label}({name})={}", engine.encode(value)));
}

/// The message quoting a request.
fn echo(
    method: DriverMethod,
    machine: Option<&Machine>,
    class: Option<&MachineClass>,
    secret: Option<&Secret>,
) -> String {
    let mut parts = vec![format!("echo of the {} request:", method.name())];
    if let Some(machine) = machine {
        parts.push(format!(
            "machine={}",
            machine.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    if let Some(class) = class {
        parts.push(format!(
            "class={}",
            class.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    let mut variant = 0;
    let mut next = || {
        variant += 1;
        variant
    };
    for (key, value) in secret.and_then(|s| s.data.as_ref()).into_iter().flatten() {
        let text = String::from_utf8_lossy(&value.0);
        forms(&format!("secret.{key}"), &text, next(), &mut parts);
        for (n, line) in text.lines().enumerate() {
            forms(&format!("secret.{key}.line{n}"), line, next(), &mut parts);
        }
        for token in mcm_api::bootstrap_tokens_in(&text) {
            forms("bootstrapToken", token, next(), &mut parts);
            forms("bootstrapTokenSecret", &token[7..], next(), &mut parts);
        }
    }
    // The request's secret as the provider received it (JSON, data base64), base64-encoded once more.
    let request = serde_json::json!({
        "machine": machine.and_then(|m| m.metadata.name.clone()),
        "secret": secret.map(|s| &s.data),
    });
    parts.push(format!(
        "request(json,base64)={}",
        STANDARD.encode(request.to_string())
    ));
    parts.join(" ")
}

fn name_of(machine: &Machine) -> String {
    machine.metadata.name.clone().unwrap_or_default()
}

fn class_key(class: &MachineClass) -> String {
    format!("class/{}", class.metadata.name.as_deref().unwrap_or_default())
}

#[async_trait]
impl<D: Driver> Driver for EchoRequests<D> {
    async fn create_machine(
        &self,
        request: &CreateMachineRequest,
    ) -> Result<CreateMachineResponse, DriverError> {
        let (m, c, s) = (&request.machine, &request.machine_class, &request.secret);
        if let Some(err) = self.first(
            DriverMethod::CreateMachine,
            &name_of(m),
            Some(m),
            Some(c),
            Some(s),
        ) {
            return Err(err);
        }
        self.inner.create_machine(request).await
    }

    async fn initialize_machine(
        &self,
        request: &InitializeMachineRequest,
    ) -> Result<InitializeMachineResponse, DriverError> {
        let (m, c, s) = (&request.machine, &request.machine_class, &request.secret);
        if let Some(err) = self.first(
            DriverMethod::InitializeMachine,
            &name_of(m),
            Some(m),
            Some(c),
            Some(s),
        ) {
            return Err(err);
        }
        self.inner.initialize_machine(request).await
    }

    async fn delete_machine(
        &self,
        request: &DeleteMachineRequest,
    ) -> Result<DeleteMachineResponse, DriverError> {
        let (m, c, s) = (&request.machine, &request.machine_class, &request.secret);
        if let Some(err) = self.first(
            DriverMethod::DeleteMachine,
            &name_of(m),
            Some(m),
            Some(c),
            Some(s),
        ) {
            return Err(err);
        }
        self.inner.delete_machine(request).await
    }

    async fn get_machine_status(
        &self,
        request: &GetMachineStatusRequest,
    ) -> Result<GetMachineStatusResponse, DriverError> {
        let (m, c, s) = (&request.machine, &request.machine_class, &request.secret);
        if let Some(err) = self.first(
            DriverMethod::GetMachineStatus,
            &name_of(m),
            Some(m),
            Some(c),
            Some(s),
        ) {
            return Err(err);
        }
        self.inner.get_machine_status(request).await
    }

    async fn list_machines(
        &self,
        request: &ListMachinesRequest,
    ) -> Result<ListMachinesResponse, DriverError> {
        let (c, s) = (&request.machine_class, &request.secret);
        if let Some(err) = self.first(DriverMethod::ListMachines, &class_key(c), None, Some(c), Some(s)) {
            return Err(err);
        }
        self.inner.list_machines(request).await
    }

    async fn get_volume_ids(
        &self,
        request: &GetVolumeIdsRequest,
    ) -> Result<GetVolumeIdsResponse, DriverError> {
        self.inner.get_volume_ids(request).await
    }

    async fn generate_machine_class_for_migration(
        &self,
        request: &GenerateMachineClassForMigrationRequest,
    ) -> Result<GenerateMachineClassForMigrationResponse, DriverError> {
        let c = &request.machine_class;
        if let Some(err) = self.first(
            DriverMethod::GenerateMachineClassForMigration,
            &class_key(c),
            None,
            Some(c),
            None,
        ) {
            return Err(err);
        }
        self.inner.generate_machine_class_for_migration(request).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;
    use crate::{SimConfig, SimDriver};

    #[tokio::test]
    async fn the_first_call_quotes_everything_and_the_next_goes_through() {
        let driver = EchoRequests::new(SimDriver::new(SimConfig::default()));
        let mut machine = Machine::default();
        machine.metadata.name = Some("m-1".into());
        machine.metadata.namespace = Some("ns".into());
        let user_data = "#!/bin/sh\nexec agent --bootstrap-token \"abc123.0123456789abcdef\"\n";
        let request = GetMachineStatusRequest {
            machine,
            machine_class: MachineClass::default(),
            secret: Secret {
                data: Some(BTreeMap::from([(
                    "userData".to_owned(),
                    ByteString(user_data.as_bytes().to_vec()),
                )])),
                ..Secret::default()
            },
        };
        let err = driver.get_machine_status(&request).await.unwrap_err();
        assert_eq!(err.code, MachineCode::Unavailable);
        for quoted in [
            user_data.to_owned(),
            STANDARD_NO_PAD.encode(user_data),
            "abc123.0123456789abcdef".to_owned(),
            URL_SAFE.encode("abc123.0123456789abcdef"),
            URL_SAFE_NO_PAD.encode("0123456789abcdef"),
        ] {
            assert!(err.message.contains(&quoted), "{quoted} in {}", err.message);
        }
        // The second call reaches the simulated provider (which refuses a class without providerSpec).
        let err = driver.get_machine_status(&request).await.unwrap_err();
        assert_eq!(err.code, MachineCode::InvalidArgument, "{}", err.message);
        assert!(err.message.starts_with("providerSpec"), "{}", err.message);
    }
}
