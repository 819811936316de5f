//! Populator and facade tests (upstream `desired_state_of_world_populator_test.go` and
//! `volume_manager_test.go` cases for inline volumes), and real-mount integration tests.

mod content;
mod manager;
mod populator;
mod reconstruct;
