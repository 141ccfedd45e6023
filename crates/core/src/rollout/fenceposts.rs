//! maxSurge and maxUnavailable, resolved against the replicas (surge rounds up, unavailable down, never both zero).
//!
//! Separate because every strategy and every scaling reads them.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::{
    InPlaceUpdateMachineDeployment, MachineDeployment, StrategyType, validation::check_int_or_percent,
};

/// The default of an absent maxSurge or maxUnavailable (1, as the reference's API documents).
pub const DEFAULT_FENCEPOST: i32 = 1;

/// maxSurge and maxUnavailable resolved to machine counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fenceposts {
    /// Machines allowed above `replicas` during a rollout.
    pub max_surge: i32,
    /// Machines allowed below `replicas` (unavailable) during a rollout.
    pub max_unavailable: i32,
}

/// An unusable maxSurge or maxUnavailable (validation reports it on the object too).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct FencepostError {
    /// The field path.
    pub path: &'static str,
    /// Why.
    pub reason: String,
}

/// An int-or-percent against `total` (Kubernetes' `GetScaledValueFromIntOrPercent`): a number as it is; a percentage
/// of `total` rounded up (`round_up`, maxSurge) or down (maxUnavailable).
pub fn scaled_value(value: &IntOrString, total: i32, round_up: bool) -> Result<i32, String> {
    let number = check_int_or_percent(value, false)?;
    match value {
        IntOrString::Int(_) => Ok(number),
        IntOrString::String(_) => {
            let product = i64::from(number) * i64::from(total.max(0));
            let scaled = if round_up {
                (product + 99) / 100
            } else {
                product / 100
            };
            Ok(i32::try_from(scaled).unwrap_or(i32::MAX))
        }
    }
}

/// Resolves maxSurge and maxUnavailable against `replicas` (Kubernetes' `ResolveFenceposts`): absent values are 1;
/// surge rounds up and unavailable rounds down; **never both zero**: if both resolve to 0, maxUnavailable becomes 1
/// (e.g. `maxSurge: 0` with `maxUnavailable: 10%` of 5 machines).
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    replicas: i32,
) -> Result<Fenceposts, FencepostError> {
    resolve_at(ROLLING_UPDATE_PATHS, max_surge, max_unavailable, replicas)
}

/// The field paths of maxSurge and maxUnavailable of a strategy's parameters.
type Paths = (&'static str, &'static str);
const ROLLING_UPDATE_PATHS: Paths = (
    "spec.strategy.rollingUpdate.maxSurge",
    "spec.strategy.rollingUpdate.maxUnavailable",
);
const IN_PLACE_UPDATE_PATHS: Paths = (
    "spec.strategy.inPlaceUpdate.maxSurge",
    "spec.strategy.inPlaceUpdate.maxUnavailable",
);

fn resolve_at(
    paths: Paths,
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    replicas: i32,
) -> Result<Fenceposts, FencepostError> {
    let resolve = |value: Option<&IntOrString>, round_up: bool, path: &'static str| match value {
        None => Ok(DEFAULT_FENCEPOST),
        Some(value) => {
            scaled_value(value, replicas, round_up).map_err(|reason| FencepostError { path, reason })
        }
    };
    let max_surge = resolve(max_surge, true, paths.0)?;
    let mut max_unavailable = resolve(max_unavailable, false, paths.1)?;
    if max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1;
    }
    Ok(Fenceposts {
        max_surge,
        max_unavailable,
    })
}

/// The fenceposts a deployment rolls with (the reference's `MaxSurge` and `MaxUnavailable`): [`resolve_fenceposts`]
/// for a RollingUpdate, with maxUnavailable capped at `replicas` (0 when `replicas` is 0). For an InPlaceUpdate
/// maxSurge is 0 (the reference's `MaxSurge` reads rollingUpdate only: the replicas annotations and scaling carry no
/// surge) and maxUnavailable is resolved from `inPlaceUpdate` (with maxSurge taken as 0 when Manual), capped the same
/// way; its surge at creation is [`in_place_surge`]. Both 0 for the other strategies (they do not surge, and Recreate
/// takes every machine down anyway).
pub fn fenceposts(deployment: &MachineDeployment) -> Result<Fenceposts, FencepostError> {
    let strategy = &deployment.spec.strategy;
    let replicas = deployment.spec.replicas.max(0);
    let mut resolved = match strategy.strategy_type() {
        Ok(StrategyType::RollingUpdate) => {
            let rolling = strategy.rolling_update.clone().unwrap_or_default();
            resolve_fenceposts(
                rolling.max_surge.as_ref(),
                rolling.max_unavailable.as_ref(),
                replicas,
            )?
        }
        Ok(StrategyType::InPlaceUpdate) => {
            let in_place = strategy.in_place_update.clone().unwrap_or_default();
            let zero = IntOrString::Int(0);
            let surge = if in_place.is_manual() {
                Some(&zero)
            } else {
                in_place.max_surge.as_ref()
            };
            let resolved = resolve_at(
                IN_PLACE_UPDATE_PATHS,
                surge,
                in_place.max_unavailable.as_ref(),
                replicas,
            )?;
            Fenceposts {
                max_surge: 0,
                ..resolved
            }
        }
        _ => return Ok(Fenceposts::default()),
    };
    resolved.max_unavailable = resolved.max_unavailable.min(replicas);
    Ok(resolved)
}

/// How far the new set of an InPlaceUpdate may grow with fresh machines (the reference's `NewISNewReplicas`):
/// `inPlaceUpdate.maxSurge` resolved against the replicas (rounded up, absent is 1) with `Auto`, 0 with `Manual` (the
/// new set starts empty and only receives the machines updated in place).
pub fn in_place_surge(deployment: &MachineDeployment) -> Result<i32, FencepostError> {
    let in_place = deployment.spec.strategy.in_place_update.as_ref();
    if in_place.is_some_and(InPlaceUpdateMachineDeployment::is_manual) {
        return Ok(0);
    }
    match in_place.and_then(|p| p.max_surge.as_ref()) {
        None => Ok(DEFAULT_FENCEPOST),
        Some(value) => {
            scaled_value(value, deployment.spec.replicas.max(0), true).map_err(|reason| FencepostError {
                path: IN_PLACE_UPDATE_PATHS.0,
                reason,
            })
        }
    }
}
