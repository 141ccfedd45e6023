//! The local provider (not built yet; the embedded-default issue fills it): machines are local process trees that
//! boot from userData and run `mcm node-agent`.
