//! `kubectl ownership`: the field-ownership audit of `status-applier audit` as a kubectl
//! plugin. Put `kubectl-ownership` on the PATH and kubectl finds it. It follows kubectl's
//! conventions: the kubeconfig's current namespace unless `-n` or `-A` is given, `-o`,
//! `--kubeconfig` and `--context`. Exit codes as `status-applier audit`: 0 clean, 1 a
//! violation, 2 the audit could not run.
#![forbid(unsafe_code)]

use clap::Parser;
use status_applier::ownership::{AuditArgs, DefaultScope, audit, exit_code};

/// Audit field ownership: every field with all its co-owners (manager, operation,
/// subresource, time), and the protected paths of a policy (exactly the expected owner, no
/// foreign writer).
#[derive(Parser)]
#[command(name = "kubectl ownership", version, about)]
struct Cli {
    #[command(flatten)]
    audit: AuditArgs,
}

fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    cli.audit.default_scope = DefaultScope::ContextNamespace;
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let result = runtime.block_on(audit(cli.audit));
    if let Err(e) = &result {
        eprintln!("error: {e:#}");
    }
    exit_code(&result)
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
