//! rustlet-volume
