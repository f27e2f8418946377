//! Logging set-up, the same for both binaries.

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), as text or as JSON lines.
pub fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
