//! Cross-module tests of the status rules: upstream tests ported by name, and properties.
