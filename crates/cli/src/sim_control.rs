//! `mcm provider sim serve --control-address 127.0.0.1:PORT`: the sim provider's fault injection from outside the
//! process, for tests in any language that drive the provider binary (docs/provider-sim.md "Control endpoint").
//! A few JSON routes on loopback only (it has no authentication) over `mcm_provider_sim::Faults`:
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /faults` | a [`FaultBody`] | 201 `{"id": N}` |
//! | `DELETE /faults` | | 200 `{"cleared": true}`: every call fault goes |
//! | `DELETE /faults/{id}` | | 200 `{"removed": true}`, 404 when there is no such fault |
//! | `PUT /latency` | a [`LatencyBody`] | 200 `{"method": M or null, "latency": "..."}` |
//! | `GET /calls` | | 200 calls received per method, failed ones included |
//! | `PUT /reachable` | `{"reachable": false}` or `true` | 200: the provider stops serving (its socket goes: calls fail with Unavailable, as for a dead provider; calls in flight finish first) or serves again |
//!
//! A bad body is 400 with a message naming the field and the reason.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use anyhow::Context as _;
use axum::{
    Router,
    body::Bytes,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, get, post, put},
};
use mcm_driver::{DriverMethod, MachineCode};
use mcm_provider_sim::{Fault, FaultId, Faults, Latency, Target};
use serde::Deserialize;

/// How long a `hang` latency is: far beyond any call deadline, so the call ends only by its client's deadline.
pub const HANG: Duration = Duration::from_hours(365 * 24);

/// `POST /faults`: a call fault. `method` and `code` are required; at most one of `machines`, `share` and
/// `probability` restricts which calls fail (every call when none).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FaultBody {
    /// The Driver method by its spec name (`CreateMachine`, `GetVolumeIDs`, ...).
    method: String,
    /// The machine code by its reference name (`ResourceExhausted`, `Uninitialized`, ...).
    code: String,
    /// Fire at most this many times.
    times: Option<u64>,
    /// Only calls for these machine names.
    machines: Option<Vec<String>>,
    /// `n` of every `of` calls, evenly.
    share: Option<Share>,
    /// Each call fails with this probability (0 to 1), from the provider's seeded RNG.
    probability: Option<f64>,
    /// The call acts first, then answers the code (a response lost on the way back).
    #[serde(default)]
    after_effect: bool,
    /// The error message (default: `injected fault: <method> answers <code>`).
    message: Option<String>,
}

/// `n` of every `of` calls.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Share {
    n: u32,
    of: u32,
}

/// `PUT /reachable`: whether the provider serves.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReachableBody {
    reachable: bool,
}

/// What the routes act on: the sim's faults, and the switch that makes the provider serve or not.
#[derive(Clone)]
struct Control {
    faults: Faults,
    reachable: tokio::sync::watch::Sender<bool>,
}

impl axum::extract::FromRef<Control> for Faults {
    fn from_ref(control: &Control) -> Self {
        control.faults.clone()
    }
}

/// `PUT /latency`: the latency of one method (or, without `method`, of every method without its own).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyBody {
    /// The Driver method by its spec name; absent: the default latency.
    method: Option<String>,
    /// A duration (`250ms`, `2s`, `0s` for none) or `hang` (the call never answers: its client's deadline ends it).
    latency: String,
}

fn method_of(name: &str) -> Result<DriverMethod, String> {
    DriverMethod::from_name(name).ok_or_else(|| {
        let known: Vec<_> = DriverMethod::ALL.iter().map(|m| m.name()).collect();
        format!("method: unknown method {name:?} (known: {})", known.join(", "))
    })
}

/// The fault a body asks for, or what is wrong with it (the field, the reason).
pub fn fault_of(body: &[u8]) -> Result<Fault, String> {
    let body: FaultBody = serde_json::from_slice(body).map_err(|err| format!("the fault: {err}"))?;
    let method = method_of(&body.method)?;
    let code = MachineCode::from_name(&body.code)
        .filter(|code| *code != MachineCode::Ok)
        .ok_or_else(|| {
            let known: Vec<_> = MachineCode::ALL
                .iter()
                .filter(|c| **c != MachineCode::Ok)
                .map(|c| c.name())
                .collect();
            format!(
                "code: unknown or not an error {:?} (known: {})",
                body.code,
                known.join(", ")
            )
        })?;
    let targets = [
        body.machines.is_some(),
        body.share.is_some(),
        body.probability.is_some(),
    ];
    if targets.into_iter().filter(|t| *t).count() > 1 {
        return Err("machines, share, probability: give at most one".into());
    }
    let target = if let Some(machines) = body.machines {
        if machines.is_empty() {
            return Err("machines: must name at least one machine".into());
        }
        Target::machines(machines)
    } else if let Some(Share { n, of }) = body.share {
        if of == 0 || n > of {
            return Err(format!(
                "share: n ({n}) must be at most of ({of}), and of at least 1"
            ));
        }
        Target::share(n, of)
    } else if let Some(p) = body.probability {
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("probability: must be from 0 to 1, not {p}"));
        }
        Target::Random(p)
    } else {
        Target::All
    };
    let mut fault = Fault::new(method, code).target(target);
    fault.times = body.times;
    fault.after_effect = body.after_effect;
    fault.message = body.message;
    Ok(fault)
}

/// The method (None: the default) and latency a body asks for.
pub fn latency_of(body: &[u8]) -> Result<(Option<DriverMethod>, Latency), String> {
    let body: LatencyBody = serde_json::from_slice(body).map_err(|err| format!("the latency: {err}"))?;
    let method = body.method.as_deref().map(method_of).transpose()?;
    let latency = if body.latency == "hang" {
        Latency::Fixed(HANG)
    } else {
        match crate::parse_duration(&body.latency) {
            Ok(d) if d.is_zero() => Latency::None,
            Ok(d) => Latency::Fixed(d),
            Err(err) => return Err(format!("latency: {err} (a duration such as 2s, or hang)")),
        }
    };
    Ok((method, latency))
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [("content-type", "application/json")],
        format!("{value}\n"),
    )
        .into_response()
}

fn bad_request(message: &str) -> Response {
    tracing::info!(%message, "control: request refused");
    (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response()
}

async fn add_fault(State(faults): State<Faults>, body: Bytes) -> Response {
    match fault_of(&body) {
        Ok(fault) => {
            tracing::info!(
                method = fault.method.name(),
                code = fault.code.name(),
                "control: fault injected"
            );
            let id = faults.inject(fault);
            json(StatusCode::CREATED, &serde_json::json!({ "id": id.number() }))
        }
        Err(message) => bad_request(&message),
    }
}

async fn clear_faults(State(faults): State<Faults>) -> Response {
    faults.clear();
    tracing::info!("control: every call fault cleared");
    json(StatusCode::OK, &serde_json::json!({ "cleared": true }))
}

async fn remove_fault(State(faults): State<Faults>, Path(id): Path<String>) -> Response {
    let Ok(number) = id.parse::<u64>() else {
        return bad_request(&format!(
            "id: {id:?} is not a fault id (a number from POST /faults)"
        ));
    };
    if faults.remove(FaultId::from_number(number)) {
        json(StatusCode::OK, &serde_json::json!({ "removed": true }))
    } else {
        json(StatusCode::NOT_FOUND, &serde_json::json!({ "removed": false }))
    }
}

async fn set_latency(State(faults): State<Faults>, body: Bytes) -> Response {
    match latency_of(&body) {
        Ok((method, latency)) => {
            match method {
                Some(method) => faults.set_latency(method, latency),
                None => faults.set_default_latency(latency),
            }
            let shown = match latency {
                Latency::None => "0s".to_owned(),
                Latency::Fixed(d) if d == HANG => "hang".to_owned(),
                Latency::Fixed(d) => format!("{}ms", d.as_millis()),
                Latency::Range { min, max } => format!("{}ms-{}ms", min.as_millis(), max.as_millis()),
            };
            tracing::info!(method = method.map(DriverMethod::name), latency = %shown, "control: latency set");
            json(
                StatusCode::OK,
                &serde_json::json!({ "method": method.map(DriverMethod::name), "latency": shown }),
            )
        }
        Err(message) => bad_request(&message),
    }
}

async fn set_reachable(State(control): State<Control>, body: Bytes) -> Response {
    match serde_json::from_slice::<ReachableBody>(&body) {
        Ok(ReachableBody { reachable }) => {
            tracing::info!(reachable, "control: reachability set");
            control.reachable.send_replace(reachable);
            json(StatusCode::OK, &serde_json::json!({ "reachable": reachable }))
        }
        Err(err) => bad_request(&format!("the reachability: {err}")),
    }
}

async fn calls(State(faults): State<Faults>) -> Response {
    let counts: BTreeMap<&str, u64> = DriverMethod::ALL
        .into_iter()
        .map(|method| (method.name(), faults.calls(method)))
        .collect();
    json(StatusCode::OK, &serde_json::json!(counts))
}

/// Binds the control endpoint (loopback only) and returns its address and the task serving it. `reachable` is the
/// switch `PUT /reachable` sets: the provider serves while it is true.
pub async fn start(
    address: SocketAddr,
    faults: Faults,
    reachable: tokio::sync::watch::Sender<bool>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    if !address.ip().is_loopback() {
        anyhow::bail!(
            "--control-address {address}: must be a loopback address (127.0.0.1 or [::1]): the control endpoint has \
             no authentication"
        );
    }
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("--control-address {address}"))?;
    let local = listener.local_addr()?;
    let router = Router::new()
        .route("/faults", post(add_fault).delete(clear_faults))
        .route("/faults/{id}", delete(remove_fault))
        .route("/latency", put(set_latency))
        .route("/calls", get(calls))
        .route("/reachable", put(set_reachable))
        .with_state(Control { faults, reachable });
    let task = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, router).await {
            tracing::error!(error = %err, "control endpoint stopped");
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_body_becomes_the_fault() {
        let fault = fault_of(
            br#"{"method":"CreateMachine","code":"ResourceExhausted","times":2,"machines":["a"],"afterEffect":true,
                 "message":"quota"}"#,
        )
        .unwrap();
        assert_eq!(
            fault,
            Fault::new(DriverMethod::CreateMachine, MachineCode::ResourceExhausted)
                .target(Target::machines(["a"]))
                .times(2)
                .after_effect()
                .message("quota")
        );
        let fault =
            fault_of(br#"{"method":"GetVolumeIDs","code":"Uninitialized","share":{"n":1,"of":3}}"#).unwrap();
        assert_eq!(fault.target, Target::share(1, 3));
        assert_eq!(fault.code, MachineCode::Uninitialized);
    }

    #[test]
    fn a_bad_fault_body_names_the_field_and_the_reason() {
        for (body, expected) in [
            (r#"{"code":"Internal"}"#, "missing field `method`"),
            (
                r#"{"method":"Create","code":"Internal"}"#,
                "method: unknown method \"Create\"",
            ),
            (
                r#"{"method":"CreateMachine","code":"OK"}"#,
                "code: unknown or not an error \"OK\"",
            ),
            (
                r#"{"method":"CreateMachine","code":"Internal","colour":1}"#,
                "unknown field `colour`",
            ),
            (
                r#"{"method":"CreateMachine","code":"Internal","share":{"n":4,"of":3}}"#,
                "share: n (4)",
            ),
            (
                r#"{"method":"CreateMachine","code":"Internal","probability":2}"#,
                "probability: must be from 0 to 1",
            ),
            (
                r#"{"method":"CreateMachine","code":"Internal","machines":[]}"#,
                "machines: must name",
            ),
            (
                r#"{"method":"CreateMachine","code":"Internal","machines":["a"],"probability":1}"#,
                "at most one",
            ),
            ("not json", "the fault:"),
        ] {
            let err = fault_of(body.as_bytes()).unwrap_err();
            assert!(err.contains(expected), "{body}: {err}");
        }
    }

    #[test]
    fn a_latency_body_is_a_duration_hang_or_none() {
        assert_eq!(
            latency_of(br#"{"method":"GetMachineStatus","latency":"2s"}"#).unwrap(),
            (
                Some(DriverMethod::GetMachineStatus),
                Latency::Fixed(Duration::from_secs(2))
            )
        );
        assert_eq!(
            latency_of(br#"{"latency":"hang"}"#).unwrap(),
            (None, Latency::Fixed(HANG))
        );
        assert_eq!(latency_of(br#"{"latency":"0s"}"#).unwrap(), (None, Latency::None));
        let err = latency_of(br#"{"latency":"soon"}"#).unwrap_err();
        assert!(err.starts_with("latency: "), "{err}");
    }
}
