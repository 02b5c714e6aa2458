//! A deliberately tiny reader for `$where` bodies.
//!
//! A `$where` whose body only ever returns a constant (`"true"`, `"return true;"`,
//! `"function() { return true; }"`, `"() => 1"`) selects every document or none, and a
//! guard must see through it. Real JavaScript stays opaque: anything beyond a constant
//! return is `None`, and the caller treats it as undecidable. The reader works on borrowed
//! slices of the source and never allocates.

/// How many nested `!` / `(` a constant may carry before the reader gives up.
const MAX_NESTING: usize = 32;

/// The truthiness of the value a `$where` body always returns, when the body is one of the
/// trivial constant shapes; `None` for anything else.
pub(crate) fn constant_result(code: &str) -> Option<bool> {
    let mut p = Parser::new(code);
    let result = match p.peek()?.text {
        "function" => p.function_expr()?,
        "(" if p.is_arrow() => p.function_expr()?,
        _ => p.body()?,
    };
    p.semicolons();
    // Anything after the constant (`true || f()`, a second statement) makes it real code.
    match p.next() {
        None => Some(result),
        Some(_) => None,
    }
}

/// One token: an identifier or number run, `=>`, or a single other character.
#[derive(Clone, Copy)]
struct Tok<'a> {
    text: &'a str,
    /// A line break came before this token: `return⏎true` returns `undefined` in
    /// JavaScript (automatic semicolon insertion).
    newline_before: bool,
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        Parser { src, pos: 0 }
    }

    fn peek(&self) -> Option<Tok<'a>> {
        self.lex().map(|(t, _)| t)
    }

    fn next(&mut self) -> Option<Tok<'a>> {
        let (t, end) = self.lex()?;
        self.pos = end;
        Some(t)
    }

    fn eat(&mut self, text: &str) -> Option<()> {
        (self.next()?.text == text).then_some(())
    }

    /// Lexes the token at `pos` without consuming it: the token and where it ends.
    fn lex(&self) -> Option<(Tok<'a>, usize)> {
        let bytes = self.src.as_bytes();
        let mut i = self.pos;
        let mut newline = false;
        loop {
            match bytes.get(i)? {
                b'\n' | b'\r' => {
                    newline = true;
                    i += 1;
                }
                b' ' | b'\t' | 0x0b | 0x0c => i += 1,
                b'/' if bytes.get(i + 1) == Some(&b'/') => {
                    while bytes.get(i).is_some_and(|&b| b != b'\n') {
                        i += 1;
                    }
                }
                b'/' if bytes.get(i + 1) == Some(&b'*') => {
                    let rest = self.src.get(i + 2..)?;
                    let Some(end) = rest.find("*/") else {
                        // Unterminated comment: a token no rule accepts.
                        let tok = Tok {
                            text: "/*",
                            newline_before: newline,
                        };
                        return Some((tok, self.src.len()));
                    };
                    newline |= rest.get(..end).is_some_and(|c| c.contains(['\n', '\r']));
                    i += 2 + end + 2;
                }
                _ => break,
            }
        }
        let is_word = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'.');
        let end = if bytes.get(i).is_some_and(is_word) {
            let run = bytes.get(i..)?.iter().take_while(|b| is_word(b)).count();
            i + run
        } else if self.src.get(i..)?.starts_with("=>") {
            i + 2
        } else {
            i + self.src.get(i..)?.chars().next()?.len_utf8()
        };
        let tok = Tok {
            text: self.src.get(i..end)?,
            newline_before: newline,
        };
        Some((tok, end))
    }

    /// `(` `)` `=>` ahead: an arrow function rather than a parenthesised constant.
    fn is_arrow(&self) -> bool {
        let mut probe = Parser {
            src: self.src,
            pos: self.pos,
        };
        probe.eat("(").is_some() && probe.eat(")").is_some() && probe.eat("=>").is_some()
    }

    fn semicolons(&mut self) {
        while self.peek().is_some_and(|t| t.text == ";") {
            self.pos = self.lex().map_or(self.src.len(), |(_, end)| end);
        }
    }

    /// `function [name]() { return C; }` or `() => C` or `() => { return C; }`.
    fn function_expr(&mut self) -> Option<bool> {
        let arrow = self.peek()?.text == "(";
        if !arrow {
            self.eat("function")?;
            if self.peek()?.text != "(" {
                self.next()?; // the function's name
            }
        }
        self.eat("(")?;
        self.eat(")")?;
        if arrow {
            self.eat("=>")?;
            if self.peek()?.text != "{" {
                return self.value(0);
            }
        }
        self.eat("{")?;
        self.semicolons();
        // A function body must `return`: one that falls off its end returns undefined.
        self.eat("return")?;
        let result = self.returned()?;
        self.semicolons();
        self.eat("}")?;
        Some(result)
    }

    /// The top level of a non-function body: `C` or `return C`, with optional semicolons.
    fn body(&mut self) -> Option<bool> {
        self.semicolons();
        if self.peek()?.text == "return" {
            self.next()?;
            return self.returned();
        }
        self.value(0)
    }

    /// The value after `return`, refusing a line break right after the keyword.
    fn returned(&mut self) -> Option<bool> {
        if self.peek()?.newline_before {
            return None;
        }
        self.value(0)
    }

    /// A constant: `true`, `false`, `null`, `undefined`, `NaN`, a decimal number, `!C`,
    /// `(C)`.
    fn value(&mut self, depth: usize) -> Option<bool> {
        if depth > MAX_NESTING {
            return None;
        }
        let tok = self.next()?;
        match tok.text {
            "true" => Some(true),
            "false" | "null" | "undefined" | "NaN" => Some(false),
            "!" => self.value(depth + 1).map(|b| !b),
            "(" => {
                let v = self.value(depth + 1)?;
                self.eat(")")?;
                Some(v)
            }
            t if t.starts_with(|c: char| c.is_ascii_digit() || c == '.') => {
                t.parse::<f64>().ok().map(|f| f != 0.0)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::constant_result;

    #[test]
    fn constant_true_bodies() {
        for code in [
            "true",
            " true ",
            "return true",
            "return true;",
            "return true;;",
            ";return true",
            "function() { return true; }",
            "function () {return true}",
            "function f() { return true; };",
            "function() {\n  return true;\n}",
            "() => true",
            "() => { return true; }",
            "return (true)",
            "return !false",
            "return !!1",
            "return 1",
            "return 1.5",
            "/* always */ return true; // done",
        ] {
            assert_eq!(constant_result(code), Some(true), "{code:?}");
        }
    }

    #[test]
    fn constant_false_bodies() {
        for code in [
            "false",
            "return false",
            "return 0",
            "return null",
            "function() { return 0; }",
        ] {
            assert_eq!(constant_result(code), Some(false), "{code:?}");
        }
    }

    #[test]
    fn real_code_is_opaque() {
        for code in [
            "",
            ";",
            "this.a == 1",
            "return this.a",
            "return true || this.a",
            "return true; return false",
            "var x = 1; return true",
            "return\ntrue",
            "return /* \n */ true",
            "function() { true }",
            "function() { return true; } extra",
            "function(doc) { return true; }",
            "return infinity",
            "return 0x1",
            "return truex",
            "(((((((((((((((((((((((((((((((((((true)))))))))))))))))))))))))))))))))))",
            "/* unterminated",
            "return trüe",
        ] {
            assert_eq!(constant_result(code), None, "{code:?}");
        }
    }
}
