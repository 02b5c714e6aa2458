//! `loadgen`: a closed-loop MongoDB wire-protocol load generator.
//!
//! Speaks raw OP_MSG over TCP (no driver, no pool) so that it measures the
//! network path: each connection sends one request, waits for its reply,
//! records the latency, and repeats until the measured window closes.

mod auth;
mod report;
mod wire;
mod workload;

#[cfg(test)]
mod fake_tests;

use std::io::Write;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use mongoguard::wire::Compressor;

use crate::auth::AuthOptions;
use crate::report::Row;
use crate::wire::{Endpoint, TlsClient};
use crate::workload::{Op, Scenario, Settings};

#[derive(Clone, Debug)]
struct Target {
    name: String,
    /// HOST:PORT.
    addr: String,
    /// Given as `tls://HOST:PORT`: connect with TLS (needs --tls-ca).
    tls: bool,
}

impl Target {
    /// The address as given (with `tls://` for a TLS target).
    fn shown(&self) -> String {
        if self.tls {
            format!("tls://{}", self.addr)
        } else {
            self.addr.clone()
        }
    }
}

fn parse_cpu_pid(s: &str) -> Result<(String, u32), String> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=PID, got {s:?}"))?;
    let pid = pid
        .parse::<u32>()
        .map_err(|_| format!("expected NAME=PID, got {s:?}"))?;
    if name.is_empty() {
        return Err(format!("expected NAME=PID, got {s:?}"));
    }
    Ok((name.to_string(), pid))
}

fn parse_target(s: &str) -> Result<Target, String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=HOST:PORT, got {s:?}"))?;
    let (addr, tls) = match addr.strip_prefix("tls://") {
        Some(rest) => (rest, true),
        None => (addr, false),
    };
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("expected HOST:PORT after '=', got {addr:?}"))?;
    if name.is_empty() || host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("expected NAME=HOST:PORT, got {s:?}"));
    }
    Ok(Target {
        name: name.to_string(),
        addr: addr.to_string(),
        tls,
    })
}

/// The endpoint of `t`: plain, or TLS trusting `ca` and checking the target's host.
fn endpoint(t: &Target, ca: Option<&std::path::Path>, resume: bool) -> anyhow::Result<Endpoint> {
    if !t.tls {
        return Ok(Endpoint::plain(&t.addr));
    }
    let ca =
        ca.with_context(|| format!("target {} is tls:// but --tls-ca is not given", t.name))?;
    let host = t
        .addr
        .rsplit_once(':')
        .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
        .unwrap_or(&t.addr);
    Ok(Endpoint {
        addr: t.addr.clone(),
        tls: Some(TlsClient::new(ca, host, resume)?),
    })
}

/// Closed-loop MongoDB OP_MSG load generator (measures the path, not a driver).
#[derive(Parser, Debug)]
#[command(name = "loadgen", version)]
struct Cli {
    /// Target as NAME=HOST:PORT (or NAME=tls://HOST:PORT for TLS, with --tls-ca); repeat
    /// to run several targets in turn with the same settings. A target named `direct` is
    /// the baseline for "added latency".
    #[arg(long = "target", value_name = "NAME=[tls://]HOST:PORT", required = true, value_parser = parse_target)]
    targets: Vec<Target>,

    /// PEM file of the CA(s) that sign the certificates of tls:// targets. The certificate
    /// must name the target's host (DNS name, or an IP SAN for an address).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,

    /// Let TLS connections resume an earlier session (rustls' in-memory cache). Off by
    /// default: every TLS connection pays a full handshake.
    #[arg(long)]
    tls_resume: bool,

    /// NAME=PID: the process behind target NAME, whose CPU time (utime + stime from
    /// /proc/PID/stat over the measured window) is reported per request; repeatable.
    #[arg(long = "cpu-pid", value_name = "NAME=PID", value_parser = parse_cpu_pid)]
    cpu_pids: Vec<(String, u32)>,

    /// Concurrent connections (one request in flight each); repeatable or comma list.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    concurrency: Vec<usize>,

    /// Measured seconds per run (after warmup).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,

    /// Warmup seconds per run (requests sent, not recorded).
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,

    /// Operation(s); repeatable or comma list. mix = 80% find by _id, 10% insert, 10% ping;
    /// find101 = 101 documents of 1 KiB by _id range; insertmany = 1,000 documents in one
    /// insert; drain = find (batchSize 100) + getMore until the cursor is exhausted, 1,000
    /// documents of 1 KiB, counted as one request; update1000 = one update of 1,000
    /// statements by _id.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ping")]
    op: Vec<Op>,

    /// Negotiate this compressor in hello (the server must agree) and send every request
    /// after the handshake as OP_COMPRESSED; compressed replies are accepted.
    #[arg(long, value_enum)]
    compress: Option<CompressArg>,

    /// 1 KiB documents (`_id` 0..N) set up in `<coll>_1k` for find101 and drain (drain reads
    /// 1,000 of them, so at least 1000).
    #[arg(long = "docs-1k", default_value_t = workload::DEFAULT_DOCS_1K)]
    docs_1k: i64,

