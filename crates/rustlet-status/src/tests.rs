//! Upstream status_manager_test.go ported by name, and the past-upstream behaviour.
