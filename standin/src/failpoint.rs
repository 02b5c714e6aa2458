//! mongod's test fail points, the two mongoguard's tests need: `failCommand` (fail, delay or
//! close named commands) and `maxTimeAlwaysTimeOut` (every operation with `maxTimeMS` fails
//! with MaxTimeMSExpired). Set with `{configureFailPoint: name, mode, data}` on `admin`, as on
//! a mongod started with `--setParameter enableTestCommands=1`
//! (src/mongo/db/commands/fail_point_cmd.cpp; failCommand's data fields as read by
//! src/mongo/db/commands.cpp `CommandHelpers::evaluateFailCommandFailPoint`:
//! `failCommands`, `errorCode`, `closeConnection`, `blockConnection`, `blockTimeMS`).

use std::time::Duration;

use bson::{Bson, Document};
use parking_lot::Mutex;

use crate::bsonutil::as_i64;
use crate::commands::CmdError;

/// How often a fail point fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    AlwaysOn,
    Times(i64),
}

#[derive(Debug, Clone)]
struct FailCommand {
    mode: Mode,
    commands: Vec<String>,
    error_code: Option<i32>,
    close: bool,
    block: Option<Duration>,
}

/// What a fail point does to one command.
#[derive(Debug, Default)]
pub(crate) struct Effect {
    /// Answer this error instead of running the command.
    pub(crate) error: Option<CmdError>,
    /// Close the connection without answering.
    pub(crate) close: bool,
    /// Hold the reply this long.
    pub(crate) block: Option<Duration>,
}

/// The server's fail points.
#[derive(Debug, Default)]
pub(crate) struct FailPoints {
    fail_command: Mutex<Option<FailCommand>>,
    max_time: Mutex<Option<Mode>>,
}

fn mode(v: Option<&Bson>) -> Result<Mode, CmdError> {
    match v {
        Some(Bson::String(s)) if s == "off" => Ok(Mode::Off),
        Some(Bson::String(s)) if s == "alwaysOn" => Ok(Mode::AlwaysOn),
        Some(Bson::Document(d)) => match d.get("times").and_then(as_i64) {
            Some(n) if n >= 0 => Ok(Mode::Times(n)),
            _ => Err(CmdError::bad_value(
                "mode: {times: n} needs a non-negative n",
            )),
        },
        _ => Err(CmdError::bad_value(
            "mode must be \"off\", \"alwaysOn\" or {times: n}",
        )),
    }
}

/// Consumes one firing of `m`; true when it fires.
fn fire(m: &mut Mode) -> bool {
    match m {
        Mode::Off => false,
        Mode::AlwaysOn => true,
        Mode::Times(n) if *n > 0 => {
            *n -= 1;
            true
        }
        Mode::Times(_) => false,
    }
}

impl FailPoints {
    /// `configureFailPoint`.
    pub(crate) fn configure(&self, cmd: &Document) -> Result<Document, CmdError> {
        let name = match cmd.get("configureFailPoint") {
            Some(Bson::String(s)) => s.as_str(),
            _ => {
                return Err(CmdError::type_mismatch(
                    "configureFailPoint must be a string",
                ))
            }
        };
        let mode = mode(cmd.get("mode"))?;
        let empty = Document::new();
        let data = match cmd.get("data") {
            Some(Bson::Document(d)) => d,
            None => &empty,
            Some(_) => return Err(CmdError::type_mismatch("data must be an object")),
        };
        match name {
            "failCommand" => {
                let commands = match data.get("failCommands") {
                    Some(Bson::Array(a)) => a
                        .iter()
                        .map(|c| match c {
                            Bson::String(s) => Ok(s.clone()),
                            _ => Err(CmdError::type_mismatch("failCommands must be strings")),
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    None if mode == Mode::Off => Vec::new(),
                    _ => return Err(CmdError::bad_value("failCommand needs data.failCommands")),
                };
                let block = match (data.get("blockConnection"), data.get("blockTimeMS")) {
                    (Some(Bson::Boolean(true)), Some(ms)) => match as_i64(ms) {
                        Some(ms) if ms >= 0 => Some(Duration::from_millis(ms.unsigned_abs())),
                        _ => return Err(CmdError::bad_value("blockTimeMS must be non-negative")),
                    },
                    (Some(Bson::Boolean(true)), None) => {
                        return Err(CmdError::bad_value("blockConnection needs blockTimeMS"))
                    }
                    _ => None,
                };
                let error_code = data
                    .get("errorCode")
                    .and_then(as_i64)
                    .and_then(|c| i32::try_from(c).ok());
                let close = matches!(data.get("closeConnection"), Some(Bson::Boolean(true)));
                *self.fail_command.lock() = Some(FailCommand {
                    mode,
                    commands,
                    error_code,
                    close,
                    block,
                });
            }
            "maxTimeAlwaysTimeOut" => *self.max_time.lock() = Some(mode),
            other => {
                return Err(CmdError::bad_value(format!(
                    "unknown fail point: {other} (the stand-in has failCommand and \
                     maxTimeAlwaysTimeOut)"
                )))
            }
        }
        Ok(Document::new())
    }

    /// What the fail points do to command `original` (as sent) with body `cmd`.
    pub(crate) fn check(&self, original: &str, cmd: &Document) -> Effect {
        let mut effect = Effect::default();
        if original == "configureFailPoint" {
            return effect;
        }
        if let Some(fc) = self.fail_command.lock().as_mut() {
            if fc.commands.iter().any(|c| c == original) && fire(&mut fc.mode) {
                effect.close = fc.close;
                effect.block = fc.block;
                effect.error = fc.error_code.map(|code| {
                    CmdError::new(
                        code,
                        code_name(code),
                        format!("Failing command {original} via 'failCommand' failpoint"),
                    )
                });
            }
        }
        if effect.error.is_none() && cmd.contains_key("maxTimeMS") {
            if let Some(m) = self.max_time.lock().as_mut() {
                if fire(m) {
                    effect.error = Some(CmdError::new(
                        50,
                        "MaxTimeMSExpired",
                        "operation exceeded time limit",
                    ));
                }
            }
        }
        effect
    }
}

/// The codeName mongod pairs with the codes tests use (src/mongo/base/error_codes.yml).
fn code_name(code: i32) -> &'static str {
    match code {
        2 => "BadValue",
        50 => "MaxTimeMSExpired",
        91 => "ShutdownInProgress",
        189 => "PrimarySteppedDown",
        10107 => "NotWritablePrimary",
        11600 => "InterruptedAtShutdown",
        11602 => "InterruptedDueToReplStateChange",
        13435 => "NotPrimaryNoSecondaryOk",
        _ => "UnknownError",
    }
}
