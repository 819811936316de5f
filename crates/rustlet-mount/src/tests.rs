//! Tests on the real kernel: mounts (privileged, in a private mount namespace), symlink escapes
//! on every safe-path operation, and removal that stops at mount points.

mod escapes;
mod mounts;
mod removal;
