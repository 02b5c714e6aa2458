//! Result rows and their renderings: aligned text, markdown, JSON.

use serde::Serialize;

use crate::workload::{RunResult, Scenario};

/// The target that "added latency" is measured against.
pub const BASELINE: &str = "direct";

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub target: String,
    pub addr: String,
    pub op: String,
    pub concurrency: usize,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    pub scenario: String,
    /// Successful operations including warmup ones.
    pub ops_total: u64,
    /// Client-side SCRAM computation per operation (serverless with auth): p50 and mean, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_scram_p50_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_scram_mean_us: Option<f64>,
    /// SCRAM iteration count the server asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scram_iterations: Option<u32>,
    /// Share of operations authenticated speculatively (inside hello).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative_share: Option<f64>,
    /// CPU time (user + system) of the target's process per measured request, µs
    /// (`--cpu-pid`): what the process behind the port spent per request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_us_per_req: Option<f64>,
    /// Round trips per measured request (1, except a drain: its find and every getMore).
    pub round_trips_per_req: f64,
    /// Share of the run's replies that came as OP_COMPRESSED (runs with `--compress`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compressed_reply_share: Option<f64>,
}

impl Row {
    pub fn new(
        target: &str,
        addr: &str,
        scenario: Scenario,
        op: &str,
        concurrency: usize,
        r: &RunResult,
        compressed: bool,
    ) -> Row {
        let h = &r.hist;
        let ops = h.len();
        let secs = r.measured.as_secs_f64();
        let scram = r.client_scram.as_ref().filter(|h| !h.is_empty());
        Row {
            round_trips_per_req: if ops > 0 {
                r.round_trips as f64 / ops as f64
            } else {
                0.0
            },
            compressed_reply_share: (compressed && r.replies > 0)
                .then(|| r.compressed_replies as f64 / r.replies as f64),
            scenario: scenario.name().to_string(),
            ops_total: r.completed,
            client_scram_p50_us: scram.map(|h| h.value_at_quantile(0.5)),
            client_scram_mean_us: scram.map(|h| h.mean()),
            scram_iterations: scram.map(|_| r.scram_iterations),
            speculative_share: scram.map(|h| r.speculative as f64 / h.len() as f64),
            target: target.to_string(),
            addr: addr.to_string(),
            op: match scenario {
                Scenario::Steady => op.to_string(),
                Scenario::Serverless => format!("serverless {op}"),
            },
            concurrency,
            ops,
            ops_per_sec: if secs > 0.0 { ops as f64 / secs } else { 0.0 },
            p50_us: if ops > 0 {
                h.value_at_quantile(0.50)
            } else {
                0
            },
            p99_us: if ops > 0 {
                h.value_at_quantile(0.99)
            } else {
                0
            },
            p999_us: if ops > 0 {
                h.value_at_quantile(0.999)
            } else {
                0
            },
            max_us: if ops > 0 { h.max() } else { 0 },
            errors: r.errors,
            first_error: r.first_error.clone(),
            cpu_us_per_req: r
                .cpu
                .filter(|_| ops > 0)
                .map(|c| c.as_secs_f64() * 1e6 / ops as f64),
        }
    }
}

/// The L4 relay CPU per request is compared against.
pub const RELAY: &str = "haproxy";

/// CPU per request of each target against the relay's, for the same (op, concurrency).
#[derive(Clone, Debug, Serialize)]
pub struct CpuVsRelay {
    pub target: String,
    pub op: String,
    pub concurrency: usize,
    pub cpu_us_per_req: f64,
    pub relay_cpu_us_per_req: f64,
    /// `cpu_us_per_req / relay_cpu_us_per_req` (at most 1.0 is the target).
    pub cpu_ratio: f64,
    /// ops/s of the target over the relay's.
    pub ops_ratio: f64,
}

pub fn cpu_vs_relay(rows: &[Row]) -> Vec<CpuVsRelay> {
    let mut out = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.target != RELAY && r.target != BASELINE)
    {
        let relay = rows
            .iter()
            .find(|b| b.target == RELAY && b.op == r.op && b.concurrency == r.concurrency);
        let (Some(b), Some(mine)) = (relay, r.cpu_us_per_req) else {
            continue;
        };
        let Some(theirs) = b.cpu_us_per_req.filter(|v| *v > 0.0) else {
            continue;
        };
        out.push(CpuVsRelay {
            target: r.target.clone(),
            op: r.op.clone(),
            concurrency: r.concurrency,
            cpu_us_per_req: mine,
            relay_cpu_us_per_req: theirs,
            cpu_ratio: mine / theirs,
            ops_ratio: if b.ops_per_sec > 0.0 {
                r.ops_per_sec / b.ops_per_sec
            } else {
                0.0
            },
        });
    }
    out
}

