//! rustlet-status
