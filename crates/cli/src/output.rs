//! How `phoenix` prints: text or JSON (`--output`), on a standard output that a closed
//! pipe cannot make panic.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader has gone (`phoenix scan | head
//! -1`) fails with `BrokenPipe`, and `println!` turns that failure into a panic. Every
//! command writes through [`Stdout`] instead, which takes `BrokenPipe` as "the reader has
//! seen enough": the bytes are dropped and the command ends with the exit code its
//! outcome gives, as if the reader had read everything. Other write errors still fail.
//!
//! With `--output json` standard output carries JSON only: one document per command
//! (`playground` prints one when the cluster is up). Human-readable progress lines of
//! long commands (benchmarks, playground) then go to standard error.
//!
//! Byte strings (keys, values) in JSON: a field `NAME` holds the bytes as a string when
//! they are valid UTF-8, otherwise `NAME_base64` holds them in standard padded base64;
//! with `--hex` the field is always `NAME_hex` (lowercase hex digits).

use std::io::{self, Write};

use base64::Engine as _;
use serde_json::{Map, Value};

/// The `--output` format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Lines for people (tables, `key<TAB>value`, raw values).
    #[default]
    Text,
    /// One JSON document on standard output.
    Json,
}

/// Standard output, locked, with a closed pipe taken as the end of the reader's interest.
pub struct Stdout {
    inner: io::StdoutLock<'static>,
}

impl Stdout {
    /// Locks standard output.
    pub fn lock() -> Stdout {
        Stdout {
            inner: io::stdout().lock(),
        }
    }
}

fn closed_pipe_is_fine(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.inner.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(buf.len()),
            r => r,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        closed_pipe_is_fine(self.inner.flush())
    }
}

/// Writes a line to standard error; a failure to do so has nowhere to be reported.
pub fn note(args: std::fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args);
    let _ = err.write_all(b"\n");
}

/// Writes `v` as one line of JSON to standard output.
pub fn print_json(v: &Value) -> io::Result<()> {
    let mut out = Stdout::lock();
    serde_json::to_writer(&mut out, v).map_err(io::Error::from)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// How byte strings are shown in JSON (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bytes {
    /// UTF-8 text when possible, else base64.
    Text,
    /// Always hex.
    Hex,
}

impl Bytes {
    /// Adds `bytes` to `obj` under `name`, `name_base64` or `name_hex`.
    pub fn put(self, obj: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
        let (field, text) = match (self, std::str::from_utf8(bytes)) {
            (Bytes::Hex, _) => (format!("{name}_hex"), hex(bytes)),
            (Bytes::Text, Ok(s)) => (name.to_string(), s.to_string()),
            (Bytes::Text, Err(_)) => (
                format!("{name}_base64"),
                base64::engine::general_purpose::STANDARD.encode(bytes),
            ),
        };
        obj.insert(field, Value::String(text));
    }
}

/// Lowercase hex digits of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Where a long command's lines go: standard output in text mode, standard error in
/// JSON mode (so standard output stays one JSON document).
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// The chosen format.
    pub format: Format,
}

impl Report {
    /// Prints one human-readable line.
    pub fn line(&self, args: std::fmt::Arguments<'_>) {
        match self.format {
            Format::Text => {
                let mut out = Stdout::lock();
                // Only a closed pipe is swallowed by `Stdout`; any other failure to
                // print progress must not abort a benchmark halfway, so it is dropped.
                let _ = out.write_fmt(args);
                let _ = out.write_all(b"\n");
            }
            Format::Json => note(args),
        }
    }

    /// Prints text as is (several lines) in text mode, to standard error in JSON mode.
    pub fn text(&self, s: &str) {
        self.line(format_args!("{}", s.trim_end_matches('\n')));
    }

    /// Prints the JSON summary (JSON mode only).
    pub fn summary(&self, v: &Value) -> io::Result<()> {
        match self.format {
            Format::Text => Ok(()),
            Format::Json => print_json(v),
        }
    }

    /// Whether the output is JSON.
    pub fn json(&self) -> bool {
        self.format == Format::Json
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_pick_their_field() {
        let mut m = Map::new();
        Bytes::Text.put(&mut m, "key", b"user/1");
        Bytes::Text.put(&mut m, "value", &[0xff, 0x00, 0x41]);
        Bytes::Hex.put(&mut m, "prev", b"A\x01");
        assert_eq!(m.get("key"), Some(&Value::from("user/1")));
        assert_eq!(m.get("value_base64"), Some(&Value::from("/wBB")));
        assert_eq!(m.get("prev_hex"), Some(&Value::from("4101")));
        assert!(m.get("value").is_none());
    }
}