const CPU_HEADERS: [&str; 7] = [
    "target",
    "op",
    "conc",
    "CPU µs/req",
    "haproxy CPU µs/req",
    "CPU vs haproxy",
    "ops/s vs haproxy",
];

fn cpu_cells(c: &CpuVsRelay) -> Vec<String> {
    vec![
        c.target.clone(),
        c.op.clone(),
        c.concurrency.to_string(),
        format!("{:.1}", c.cpu_us_per_req),
        format!("{:.1}", c.relay_cpu_us_per_req),
        format!("{:.2}x", c.cpu_ratio),
        format!("{:.2}x", c.ops_ratio),
    ]
}

fn has_cpu(rows: &[Row]) -> bool {
    rows.iter().any(|r| r.cpu_us_per_req.is_some())
}

/// Some request took several round trips (a drain).
fn has_multi_trip(rows: &[Row]) -> bool {
    rows.iter().any(|r| r.round_trips_per_req > 1.0)
}

fn has_compressed(rows: &[Row]) -> bool {
    rows.iter().any(|r| r.compressed_reply_share.is_some())
}

/// What a "request" is when one took several round trips.
fn multi_trip_note(rows: &[Row]) -> Option<String> {
    has_multi_trip(rows).then(|| {
        "round trips/req > 1: one request is a whole drain (find, then getMore until the \
         cursor id is 0); its ops/s, latencies and CPU µs/req are per drain, not per round \
         trip."
            .to_string()
    })
}

/// p50 / p99 of a target minus those of `direct` for the same (op, concurrency).
#[derive(Clone, Debug, Serialize)]
pub struct Added {
    pub target: String,
    pub op: String,
    pub concurrency: usize,
    pub p50_us: i64,
    pub p99_us: i64,
    pub ops_per_sec_ratio: f64,
}

pub fn added_latency(rows: &[Row]) -> Vec<Added> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.target != BASELINE) {
        let base = rows
            .iter()
            .find(|b| b.target == BASELINE && b.op == r.op && b.concurrency == r.concurrency);
        if let Some(b) = base.filter(|b| b.ops > 0 && r.ops > 0) {
            out.push(Added {
                target: r.target.clone(),
                op: r.op.clone(),
                concurrency: r.concurrency,
                p50_us: signed(r.p50_us) - signed(b.p50_us),
                p99_us: signed(r.p99_us) - signed(b.p99_us),
                ops_per_sec_ratio: if b.ops_per_sec > 0.0 {
                    r.ops_per_sec / b.ops_per_sec
                } else {
                    0.0
                },
            });
        }
    }
    out
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

const HEADERS: [&str; 9] = [
    "target", "op", "conc", "ops/s", "p50 µs", "p99 µs", "p999 µs", "max µs", "errors",
];
const ADDED_HEADERS: [&str; 6] = [
    "target",
    "op",
    "conc",
    "+p50 µs",
    "+p99 µs",
    "ops/s vs direct",
];

/// Extra columns when some run authenticated per operation (serverless with auth).
const SCRAM_HEADERS: [&str; 3] = ["client SCRAM p50 µs", "SCRAM iter", "speculative"];

const SCRAM_NOTE: &str = "client SCRAM = time loadgen itself spent per operation in SCRAM \
computation (PBKDF2 at the server's iteration count, and HMACs; mongoguard's ClientConversation \
has no salted-password cache, unlike drivers). It is inside the latency above and is client \
CPU, not server time.";

fn has_scram(rows: &[Row]) -> bool {
    rows.iter().any(|r| r.client_scram_p50_us.is_some())
}

fn headers(rows: &[Row]) -> Vec<&'static str> {
    let mut h = HEADERS.to_vec();
    if has_cpu(rows) {
        h.push("CPU µs/req");
    }
    if has_multi_trip(rows) {
        h.push("round trips/req");
    }
    if has_compressed(rows) {
        h.push("compressed replies");
    }
    if has_scram(rows) {
        h.extend(SCRAM_HEADERS);
    }
    h
}

fn row_cells(rows: &[Row]) -> Vec<Vec<String>> {
    let scram = has_scram(rows);
    let cpu = has_cpu(rows);
    let trips = has_multi_trip(rows);
    let compressed = has_compressed(rows);
    rows.iter()
        .map(|r| {
            let mut c = cells(r);
            if cpu {
                c.push(
                    r.cpu_us_per_req
                        .map_or_else(|| "-".into(), |v| format!("{v:.1}")),
                );
            }
            if trips {
                c.push(format!("{:.1}", r.round_trips_per_req));
            }
            if compressed {
                c.push(
                    r.compressed_reply_share
                        .map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0)),
                );
            }
            if scram {
                let na = || "-".to_string();
                c.push(r.client_scram_p50_us.map_or_else(na, |v| v.to_string()));
                c.push(r.scram_iterations.map_or_else(na, |v| v.to_string()));
                c.push(
                    r.speculative_share
                        .map_or_else(na, |v| format!("{:.0}%", v * 100.0)),
                );
            }
            c
        })
        .collect()
}

