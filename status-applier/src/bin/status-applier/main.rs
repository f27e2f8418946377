//! `status-applier`: the server (`serve`) and the client commands that talk to it.
//!
//! This file holds the command line (`Cli`, `Command`, the flag groups several commands
//! share) and the dispatch; each command lives in a module of its own: `serve` and
//! `client_commands` (`submit`, `show`, `conflicts`). The `audit` command is the library's
//! `ownership` module, which the kubectl plugin `kubectl-ownership` shares.
#![forbid(unsafe_code)]

mod client_commands;
mod serve;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use client_commands::{Format, ShowFilter, print_answer, submit};
use serve::{ServeArgs, serve};
use status_applier::client::Client;
use status_applier::ownership::{AuditArgs, Verdict, audit};
use std::path::PathBuf;

/// A server-side-apply field-manager sidecar.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the intent API and apply intents to the API server.
    Serve(Box<ServeArgs>),
    /// Submit intents (YAML or JSON; several YAML documents in one file are submitted in order).
    Submit {
        #[command(flatten)]
        socket: SocketArg,
        /// The intent file, or - for standard input.
        #[arg(short = 'f', long = "filename")]
        file: String,
        /// Answer once the intent is merged, without waiting for its apply.
        #[arg(long)]
        no_wait: bool,
    },
    /// Print every desired document (as JSON, or as apply configurations with the kubectl
    /// command that reproduces each).
    Show {
        #[command(flatten)]
        socket: SocketArg,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Json)]
        output: Format,
        #[command(flatten)]
        filter: ShowFilter,
    },
    /// Print the recent conflicts.
    Conflicts {
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Audit field ownership: every field with all its co-owners, and the protected paths
    /// (exactly the expected owner, no foreign writer). Exits 1 on a violation, 2 when it
    /// cannot run (unreadable input, an unreachable API server).
    Audit(AuditArgs),
}

#[derive(Args)]
struct SocketArg {
    /// The Unix socket of the server.
    #[arg(
        long,
        env = "STATUS_APPLIER_SOCKET",
        default_value = "/var/run/status-applier/applier.sock"
    )]
    socket: PathBuf,
}

/// Exit codes: 0 success; 1 an audit found a violation, or a command failed; 2 an audit
/// could not run (so a check for exit 1 cannot pass on an error).
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let audit_run = matches!(cli.command, Command::Audit(_));
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(Verdict::Clean) => std::process::ExitCode::SUCCESS,
        Ok(Verdict::Violations) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(if audit_run { 2 } else { 1 })
        }
    }
}

async fn run(cli: Cli) -> Result<Verdict> {
    let done = |r: Result<()>| r.map(|()| Verdict::Clean);
    match cli.command {
        Command::Serve(args) => done(serve(*args).await),
        Command::Submit {
            socket,
            file,
            no_wait,
        } => done(submit(&socket.socket, &file, !no_wait).await),
        Command::Show {
            socket,
            output,
            filter,
        } => {
            let format = match output {
                Format::Json => "json",
                Format::Yaml => "yaml",
            };
            let path = format!("/v1/intents?format={format}{}", filter.query());
            done(print_answer(Client::new(&socket.socket).get(&path).await?))
        }
        Command::Conflicts { socket } => done(print_answer(
            Client::new(&socket.socket).get("/v1/conflicts").await?,
        )),
        Command::Audit(args) => audit(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
