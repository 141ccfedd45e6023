//! maxSurge and maxUnavailable, resolved against the replicas (surge rounds up, unavailable down, never both zero).
//!
//! Separate because every strategy and every scaling reads them.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::{MachineDeployment, StrategyType, validation::check_int_or_percent};

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
    let resolve = |value: Option<&IntOrString>, round_up: bool, path: &'static str| match value {
        None => Ok(DEFAULT_FENCEPOST),
        Some(value) => {
            scaled_value(value, replicas, round_up).map_err(|reason| FencepostError { path, reason })
        }
    };
    let max_surge = resolve(max_surge, true, "spec.strategy.rollingUpdate.maxSurge")?;
    let mut max_unavailable = resolve(
        max_unavailable,
        false,
        "spec.strategy.rollingUpdate.maxUnavailable",
    )?;
    if max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1;
    }
    Ok(Fenceposts {
        max_surge,
        max_unavailable,
    })
}

/// The fenceposts a deployment rolls with (Kubernetes' `MaxSurge` and `MaxUnavailable`): [`resolve_fenceposts`] for a
/// RollingUpdate, with maxUnavailable capped at `replicas` (0 when `replicas` is 0); both 0 for the other strategies
/// (they do not surge, and Recreate takes every machine down anyway).
pub fn fenceposts(deployment: &MachineDeployment) -> Result<Fenceposts, FencepostError> {
    let strategy = &deployment.spec.strategy;
    if strategy.strategy_type() != Ok(StrategyType::RollingUpdate) {
        return Ok(Fenceposts::default());
    }
    let rolling = strategy.rolling_update.clone().unwrap_or_default();
    let replicas = deployment.spec.replicas.max(0);
    let mut resolved = resolve_fenceposts(
        rolling.max_surge.as_ref(),
        rolling.max_unavailable.as_ref(),
        replicas,
    )?;
    resolved.max_unavailable = resolved.max_unavailable.min(replicas);
    Ok(resolved)
}
