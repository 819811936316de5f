//! Cross-module tests of the status rules: upstream tests ported by name, and properties.

mod generate;
mod merge;
mod properties;
mod terminate;
mod update;
