//! Hand-written JSON output for one-line records: string escaping, an object writer, and a
//! validating compactor for JSON text produced elsewhere (the filter shape).
//!
//! Written by hand rather than with serde_json because a record is a flat, fixed set of
//! fields; the one piece of foreign JSON (the filter shape) must be *checked* before it is
//! embedded, since a broken shape must never break the one-object-per-line format.

use std::fmt::{Display, Write as _};

/// Deepest nesting the compactor accepts; deeper text is refused rather than recursed into.
/// BSON documents cannot nest much past 100 levels, so real shapes stay far below this.
const MAX_DEPTH: usize = 200;

/// Appends `s` to `out` as a JSON string literal, quotes included.
///
/// Escapes `"`, `\`, every control character (U+0000..U+001F and U+007F) and the two
/// JavaScript line separators U+2028 / U+2029, so the result never contains a raw line break.
pub(crate) fn push_str(out: &mut String, s: &str) {
    out.push('"');
    let mut plain_from = 0;
    for (i, c) in s.char_indices() {
        let escape: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            c if c < ' ' || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}' => None,
            _ => continue,
        };
        out.push_str(&s[plain_from..i]);
        match escape {
            Some(e) => out.push_str(e),
            None => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
        }
        plain_from = i + c.len_utf8();
    }
    out.push_str(&s[plain_from..]);
    out.push('"');
}

/// Writes one JSON object field by field; keys are written in call order.
pub(crate) struct ObjectWriter<'a> {
    out: &'a mut String,
    empty: bool,
}

impl<'a> ObjectWriter<'a> {
    /// Opens an object at the end of `out`.
    pub(crate) fn new(out: &'a mut String) -> Self {
        out.push('{');
        ObjectWriter { out, empty: true }
    }

    fn key(&mut self, key: &str) {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        push_str(self.out, key);
        self.out.push(':');
    }

    /// A string field.
    pub(crate) fn str(&mut self, key: &str, value: &str) {
        self.key(key);
        push_str(self.out, value);
    }

    /// A string field, left out when absent.
    pub(crate) fn opt_str(&mut self, key: &str, value: Option<&str>) {
        if let Some(v) = value {
            self.str(key, v);
        }
    }

    /// A number field. `value` must display as a JSON number (integers, finite floats).
    pub(crate) fn num(&mut self, key: &str, value: impl Display) {
        self.key(key);
        let _ = write!(self.out, "{value}");
    }

    /// A field whose value is JSON text from elsewhere: embedded compacted if it is valid
    /// JSON, otherwise replaced by the string `"<invalid>"` (never embedded raw).
    pub(crate) fn json(&mut self, key: &str, text: &str) {
        self.key(key);
        if !compact_into(text, self.out) {
            push_str(self.out, "<invalid>");
        }
    }

    /// Closes the object.
    pub(crate) fn finish(self) {
        self.out.push('}');
    }
}

/// Validates that `text` is exactly one JSON value (RFC 8259) and appends it to `out` without
/// insignificant whitespace, so it fits on one line. Returns false, leaving `out` unchanged,
/// when it is not valid JSON or nests deeper than [`MAX_DEPTH`].
pub(crate) fn compact_into(text: &str, out: &mut String) -> bool {
    let mark = out.len();
    let mut c = Compactor { text, pos: 0, out };
    let ok = c.value(0).is_some() && {
        c.skip_ws();
        c.pos == text.len()
    };
    if !ok {
        out.truncate(mark);
    }
    ok
}

struct Compactor<'t, 'o> {
    text: &'t str,
    pos: usize,
    out: &'o mut String,
}

