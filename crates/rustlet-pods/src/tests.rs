//! Tests of the pod workers, status generation and the simulated runtime.
