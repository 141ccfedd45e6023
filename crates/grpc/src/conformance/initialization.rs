//! The initialization rule of the conformance suite (spec 002 section 11), judged over the GetMachineStatus answers
//! the suite saw for its main machine: a pure function, so that every order of answers is tested here.

use mcm_driver::MachineCode;

use super::{Outcome, Verdict};

/// A GetMachineStatus answer for the main machine: whether an InitializeMachine had succeeded before it, and its
/// code (OK for a found VM; None when it did not answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StatusSeen {
    pub(super) initialized: bool,
    pub(super) code: Option<MachineCode>,
}

/// The initialization rule over the main machine's GetMachineStatus answers (see
/// [`super::UNINITIALIZED_UNTIL_INITIALIZED`]). `initialize_declared`: whether InitializeMachine is declared.
pub(super) fn judge_initialization(
    name: &str,
    statuses: &[StatusSeen],
    initialize_declared: bool,
) -> Verdict {
    let Some(first) = statuses
        .iter()
        .position(|s| s.code == Some(MachineCode::Uninitialized))
    else {
        return Ok(Outcome::Passed);
    };
    if !initialize_declared {
        return Err(format!(
            "GetMachineStatus of machine {name} answered Uninitialized, but the provider does not declare \
             InitializeMachine: nothing could ever initialize the VM"
        ));
    }
    for (n, seen) in statuses.iter().enumerate().skip(first + 1) {
        match (seen.initialized, seen.code) {
            (false, Some(MachineCode::Ok)) => {
                return Err(format!(
                    "GetMachineStatus of machine {name} answered Uninitialized (answer {}), then OK (answer {}) \
                     before any InitializeMachine had succeeded: a VM answered Uninitialized must stay so until \
                     InitializeMachine succeeds",
                    first + 1,
                    n + 1
                ));
            }
            (true, Some(MachineCode::Uninitialized)) => {
                return Err(format!(
                    "GetMachineStatus of machine {name} still answered Uninitialized (answer {}) after \
                     InitializeMachine had succeeded",
                    n + 1
                ));
            }
            _ => {}
        }
    }
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(initialized: bool, code: MachineCode) -> StatusSeen {
        StatusSeen {
            initialized,
            code: Some(code),
        }
    }

    const OK: MachineCode = MachineCode::Ok;
    const UNINIT: MachineCode = MachineCode::Uninitialized;

    #[test]
    fn uninitialized_until_initialized_then_ok_passes() {
        let statuses = [seen(false, UNINIT), seen(false, UNINIT), seen(true, OK)];
        assert_eq!(judge_initialization("m", &statuses, true), Ok(Outcome::Passed));
    }

    #[test]
    fn a_provider_with_nothing_to_initialise_may_answer_ok_from_the_start() {
        let statuses = [seen(false, OK), seen(false, OK), seen(true, OK)];
        assert_eq!(judge_initialization("m", &statuses, true), Ok(Outcome::Passed));
        assert_eq!(judge_initialization("m", &statuses, false), Ok(Outcome::Passed));
    }

    #[test]
    fn ok_before_initialization_after_uninitialized_fails_naming_the_answers() {
        let statuses = [seen(false, UNINIT), seen(false, OK), seen(true, OK)];
        let err = judge_initialization("m-1", &statuses, true).unwrap_err();
        assert!(
            err.contains("machine m-1 answered Uninitialized (answer 1), then OK (answer 2)"),
            "{err}"
        );
        assert!(
            err.contains("before any InitializeMachine had succeeded"),
            "{err}"
        );
    }

    #[test]
    fn uninitialized_after_initialization_fails() {
        let statuses = [seen(false, UNINIT), seen(true, UNINIT)];
        let err = judge_initialization("m", &statuses, true).unwrap_err();
        assert!(
            err.contains("still answered Uninitialized (answer 2) after InitializeMachine"),
            "{err}"
        );
    }

    #[test]
    fn uninitialized_without_a_declared_initialize_machine_fails() {
        let err = judge_initialization("m", &[seen(false, UNINIT)], false).unwrap_err();
        assert!(err.contains("does not declare InitializeMachine"), "{err}");
    }
}
