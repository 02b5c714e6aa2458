//! The logic of the cargo-fuzz targets in `fuzz/`, kept inside the crate.
//!
//! Each submodule has a `run(data: &[u8])` that feeds one input to a part of mongoguard and
//! asserts what success promises there; the fuzz targets (`fuzz/fuzz_targets/*.rs`) are
//! three-line shims around it. Living here, the logic can reach crate-private functions
//! (the hello rewrite, the reply facts, the request inspection) without widening the public
//! API, and the same checks run over every seed and regression input in `cargo test --lib
//! fuzz_logic` (see the tests at the end of this file), so a fixed finding stays fixed in CI.
//!
//! A failed assertion is a finding. Nothing here is used by the proxy.

pub mod command_policy;
pub mod config_parse;
pub mod hello_rewrite;
pub mod policy_parse;
pub mod reply_facts;
pub mod scram_server;
#[cfg(test)]
mod seeds;

/// A target's entry point.
pub type Run = fn(&[u8]);

/// Every target: its name (the directory under `fuzz/seeds/` and `fuzz/regressions/`) and its
/// entry point.
pub const TARGETS: [(&str, Run); 6] = [
    ("command_policy", command_policy::run),
    ("hello_rewrite", hello_rewrite::run),
    ("reply_facts", reply_facts::run),
    ("scram_server", scram_server::run),
    ("policy_parse", policy_parse::run),
    ("config_parse", config_parse::run),
];

/// The input as a whole message: bytes 0..4 are overwritten with the input's length (when
/// it has a header), so that the fuzzer does not spend its time guessing lengths the codec
/// already checks (the `decode` target covers that). An OP_MSG that sets checksumPresent
/// gets a correct CRC-32C trailer for the same reason.
pub fn framed(data: &[u8]) -> Option<bytes::Bytes> {
    let mut message = data.to_vec();
    let length = i32::try_from(message.len()).ok()?;
    let head = message.get_mut(..4)?;
    head.copy_from_slice(&length.to_le_bytes());
    let op_code = le4(&message, 12).map(i32::from_le_bytes);
    let flags = le4(&message, 16).map(u32::from_le_bytes);
    if op_code == Some(crate::wire::OpCode::Msg as i32)
        && flags.is_some_and(|f| f & crate::wire::MsgFlags::CHECKSUM_PRESENT != 0)
        && message.len() >= 24
    {
        let covered = message.len() - 4;
        let crc = crc32c::crc32c(message.get(..covered).unwrap_or_default());
        if let Some(tail) = message.get_mut(covered..) {
            tail.copy_from_slice(&crc.to_le_bytes());
        }
    }
    Some(bytes::Bytes::from(message))
}

/// The four bytes at `at`, if there are four.
pub fn le4(data: &[u8], at: usize) -> Option<[u8; 4]> {
    data.get(at..at.checked_add(4)?)?.try_into().ok()
}

/// Text for the TOML targets: the input as UTF-8, invalid sequences replaced.
pub fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::TARGETS;

    fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz")
            .join(kind)
            .join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        files
    }

    /// The CI smoke of the fuzz targets: every seed and every regression input through the
    /// same logic the fuzzer runs. Every target must have seeds.
    #[test]
    fn every_seed_and_regression_input_passes() {
        for (target, run) in TARGETS {
            let seeds = inputs("seeds", target);
            assert!(
                seeds.len() >= 3,
                "fuzz/seeds/{target} has {} inputs",
                seeds.len()
            );
            let fixed = inputs("regressions", target)
                .into_iter()
                .filter(|p| !is_open(p));
            for path in seeds.into_iter().chain(fixed) {
                let data = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(outcome.is_ok(), "{target}: {} fails", path.display());
            }
        }
    }

    /// A regression input named `open-*` is a finding not fixed yet (see fuzz/README.md):
    /// `cargo test --lib fuzz_logic -- --ignored` shows which still fail.
    fn is_open(path: &Path) -> bool {
        path.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("open-"))
    }

    #[test]
    #[ignore = "open findings, not fixed yet: see fuzz/README.md"]
    fn open_findings_pass() {
        let mut failing = Vec::new();
        for (target, run) in TARGETS {
            for path in inputs("regressions", target)
                .into_iter()
                .filter(|p| is_open(p))
            {
                let data = std::fs::read(&path).unwrap();
                if std::panic::catch_unwind(|| run(&data)).is_err() {
                    failing.push(path.display().to_string());
                }
            }
        }
        assert!(failing.is_empty(), "still failing: {failing:?}");
    }

    #[test]
    fn framing_sets_the_length_and_the_checksum() {
        let m = super::framed(&[0; 16]).unwrap();
        assert_eq!(&m[..4], &16i32.to_le_bytes());
        assert!(super::framed(&[1, 2, 3]).is_none());
        let mut msg = vec![0u8; 16];
        msg[12..16].copy_from_slice(&2013i32.to_le_bytes());
        msg.extend_from_slice(&1u32.to_le_bytes());
        msg.extend_from_slice(&[0; 9]);
        let m = super::framed(&msg).unwrap();
        let crc = crc32c::crc32c(&m[..m.len() - 4]);
        assert_eq!(&m[m.len() - 4..], &crc.to_le_bytes());
    }
}