impl Compactor<'_, '_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// Consumes `b` (after whitespace) and echoes it.
    fn expect(&mut self, b: u8) -> Option<()> {
        self.skip_ws();
        (self.peek()? == b).then(|| {
            self.pos += 1;
            self.out.push(char::from(b));
        })
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        self.skip_ws();
        match self.peek()? {
            b'{' => self.container(depth, b'}', true),
            b'[' => self.container(depth, b']', false),
            b'"' => self.string(),
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'n' => self.literal("null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// An object (`keyed`) or an array, its opening byte at `pos`.
    fn container(&mut self, depth: usize, close: u8, keyed: bool) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        let open = self.peek()?;
        self.pos += 1;
        self.out.push(char::from(open));
        self.skip_ws();
        if self.peek()? == close {
            return self.expect(close);
        }
        loop {
            if keyed {
                self.skip_ws();
                if self.peek()? != b'"' {
                    return None;
                }
                self.string()?;
                self.expect(b':')?;
            }
            self.value(depth + 1)?;
            self.skip_ws();
            match self.peek()? {
                b',' => self.expect(b',')?,
                b if b == close => return self.expect(close),
                _ => return None,
            }
        }
    }

    /// A string literal, its opening quote at `pos`, copied verbatim once checked.
    fn string(&mut self) -> Option<()> {
        let start = self.pos;
        self.pos += 1;
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' => {
                    self.pos += 1;
                    match self.peek()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.pos += 1,
                        b'u' => {
                            let hex = self.text.as_bytes().get(self.pos + 1..self.pos + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.pos += 5;
                        }
                        _ => return None,
                    }
                }
                b if b < 0x20 => return None,
                _ => self.pos += 1,
            }
        }
        self.pos += 1;
        // Both ends are ASCII quotes, so this slice is on char boundaries.
        self.out.push_str(self.text.get(start..self.pos)?);
        Some(())
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        let end = self.pos + word.len();
        (self.text.get(self.pos..end)? == word).then(|| {
            self.pos = end;
            self.out.push_str(word);
        })
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, copied verbatim once checked.
    fn number(&mut self) -> Option<()> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek()? {
            b'0' => self.pos += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.required_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            self.required_digits()?;
        }
        self.out.push_str(self.text.get(start..self.pos)?);
        Some(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
    }

    fn required_digits(&mut self) -> Option<()> {
        let before = self.pos;
        self.digits();
        (self.pos > before).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esc(s: &str) -> String {
        let mut out = String::new();
        push_str(&mut out, s);
        out
    }

    fn compact(s: &str) -> Option<String> {
        let mut out = String::from("x");
        let ok = compact_into(s, &mut out);
        assert_eq!(ok, out.len() > 1, "out must be untouched on failure");
        ok.then(|| out[1..].to_string())
    }

    #[test]
    fn escapes_quotes_backslashes_and_controls() {
        assert_eq!(esc("plain"), r#""plain""#);
        assert_eq!(esc("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(esc("l1\nl2\r\t\u{8}\u{c}"), r#""l1\nl2\r\t\b\f""#);
        assert_eq!(esc("\u{0}\u{1f}\u{7f}"), r#""\u0000\u001f\u007f""#);
        assert_eq!(esc("x\u{2028}y\u{2029}"), r#""x\u2028y\u2029""#);
        assert_eq!(esc("héllo ✓"), "\"héllo ✓\"");
    }

    #[test]
    fn escaped_strings_parse_back() {
        let nasty = "app\"}\n{\"rule\":\"X\u{0}\\";
        let parsed: String = serde_json::from_str(&esc(nasty)).unwrap();
        assert_eq!(parsed, nasty);
    }

    #[test]
    fn compacts_valid_json() {
        assert_eq!(
            compact(
                " {\n \"age\" : { \"$ne\" : \"<int>\" } ,\"a\":[1, -2.5e+3 ,true,null,false]}\n"
            )
            .as_deref(),
            Some(r#"{"age":{"$ne":"<int>"},"a":[1,-2.5e+3,true,null,false]}"#)
        );
        assert_eq!(compact("{}").as_deref(), Some("{}"));
        assert_eq!(compact("[ ]").as_deref(), Some("[]"));
        assert_eq!(
            compact(r#""a\"\u00e9\n""#).as_deref(),
            Some(r#""a\"\u00e9\n""#)
        );
        assert_eq!(compact("0").as_deref(), Some("0"));
    }

    #[test]
    fn refuses_invalid_json() {
        for bad in [
            "",
            "{",
            "{\"a\"}",
            "{\"a\":1,}",
            "[1,]",
            "{a:1}",
            "\"raw\nnewline\"",
            "\"bad \\x escape\"",
            "\"short \\u12\"",
            "01",
            "1.",
            "-",
            "1e",
            "tru",
            "{} {}",
            "{}\n{\"injected\":1}",
            "'single'",
        ] {
            assert_eq!(compact(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn refuses_excessive_depth_without_overflowing() {
        let deep = "[".repeat(100_000);
        assert_eq!(compact(&deep), None);
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(compact(&ok).is_some());
        let too_deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(compact(&too_deep), None);
    }
}
