//! rustlet-api
