//! Tests of rotation.
