//! Client-chosen strings (key names, command names, application names) end up in log lines
//! and error messages; they are clipped there so a hostile client cannot make either huge.

use std::borrow::Cow;

/// The longest piece of one client-chosen string kept in a log line or an error message.
pub const CLIENT_TEXT_MAX: usize = 256;

/// `s`, cut to at most `max` bytes on a character boundary, with `…(N bytes)` appended when
/// cut.
pub fn clip(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let head = s.get(..end).unwrap_or_default();
    Cow::Owned(format!("{head}…({} bytes)", s.len()))
}

/// [`clip`] at [`CLIENT_TEXT_MAX`], owned: for error variants that carry client text.
pub fn client(s: &str) -> String {
    clip(s, CLIENT_TEXT_MAX).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_long_strings_on_char_boundaries() {
        assert_eq!(clip("abc", 3), "abc");
        let long = "é".repeat(200); // 400 bytes
        let c = clip(&long, 255);
        assert!(c.len() < 300, "{}", c.len());
        assert!(c.ends_with("…(400 bytes)"));
        assert!(client(&"k".repeat(100_000)).len() < CLIENT_TEXT_MAX + 32);
    }
}
