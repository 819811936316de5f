//! rustlet-mount
