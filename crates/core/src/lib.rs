//! Pure decisions of the machine controller manager: no client, no clock (time is a parameter), no I/O.
//!
//! Filled by the controller issues: the machine phase machine, creation and deletion steps, health, the retry
//! policy per machine code (on the tables of `mcm_driver::retry`), the drain plan, replica diffs, deletion order,
//! rollout arithmetic and safety thresholds. It depends only on `mcm-api` and `mcm-driver`.
