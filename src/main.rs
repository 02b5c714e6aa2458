//! The mongoguard command line. The only place `anyhow` is used.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::Parser;
use mongoguard::{
    config::{Config, LogFormat},
    proxy::Proxy,
};

/// A MongoDB wire-protocol guard proxy.
///
/// Applications connect to mongoguard instead of mongod or mongos. It decodes every message,
/// forwards the original bytes upstream, and relays the replies.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// Configuration file (TOML). Flags below override its values.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:27017.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Upstream mongod/mongos, e.g. mongodb://127.0.0.1:27018.
    #[arg(long, value_name = "URI")]
    upstream: Option<String>,
    /// Log format.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// Log filter, e.g. info, debug, mongoguard=debug.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Validate the configuration, print it, and exit.
    #[arg(long)]
    check_config: bool,
}

fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(listen) = cli.listen {
        config.proxy.listen = listen;
    }
    if let Some(uri) = &cli.upstream {
        config.upstream.uri = uri.parse().context("--upstream")?;
    }
    if let Some(format) = cli.log_format {
        config.log.format = format;
    }
    if let Some(level) = &cli.log_level {
        config.log.level = level.clone();
    }
    config.validate()?;
    Ok(config)
}

fn init_logging(config: &Config) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log.level)
        .with_context(|| format!("invalid log level {:?}", config.log.level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = load_config(&cli)?;
    if cli.check_config {
        println!("configuration OK: {config:#?}");
        return Ok(());
    }
    init_logging(&config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let proxy = Proxy::start(Arc::new(config)).await?;
        proxy.run_until_signal().await?;
        anyhow::Ok(())
    })
}
