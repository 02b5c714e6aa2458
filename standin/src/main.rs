//! `mongoguard-standin`: run the in-memory MongoDB test stand-in (NOT a database) as a process.

use std::io::Write;
use std::net::SocketAddr;

use clap::Parser;
use mongoguard_standin::{Fault, StandIn, StandInConfig};

/// An in-memory MongoDB wire-protocol stand-in for tests, benchmarks and demos.
/// It is NOT a database: nothing is persisted and query semantics are a subset.
#[derive(Debug, Parser)]
#[command(name = "mongoguard-standin", version)]
struct Args {
    /// Address to listen on (port 0 = any free port).
    #[arg(long, default_value = "127.0.0.1:27018")]
    listen: SocketAddr,
    /// maxWireVersion to report (21 = MongoDB 7.0; 8, 13, 17, 25 = 4.2, 5.0, 6.0, 8.0).
    #[arg(long, default_value_t = 21)]
    wire_version: i32,
    /// A user in database admin, as NAME:PASSWORD (repeatable). Without any, no auth.
    #[arg(long = "user", value_name = "NAME:PASSWORD", value_parser = parse_user)]
    users: Vec<(String, String)>,
    /// Present a one-member replica set with this name.
    #[arg(long)]
    replica_set: Option<String>,
    /// Compressors to offer, comma separated (subset of snappy,zlib,zstd; empty = none).
    #[arg(long, default_value = "snappy,zlib,zstd")]
    compressors: String,
    /// Fault to inject: none | close-after:N | stall | delay-ms:N | garbage | close-immediately.
    #[arg(long, default_value = "none")]
    fault: Fault,
}

fn parse_user(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((u, p)) if !u.is_empty() => Ok((u.to_string(), p.to_string())),
        _ => Err(format!("expected NAME:PASSWORD, got '{s}'")),
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let config = StandInConfig {
        listen: args.listen,
        wire_version: args.wire_version,
        users: args.users,
        replica_set: args.replica_set,
        compressors: args
            .compressors
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
    };
    let standin = StandIn::start(config).await?;
    standin.set_fault(args.fault);
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "mongoguard-standin listening on {}", standin.addr())?;
        out.flush()?;
    }
    wait_for_signal().await;
    tracing::info!("signal received, shutting down");
    standin.shutdown().await;
    Ok(())
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
