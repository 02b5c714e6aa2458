//! Fault injection.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

/// A misbehaviour the stand-in can be told to adopt (see [`crate::StandIn::set_fault`]).
/// It applies to every connection, for messages received after it was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Behave normally.
    #[default]
    None,
    /// Answer the first `N` messages a connection receives (counted since the connection
    /// opened), then close the connection, without replying, when the next message arrives.
    /// `CloseAfter(0)` closes a connection on its first message.
    CloseAfter(u64),
    /// Read and discard requests, never reply (the connection stays open).
    Stall,
    /// Sleep this long before sending every reply.
    Delay(Duration),
    /// Reply to every request with bytes that are not a valid message (a header whose
    /// `messageLength` is negative, followed by junk).
    GarbageReply,
    /// Close every new connection as soon as it is accepted.
    CloseImmediately,
}

const NONE: u8 = 0;
const CLOSE_AFTER: u8 = 1;
const STALL: u8 = 2;
const DELAY: u8 = 3;
const GARBAGE: u8 = 4;
const CLOSE_IMMEDIATELY: u8 = 5;

/// Lock-free holder of the current fault (read on every message).
#[derive(Debug, Default)]
pub(crate) struct FaultCell {
    kind: AtomicU8,
    arg: AtomicU64,
}

impl FaultCell {
    pub(crate) fn set(&self, fault: Fault) {
        let (kind, arg) = match fault {
            Fault::None => (NONE, 0),
            Fault::CloseAfter(n) => (CLOSE_AFTER, n),
            Fault::Stall => (STALL, 0),
            Fault::Delay(d) => (DELAY, u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            Fault::GarbageReply => (GARBAGE, 0),
            Fault::CloseImmediately => (CLOSE_IMMEDIATELY, 0),
        };
        // Argument first, so that a reader seeing the new kind also sees its argument.
        self.arg.store(arg, Ordering::SeqCst);
        self.kind.store(kind, Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> Fault {
        let kind = self.kind.load(Ordering::SeqCst);
        if kind == NONE {
            return Fault::None;
        }
        let arg = self.arg.load(Ordering::SeqCst);
        match kind {
            CLOSE_AFTER => Fault::CloseAfter(arg),
            STALL => Fault::Stall,
            DELAY => Fault::Delay(Duration::from_nanos(arg)),
            GARBAGE => Fault::GarbageReply,
            CLOSE_IMMEDIATELY => Fault::CloseImmediately,
            _ => Fault::None,
        }
    }
}

/// Parses the binary's `--fault` syntax: `none`, `close-after:N`, `stall`, `delay-ms:N`,
/// `garbage`, `close-immediately`.
impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |a: Option<&str>| -> Result<u64, String> {
            a.ok_or_else(|| format!("fault '{name}' needs a number, e.g. {name}:5"))?
                .parse::<u64>()
                .map_err(|e| format!("bad number in fault '{s}': {e}"))
        };
        match name {
            "none" => Ok(Fault::None),
            "close-after" => Ok(Fault::CloseAfter(num(arg)?)),
            "stall" => Ok(Fault::Stall),
            "delay-ms" => Ok(Fault::Delay(Duration::from_millis(num(arg)?))),
            "garbage" => Ok(Fault::GarbageReply),
            "close-immediately" => Ok(Fault::CloseImmediately),
            _ => Err(format!(
                "unknown fault '{s}' (expected none|close-after:N|stall|delay-ms:N|garbage|close-immediately)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_roundtrip_and_parse() {
        let cell = FaultCell::default();
        for f in [
            Fault::None,
            Fault::CloseAfter(3),
            Fault::Stall,
            Fault::Delay(Duration::from_millis(250)),
            Fault::GarbageReply,
            Fault::CloseImmediately,
        ] {
            cell.set(f);
            assert_eq!(cell.get(), f);
        }
        assert_eq!("close-after:7".parse::<Fault>(), Ok(Fault::CloseAfter(7)));
        assert_eq!(
            "delay-ms:10".parse::<Fault>(),
            Ok(Fault::Delay(Duration::from_millis(10)))
        );
        assert_eq!("garbage".parse::<Fault>(), Ok(Fault::GarbageReply));
        assert!("delay-ms".parse::<Fault>().is_err());
        assert!("bogus".parse::<Fault>().is_err());
    }
}
