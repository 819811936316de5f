//! Upstream `status_manager_test.go` ported by name, then the behaviour past upstream.

mod changed_only;
mod hardening;
mod harness;
mod kick_interval;
mod past_upstream;
mod resize;
mod upstream;
