//! maxSurge and maxUnavailable.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcm_api::{MachineDeployment, MachineDeploymentStrategy, RollingUpdateMachineDeployment};
use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;

#[test]
fn surge_rounds_up_unavailable_rounds_down() {
    // Reference §6.3 ResolveFenceposts: "surge = percentage of replicas rounded up, unavailable = percentage
    // rounded down".
    let resolved = resolve_fenceposts(Some(&pct("25%")), Some(&pct("25%")), 10).unwrap();
    assert_eq!(resolved, fp(3, 2));
    assert_eq!(
        resolve_fenceposts(Some(&IntOrString::Int(2)), Some(&pct("100%")), 7).unwrap(),
        fp(2, 7)
    );
    assert_eq!(
        resolve_fenceposts(None, None, 10).unwrap(),
        fp(1, 1),
        "absent values are 1"
    );
}

#[test]
fn never_both_zero() {
    // Reference: "If both come out as 0, unavailable becomes 1."
    assert_eq!(
        resolve_fenceposts(Some(&pct("0%")), Some(&pct("10%")), 5).unwrap(),
        fp(0, 1)
    );
    assert_eq!(
        resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&IntOrString::Int(0)), 5).unwrap(),
        fp(0, 1)
    );
}

#[test]
fn the_deployments_fenceposts_cap_unavailable_at_replicas() {
    // Reference: "MaxUnavailable is capped at replicas and is 0 when replicas=0."
    let mut md = MachineDeployment::default();
    md.spec.replicas = 2;
    md.spec.strategy.rolling_update = Some(RollingUpdateMachineDeployment {
        max_unavailable: Some(IntOrString::Int(5)),
        max_surge: Some(pct("50%")),
    });
    assert_eq!(fenceposts(&md).unwrap(), fp(1, 2));
    md.spec.replicas = 0;
    assert_eq!(fenceposts(&md).unwrap(), fp(0, 0));
    md.spec.strategy = MachineDeploymentStrategy {
        r#type: "Recreate".into(),
        ..MachineDeploymentStrategy::default()
    };
    md.spec.replicas = 5;
    assert_eq!(fenceposts(&md).unwrap(), Fenceposts::default());
    let mut bad = MachineDeployment::default();
    bad.spec.strategy.rolling_update = Some(RollingUpdateMachineDeployment {
        max_unavailable: None,
        max_surge: Some(pct("lots")),
    });
    let err = fenceposts(&bad).unwrap_err();
    assert_eq!(err.path, "spec.strategy.rollingUpdate.maxSurge");
}

proptest! {
    #[test]
    fn fenceposts_round_as_kubernetes_and_are_never_both_zero(
        surge in 0i32..=200,
        unavailable in 0i32..=100,
        replicas in 0i32..500,
        percent in any::<(bool, bool)>(),
    ) {
        let value = |n: i32, as_percent: bool| {
            if as_percent { pct(&format!("{n}%")) } else { IntOrString::Int(n) }
        };
        let (surge_value, unavailable_value) = (value(surge, percent.0), value(unavailable, percent.1));
        let resolved = resolve_fenceposts(Some(&surge_value), Some(&unavailable_value), replicas).unwrap();
        // Exact rounding in integers: ceil(p·r/100) for the surge, floor(p·r/100) for unavailability.
        let of = |p: i32| i64::from(p) * i64::from(replicas);
        let exact_surge = if percent.0 { (of(surge) + 99).div_euclid(100) } else { i64::from(surge) };
        let mut exact_unavailable =
            if percent.1 { of(unavailable).div_euclid(100) } else { i64::from(unavailable) };
        if exact_surge == 0 && exact_unavailable == 0 {
            exact_unavailable = 1;
        }
        prop_assert_eq!(i64::from(resolved.max_surge), exact_surge);
        prop_assert_eq!(i64::from(resolved.max_unavailable), exact_unavailable);
        prop_assert!(resolved.max_surge > 0 || resolved.max_unavailable > 0);
    }
}
