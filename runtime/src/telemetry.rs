//! Process set-up shared by every binary.

/// Structured logs filtered by `RUST_LOG` (default `info`), colour only on
/// a terminal, and ring as the one rustls crypto provider (the workspace
/// also links aws-lc-rs through the AWS SDK, so rustls cannot pick by
/// itself).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let _ = rustls::crypto::ring::default_provider().install_default();
}
