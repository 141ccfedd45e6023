//! The Go duration text shared by the force reasons and the outcomes (one home).

use std::time::Duration;

use mcm_api::GoDuration;

pub(super) fn go(duration: Duration) -> String {
    GoDuration::from_std(duration).0
}
