//! `mongoguard-standin`: run the in-memory MongoDB test stand-in (NOT a database) as a process.

use std::io::Write;
use std::net::SocketAddr;

use clap::Parser;
use mongoguard_standin::{Fault, ReplicaSet, ReplicaSetConfig, StandIn, StandInConfig};

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
    /// Present a replica set with this name (one member unless --members says more).
    #[arg(long)]
    replica_set: Option<String>,
    /// Number of replica set members (needs --replica-set when above 1). They share one
    /// in-memory store; member 0 is primary at start; member I listens on the --listen port
    /// plus I (port 0: each its own free port).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    members: u16,
    /// Compressors to offer, comma separated (subset of snappy,zlib,zstd; empty = none).
    #[arg(long, default_value = "snappy,zlib,zstd")]
    compressors: String,
    /// Act as a mongos behind a load balancer: each connection's first hello must carry
    /// loadBalanced: true, and gets a serviceId.
    #[arg(long)]
    load_balanced: bool,
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
    let signalled = shutdown_signal();
    if args.members > 1 && args.replica_set.is_none() {
        clap::Error::raw(
            clap::error::ErrorKind::ArgumentConflict,
            "--members above 1 needs --replica-set NAME\n",
        )
        .exit();
    }
    let config = StandInConfig {
        listen: args.listen,
        wire_version: args.wire_version,
        users: args.users,
        replica_set: args.replica_set.clone(),
        compressors: args
            .compressors
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        load_balanced: args.load_balanced,
    };
    match args.replica_set {
        Some(name) if args.members > 1 => {
            let set = ReplicaSet::start(ReplicaSetConfig {
                name: name.clone(),
                members: usize::from(args.members),
                base: config,
            })
            .await?;
            for m in set.members() {
                m.set_fault(args.fault);
            }
            {
                let mut out = std::io::stdout().lock();
                for (i, m) in set.members().iter().enumerate() {
                    if i == 0 {
                        writeln!(out, "mongoguard-standin listening on {}", m.addr())?;
                    } else {
                        writeln!(
                            out,
                            "mongoguard-standin member {i} listening on {}",
                            m.addr()
                        )?;
                    }
                }
                writeln!(
                    out,
                    "mongoguard-standin replica set {name} uri {}",
                    set.uri()
                )?;
                out.flush()?;
            }
            signalled.await;
            tracing::info!("signal received, shutting down");
            set.shutdown().await;
        }
        _ => {
            let standin = StandIn::start(config).await?;
            standin.set_fault(args.fault);
            {
                let mut out = std::io::stdout().lock();
                // Exactly one line, as before --members existed (scripts rely on it).
                writeln!(out, "mongoguard-standin listening on {}", standin.addr())?;
                out.flush()?;
            }
            signalled.await;
            tracing::info!("signal received, shutting down");
            standin.shutdown().await;
        }
    }
    Ok(())
}

/// Registers the SIGINT / SIGTERM handlers now (before the "listening" lines are printed, so
/// that a script may signal as soon as it has read them) and resolves at the first signal.
#[cfg(unix)]
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Ok(mut term), Err(_)) => {
                term.recv().await;
            }
            (Err(_), Ok(mut int)) => {
                int.recv().await;
            }
            (Err(_), Err(_)) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

#[cfg(not(unix))]
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
