//! `gpuledger-agent`: the node agent as its own small binary (the same agent as
//! `gpuledger agent`, without the server's code). Logs go to stderr, so with `--dry-run` stdout
//! holds only the JSON bodies. `GPULEDGER_LOG` sets the log filter (`debug` shows every delivery),
//! as for `gpuledger`.

use std::io::IsTerminal;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "gpuledger-agent",
    version,
    about = "Report this host's GPUs to gpuledger: read-only on the GPU, outbound only, buffered on disk"
)]
struct Cli {
    #[command(flatten)]
    agent: gpuledger_agent::AgentArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPULEDGER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match gpuledger_agent::run(cli.agent) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuledger-agent: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