    /// Database for find/insert.
    #[arg(long, default_value = "loadgen")]
    db: String,

    /// Collection for find/insert.
    #[arg(long, default_value = "bench")]
    coll: String,

    /// Documents inserted by the setup phase (collection dropped first), per target.
    #[arg(long, default_value_t = 10_000)]
    docs: i64,

    /// Print results as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,

    /// Append the results as a markdown table to FILE.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,

    /// Run order: `interleave` runs every target for one (op, concurrency) before
    /// the next, so background load drifts hit all targets alike; `target` runs
    /// all of one target's runs, then the next target's.
    #[arg(long, value_enum, default_value = "interleave")]
    order: Order,

    /// Runtime worker threads (default: number of CPUs).
    #[arg(long)]
    threads: Option<usize>,

    /// `steady`: long-lived connections, one request in flight each. `serverless`: every
    /// operation connects, sends hello, authenticates (with --user), runs one command
    /// (--op) and closes; its latency covers all of that.
    #[arg(long, value_enum, default_value = "steady")]
    scenario: Scenario,

    /// Serverless: connect as drivers do (server discovery and monitoring): first a
    /// monitoring connection whose hello must be answered (TLS when the target has it, no
    /// authentication), then the application connection; both close after the command.
    #[arg(long)]
    discover: bool,

    /// Authenticate every connection with SCRAM-SHA-256 as this user (needs --password).
    #[arg(long, requires = "password")]
    user: Option<String>,

    /// Password for --user.
    #[arg(long, requires = "user")]
    password: Option<String>,

    /// Authentication database (authSource).
    #[arg(long, default_value = "admin")]
    auth_db: String,

    /// Authenticate with saslStart after hello instead of inside it
    /// (speculativeAuthenticate, which drivers use, is the default).
    #[arg(long)]
    no_speculative: bool,

    /// Do not ask for skipEmptyExchange: the server then answers client-final with
    /// done: false and the client sends the extra empty saslContinue.
    #[arg(long)]
    no_skip_empty_exchange: bool,

    /// Instead of a load run: send `{standinStats: 1}` (mongoguard-standin's counters) to
    /// every target and print each reply as one JSON line `{"target": NAME, ...reply}`.
    #[arg(long)]
    standin_stats: bool,

    /// Only run the setup phase (drop the collection, insert --docs documents) on every
    /// target, then exit.
    #[arg(long, conflicts_with = "no_setup")]
    setup_only: bool,

    /// Skip the setup phase: the collection already holds documents with `_id` 0..docs.
    #[arg(long)]
    no_setup: bool,

    /// First `_id` of the run's inserts (default: --docs). Give each invocation its own
    /// range when several share one collection without a setup phase in between.
    #[arg(long)]
    first_insert_id: Option<i64>,

