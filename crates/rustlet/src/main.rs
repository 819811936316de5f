//! rustlet: the node agent binary. Parses the command line and the config file, sets up
//! logging, and runs the agent (`agent.rs`) until SIGTERM or SIGINT.
//!
//! Glue only: every rule lives in a library crate below it. Exit codes: 0 after a clean stop,
//! 2 for a bad flag or config value (one line naming it), 1 when the agent cannot start or
//! fails.

mod agent;
mod config;
mod http;
mod logs;
mod process;
mod server;
mod services;
mod stats;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use config::{AgentConfig, Cli, LogFormat};
use tracing_subscriber::EnvFilter;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("RUSTLET_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal (and not with `NO_COLOR` set): a redirected log stays
    // plain text.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return ExitCode::from(u8::try_from(code).unwrap_or(2));
        }
    };
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
        && std::path::Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token").exists();
    let config = match AgentConfig::resolve(cli, in_cluster) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("rustlet: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Volume operations run on blocking threads. A storm of 1,000 pods started ~180 of
        // them (each with its stack and malloc arena) to contend for the kernel's mount and
        // inode locks on two cores; 32 keep the same pace with a third of the threads, and
        // leave room for a few operations stuck in the kernel.
        .max_blocking_threads(32)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rustlet: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(agent::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rustlet: {e:#}");
            ExitCode::from(1)
        }
    }
}
