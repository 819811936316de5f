//! rustlet: the node agent binary. Not built yet: CLI, config and wiring come with the crates
//! they wire (see the README for what works today).
//!
//! Glue only: every rule lives in a library crate below it.

fn main() {
    eprintln!("rustlet: the agent is not assembled yet; see README.md for what works today");
    std::process::exit(2);
}