    /// With --standin-stats: zero the counters right after reading them (`reset: true`).
    #[arg(long, requires = "standin_stats")]
    reset: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum CompressArg {
    Snappy,
    Zlib,
    Zstd,
}

impl CompressArg {
    fn compressor(self) -> Compressor {
        match self {
            CompressArg::Snappy => Compressor::Snappy,
            CompressArg::Zlib => Compressor::Zlib,
            CompressArg::Zstd => Compressor::Zstd,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Order {
    Interleave,
    Target,
}

async fn setup(t: &Target, ep: &Endpoint, settings: &Settings) {
    eprintln!(
        "[{}] setup: drop {}.{} and insert {} docs",
        t.name, settings.db, settings.coll, settings.docs
    );
    if settings.docs_1k > 0 {
        eprintln!(
            "[{}] setup: drop {}.{} and insert {} docs of 1 KiB",
            t.name,
            settings.db,
            workload::coll_1k(&settings.coll),
            settings.docs_1k
        );
    }
    if let Err(e) = workload::setup(ep, settings).await {
        eprintln!(
            "[{}] setup failed (runs go on, expect errors or misses): {e:#}",
            t.name
        );
    }
}

fn secs(v: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("invalid --{what} {v}"))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Some(n) = cli.threads {
        rt.worker_threads(n.max(1));
    }
    let rt = rt.build().context("building tokio runtime")?;
    rt.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let endpoints = cli
        .targets
        .iter()
        .map(|t| endpoint(t, cli.tls_ca.as_deref(), cli.tls_resume))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if cli.standin_stats {
        for (t, ep) in cli.targets.iter().zip(&endpoints) {
            let mut reply = workload::standin_stats(ep, cli.reset)
                .await
                .with_context(|| format!("standinStats on {} ({})", t.name, t.shown()))?;
            let mut line = serde_json::Map::new();
            line.insert("target".into(), t.name.clone().into());
            line.append(&mut reply);
            println!("{}", serde_json::Value::Object(line));
        }
        return Ok(());
    }
    let settings = Settings {
        db: cli.db.clone(),
        coll: cli.coll.clone(),
        docs: cli.docs.max(0),
        warmup: secs(cli.warmup, "warmup")?,
        duration: secs(cli.duration, "duration")?,
        scenario: cli.scenario,
        auth: match (&cli.user, &cli.password) {
            (Some(user), Some(password)) => Some(AuthOptions {
                user: user.clone(),
                password: password.clone(),
                db: cli.auth_db.clone(),
                speculative: !cli.no_speculative,
                skip_empty_exchange: !cli.no_skip_empty_exchange,
            }),
            _ => None,
        },
        // Only when an op reads them (with --setup-only: an op given with --op).
        docs_1k: if cli.op.iter().any(|o| o.needs_1k() > 0) {
            cli.docs_1k
        } else {
            0
        },
        compress: cli.compress.map(CompressArg::compressor),
        discover: cli.discover,
    };
    if let Some(op) = cli.op.iter().find(|o| o.needs_1k() > cli.docs_1k) {
        anyhow::bail!(
            "--op {} reads {} documents of 1 KiB: --docs-1k must be at least that",
            op.name(),
            op.needs_1k()
        );
    }
    if settings.duration.is_zero() {
        anyhow::bail!("--duration must be > 0");
    }
    if cli.concurrency.contains(&0) {
        anyhow::bail!("--concurrency must be >= 1");
    }
    if cli.setup_only {
        for (t, ep) in cli.targets.iter().zip(&endpoints) {
            workload::setup(ep, &settings)
                .await
                .with_context(|| format!("setup on {} ({})", t.name, t.shown()))?;
        }
        return Ok(());
    }
    let needs_data = !cli.no_setup && cli.op.iter().any(|o| o.needs_data());
    // (target index, op, concurrency) in execution order.
    let mut plan = Vec::new();
    for &op in &cli.op {
        for &c in &cli.concurrency {
            for ti in 0..cli.targets.len() {
                plan.push((ti, op, c));
            }
        }
    }
    if cli.order == Order::Target {
        plan.sort_by_key(|&(ti, _, _)| ti); // stable: keeps op/concurrency order
    }
    // _ids for inserts: unique across the whole invocation, above the preloaded
    // range, so targets that share one upstream never collide.
    let next_id = Arc::new(AtomicI64::new(cli.first_insert_id.unwrap_or(settings.docs)));
    let mut set_up = vec![false; cli.targets.len()];
    let mut rows = Vec::new();
    for (ti, op, c) in plan {
        let t = &cli.targets[ti];
        if needs_data && !set_up[ti] {
            // Target order: set up right before the target's first run.
            // Interleaved: set up every target before the first run.
            let due: Vec<usize> = match cli.order {
                Order::Target => vec![ti],
                Order::Interleave => (0..cli.targets.len()).collect(),
            };
            for i in due {
                setup(&cli.targets[i], &endpoints[i], &settings).await;
                set_up[i] = true;
            }
        }
        eprintln!(
            "[{}] {} {} concurrency={} warmup={:?} duration={:?}",
            t.name,
            settings.scenario.name(),
            op.name(),
            c,
            settings.warmup,
            settings.duration
        );
        let cpu_pid = cli
            .cpu_pids
            .iter()
            .find(|(name, _)| *name == t.name)
            .map(|(_, pid)| *pid);
        let r = workload::run(&endpoints[ti], op, c, &settings, next_id.clone(), cpu_pid)
            .await
            .with_context(|| format!("target {} ({})", t.name, t.shown()))?;
        let mut label = match settings.compress {
            Some(z) => format!("{}+{}", op.name(), z.name()),
            None => op.name().to_string(),
        };
        if settings.discover && settings.scenario == Scenario::Serverless {
            label.push_str(" (monitor first)");
        }
        let row = Row::new(
            &t.name,
            &t.shown(),
            settings.scenario,
            &label,
            c,
            &r,
            settings.compress.is_some(),
        );
        if row.errors > 0 {
            eprintln!(
                "[{}]   {} errors; first: {}",
                t.name,
                row.errors,
                row.first_error.as_deref().unwrap_or("?")
            );
        }
        rows.push((ti, row));
    }
    // Report grouped by target, whatever the execution order.
    rows.sort_by_key(|(ti, _)| *ti);
    let rows: Vec<Row> = rows.into_iter().map(|(_, r)| r).collect();
    if cli.json {
        let meta = serde_json::json!({
            "duration_s": settings.duration.as_secs_f64(),
            "warmup_s": settings.warmup.as_secs_f64(),
            "db": settings.db,
            "coll": settings.coll,
            "docs": settings.docs,
            "docs_1k": settings.docs_1k,
            "compress": settings.compress.map(|c| c.name()),
            "scenario": settings.scenario,
            "auth": settings.auth.as_ref().map(|a| serde_json::json!({
                "user": a.user,
                "db": a.db,
                "speculative": a.speculative,
                "skip_empty_exchange": a.skip_empty_exchange,
            })),
        });
        println!("{}", report::json(&rows, meta)?);
    } else {
        print!("{}", report::human(&rows));
    }
    if let Some(path) = &cli.out {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        writeln!(f, "{}", report::markdown(&rows))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
