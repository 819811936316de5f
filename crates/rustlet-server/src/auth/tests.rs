//! Tests of the kubelet filter.