fn cells(r: &Row) -> Vec<String> {
    vec![
        r.target.clone(),
        r.op.clone(),
        r.concurrency.to_string(),
        format!("{:.0}", r.ops_per_sec),
        r.p50_us.to_string(),
        r.p99_us.to_string(),
        r.p999_us.to_string(),
        r.max_us.to_string(),
        r.errors.to_string(),
    ]
}

fn added_cells(a: &Added) -> Vec<String> {
    vec![
        a.target.clone(),
        a.op.clone(),
        a.concurrency.to_string(),
        format!("{:+}", a.p50_us),
        format!("{:+}", a.p99_us),
        format!("{:.2}x", a.ops_per_sec_ratio),
    ]
}

/// Aligned plain-text table: first three columns left-aligned, numbers right-aligned.
fn text_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                let pad = " ".repeat(w - c.chars().count());
                if i < 2 {
                    format!("{c}{pad}")
                } else {
                    format!("{pad}{c}")
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    out.push_str(&"-".repeat(total));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.clone()));
        out.push('\n');
    }
    out
}

fn md_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", headers.join(" | "));
    let aligns: Vec<&str> = (0..headers.len())
        .map(|i| if i < 2 { "---" } else { "---:" })
        .collect();
    out.push_str(&format!("| {} |\n", aligns.join(" | ")));
    for r in rows {
        out.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    out
}

pub fn human(rows: &[Row]) -> String {
    let body = row_cells(rows);
    let mut out = text_table(&headers(rows), &body);
    if has_scram(rows) {
        out.push_str(&format!("{SCRAM_NOTE}\n"));
    }
    if let Some(note) = multi_trip_note(rows) {
        out.push_str(&format!("{note}\n"));
    }
    let added = added_latency(rows);
    if !added.is_empty() {
        out.push_str(&format!("\nadded latency vs `{BASELINE}`:\n"));
        let body: Vec<Vec<String>> = added.iter().map(added_cells).collect();
        out.push_str(&text_table(&ADDED_HEADERS, &body));
    }
    let cpu = cpu_vs_relay(rows);
    if !cpu.is_empty() {
        out.push_str(&format!(
            "\nCPU per request{} vs `{RELAY}`:\n",
            if has_multi_trip(rows) {
                " (drain: per whole drain)"
            } else {
                ""
            }
        ));
        let body: Vec<Vec<String>> = cpu.iter().map(cpu_cells).collect();
        out.push_str(&text_table(&CPU_HEADERS, &body));
    }
    let errs: Vec<&Row> = rows.iter().filter(|r| r.first_error.is_some()).collect();
    if !errs.is_empty() {
        out.push_str("\nfirst error per run:\n");
        for r in errs {
            let e = r.first_error.as_deref().unwrap_or_default();
            out.push_str(&format!(
                "  {} {} c={}: {e}\n",
                r.target, r.op, r.concurrency
            ));
        }
    }
    out
}

pub fn markdown(rows: &[Row]) -> String {
    let body = row_cells(rows);
    let mut out = md_table(&headers(rows), &body);
    if has_scram(rows) {
        out.push_str(&format!("\n{SCRAM_NOTE}\n"));
    }
    if let Some(note) = multi_trip_note(rows) {
        out.push_str(&format!("\n{note}\n"));
    }
    let added = added_latency(rows);
    if !added.is_empty() {
        out.push_str(&format!("\nAdded latency vs `{BASELINE}`:\n\n"));
        let body: Vec<Vec<String>> = added.iter().map(added_cells).collect();
        out.push_str(&md_table(&ADDED_HEADERS, &body));
    }
    let cpu = cpu_vs_relay(rows);
    if !cpu.is_empty() {
        out.push_str(&format!(
            "\nCPU time of each process per request (utime + stime from /proc/PID/stat over \
             the measured window, divided by its requests{}) vs `{RELAY}`:\n\n",
            if has_multi_trip(rows) {
                "; drain: per whole drain"
            } else {
                ""
            }
        ));
        let body: Vec<Vec<String>> = cpu.iter().map(cpu_cells).collect();
        out.push_str(&md_table(&CPU_HEADERS, &body));
    }
    out
}

pub fn json(rows: &[Row], settings: serde_json::Value) -> anyhow::Result<String> {
    #[derive(Serialize)]
    struct Output<'a> {
        settings: serde_json::Value,
        results: &'a [Row],
        added_latency: Vec<Added>,
        cpu_vs_relay: Vec<CpuVsRelay>,
    }
    let out = Output {
        settings,
        results: rows,
        added_latency: added_latency(rows),
        cpu_vs_relay: cpu_vs_relay(rows),
    };
    Ok(serde_json::to_string_pretty(&out)?)
}
