//! The Redis serialization protocol (RESP2 and RESP3) on the wire: requests in, replies
//! out.
//!
//! A request is an array of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`), or an
//! inline command (`GET k\r\n`, as typed into telnet). [`parse_request`] takes a buffer
//! that may hold less than one request (it asks for more), one, or several (pipelining:
//! it returns the first and how many bytes it used). A request breaking the protocol or
//! the limits is an error after which the connection is closed, as Redis does: nothing
//! after it can be framed.
//!
//! [`Reply`] encodes itself for the protocol version the connection chose with HELLO:
//! RESP3 has a null, maps, doubles and verbatim-free simple types; in RESP2 a null is
//! the null bulk string (or null array) and a map is a flat array.

use std::fmt;

/// Sizes a request may not exceed.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most arguments in one request.
    pub max_args: usize,
    /// Longest argument, in bytes.
    pub max_bulk: usize,
    /// Longest inline command line, in bytes.
    pub max_inline: usize,
    /// Largest request, in bytes (all its arguments and their framing): a request the
    /// cluster could not take in one message is refused before it is buffered whole.
    pub max_request: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            // MSET of the most keys one batch takes, with its name.
            max_args: 2 * phoenix_proto::limits::BATCH_KEYS_MAX + 1,
            // A value at the cluster's limit, with room for the key and framing of
            // MSET's pairs being separate arguments.
            max_bulk: phoenix_proto::limits::VALUE_BYTES_MAX + 1024,
            // Redis's PROTO_INLINE_MAX_SIZE.
            max_inline: 64 * 1024,
            max_request: phoenix_proto::limits::MESSAGE_BYTES_MAX,
        }
    }
}

/// A request that breaks the protocol; the connection is closed after its error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// A request's arguments and the bytes it took, None if the buffer holds less than one.
pub type Parsed = Result<Option<(Vec<Vec<u8>>, usize)>, ProtocolError>;

fn err<T>(why: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(why.into()))
}

/// The position of the `\r\n` ending the line that starts at `from`, if it is in `buf`.
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

/// A decimal integer as RESP writes lengths: optional `-`, digits, nothing else.
fn parse_int(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = digits
        .iter()
        .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
    Some(if neg { -v } else { v })
}

/// The first request in `buf`: its arguments and the bytes it took, or None if `buf`
/// does not hold a whole one yet. An empty request (a blank inline line, `*0`) is
/// returned with no arguments; the caller skips it.
pub fn parse_request(buf: &[u8], limits: &Limits) -> Parsed {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => parse_multibulk(buf, limits),
        Some(_) => parse_inline(buf, limits),
    }
}

fn parse_multibulk(buf: &[u8], limits: &Limits) -> Parsed {
    let Some(end) = line_end(buf, 1) else {
        if buf.len() > limits.max_inline {
            return err("too big mbulk count string");
        }
        return Ok(None);
    };
    let count = match parse_int(&buf[1..end]) {
        Some(n) if n <= limits.max_args as i64 => n,
        _ => return err("invalid multibulk length"),
    };
    let mut pos = end + 2;
    if count <= 0 {
        return Ok(Some((Vec::new(), pos)));
    }
    // First the framing alone (nothing copied, so a request arriving in many reads costs
    // a walk over its headers per read, not a copy of its arguments), then the copies.
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity((count as usize).min(1024));
    for _ in 0..count {
        if pos > limits.max_request {
            return err("request too big");
        }
        match buf.get(pos) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&c) => return err(format!("expected '$', got '{}'", c as char)),
        }
        let Some(end) = line_end(buf, pos + 1) else {
            if buf.len() - pos > 32 {
                return err("invalid bulk length");
            }
            return Ok(None);
        };
        let len = match parse_int(&buf[pos + 1..end]) {
            Some(n) if n >= 0 && n as usize <= limits.max_bulk => n as usize,
            _ => return err("invalid bulk length"),
        };
        let start = end + 2;
        if start + len > limits.max_request {
            return err("request too big");
        }
        match buf.get(start + len..start + len + 2) {
            None => return Ok(None),
            Some(b"\r\n") => {}
            Some(_) => return err("bulk string not terminated by CRLF"),
        }
        spans.push((start, len));
        pos = start + len + 2;
    }
    let args = spans
        .into_iter()
        .map(|(start, len)| buf[start..start + len].to_vec())
        .collect();
    Ok(Some((args, pos)))
}

fn parse_inline(buf: &[u8], limits: &Limits) -> Parsed {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > limits.max_inline {
            return err("too big inline request");
        }
        return Ok(None);
    };
    if nl > limits.max_inline {
        return err("too big inline request");
    }
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    Ok(Some((split_inline(line)?, nl + 1)))
}

/// Splits an inline command line into arguments as Redis's `sdssplitargs` does:
/// whitespace between them, double quotes with `\n`, `\xHH`-style escapes, or single
/// quotes taken literally (but for `\'`).
fn split_inline(line: &[u8]) -> Result<Vec<Vec<u8>>, ProtocolError> {
    let mut args = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= line.len() {
            break;
        }
        let (arg, end) = match line[i] {
            q @ (b'"' | b'\'') => quoted(line, i + 1, q)?,
            _ => {
                let end = line[i..]
                    .iter()
                    .position(u8::is_ascii_whitespace)
                    .map_or(line.len(), |n| i + n);
                (line[i..end].to_vec(), end)
            }
        };
        args.push(arg);
        i = end;
    }
    Ok(args)
}

/// The argument quoted by `quote` whose text starts at `line[i]`, and where it ends (past
/// the closing quote), as redis-cli splits it: in double quotes `\n`, `\r`, `\t`, `\b`,
/// `\a`, `\xHH` and `\<any>` are escapes; in single quotes only `\'`. The closing quote
/// must end the argument.
fn quoted(line: &[u8], mut i: usize, quote: u8) -> Result<(Vec<u8>, usize), ProtocolError> {
    let unbalanced = || ProtocolError("unbalanced quotes in request".into());
    let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16));
    let mut arg = Vec::new();
    loop {
        let &c = line.get(i).ok_or_else(unbalanced)?;
        i += 1;
        if c == quote {
            break;
        }
        if c != b'\\' {
            arg.push(c);
            continue;
        }
        if quote == b'\'' {
            if line.get(i) == Some(&b'\'') {
                arg.push(b'\'');
                i += 1;
            } else {
                arg.push(c);
            }
            continue;
        }
        let &e = line.get(i).ok_or_else(unbalanced)?;
        i += 1;
        arg.push(match e {
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'b' => 8,
            b'a' => 7,
            b'x' => match (hex(line.get(i)), hex(line.get(i + 1))) {
                (Some(h), Some(l)) => {
                    i += 2;
                    (h * 16 + l) as u8
                }
                _ => b'x',
            },
            other => other,
        });
    }
    if line.get(i).is_some_and(|c| !c.is_ascii_whitespace()) {
        return Err(unbalanced());
    }
    Ok((arg, i))
}

/// A reply, encoded for the connection's protocol version by [`Reply::encode`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR …`: the text includes its code (`ERR`, `WRONGTYPE`, `CROSSSLOT`, …).
    Error(String),
    /// `:42`.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// Nothing (a missing key): RESP2's null bulk string, RESP3's null.
    Null,
    /// Nothing where an array was expected: RESP2's null array, RESP3's null.
    NullArray,
    /// An array.
    Array(Vec<Reply>),
    /// A map (RESP3); a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// Nothing at all on the wire (a connection closed without an answer).
    Silent,
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// An error reply; `msg` starts with its code.
    pub fn error(msg: impl Into<String>) -> Reply {
        Reply::Error(msg.into())
    }

    /// A bulk string from text.
    pub fn text(s: impl AsRef<str>) -> Reply {
        Reply::Bulk(s.as_ref().as_bytes().to_vec())
    }

    /// Appends the reply to `out` in protocol `version` (2 or 3).
    pub fn encode(&self, version: u8, out: &mut Vec<u8>) {
        match self {
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::Error(s) => line(out, b'-', s.as_bytes()),
            Reply::Int(n) => line(out, b':', n.to_string().as_bytes()),
            Reply::Bulk(b) => {
                line(out, b'$', b.len().to_string().as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Null if version >= 3 => out.extend_from_slice(b"_\r\n"),
            Reply::Null => out.extend_from_slice(b"$-1\r\n"),
            Reply::NullArray if version >= 3 => out.extend_from_slice(b"_\r\n"),
            Reply::NullArray => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                line(out, b'*', items.len().to_string().as_bytes());
                for r in items {
                    r.encode(version, out);
                }
            }
            Reply::Silent => {}
            Reply::Map(pairs) => {
                if version >= 3 {
                    line(out, b'%', pairs.len().to_string().as_bytes());
                } else {
                    line(out, b'*', (pairs.len() * 2).to_string().as_bytes());
                }
                for (k, v) in pairs {
                    k.encode(version, out);
                    v.encode(version, out);
                }
            }
        }
    }
}

/// `<kind><text>\r\n`; CR and LF inside a simple string or error are replaced by spaces
/// (they would end the line early).
fn line(out: &mut Vec<u8>, kind: u8, text: &[u8]) {
    out.push(kind);
    out.extend(
        text.iter()
            .map(|&c| if c == b'\r' || c == b'\n' { b' ' } else { c }),
    );
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(buf: &[u8]) -> Parsed {
        parse_request(buf, &Limits::default())
    }

    fn args(v: &[&[u8]]) -> Vec<Vec<u8>> {
        v.iter().map(|a| a.to_vec()).collect()
    }

    #[test]
    fn a_multibulk_request_is_parsed_whole_or_waited_for() {
        let req = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\na\r\nb\0\r\n";
        let (a, used) = parse(req).unwrap().unwrap();
        assert_eq!(a, args(&[b"SET", b"k", b"a\r\nb\0"]));
        assert_eq!(used, req.len());
        // Every shorter prefix asks for more.
        for n in 0..req.len() {
            assert_eq!(parse(&req[..n]).unwrap(), None, "prefix of {n} bytes");
        }
        // Pipelined: the first, then the rest.
        let two = [&req[..], b"*1\r\n$4\r\nPING\r\n"].concat();
        let (a, used) = parse(&two).unwrap().unwrap();
        assert_eq!((a.len(), used), (3, req.len()));
        let (a, _) = parse(&two[used..]).unwrap().unwrap();
        assert_eq!(a, args(&[b"PING"]));
        // Empty requests.
        assert_eq!(parse(b"*0\r\n").unwrap(), Some((vec![], 4)));
        assert_eq!(parse(b"*-1\r\n").unwrap(), Some((vec![], 5)));
    }

    #[test]
    fn requests_that_break_the_protocol_or_the_limits_are_errors() {
        for bad in [
            &b"*x\r\n"[..],
            b"*1\r\n:5\r\n",
            b"*1\r\n$-2\r\n",
            b"*1\r\n$abc\r\n",
            b"*1\r\n$1\r\nab\r\n",
            b"*99999999999\r\n",
            b"*1\r\n$2000000\r\n",
            b"\"unbalanced\r\n",
            b"'x'y\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        // Over a smaller limit.
        let small = Limits {
            max_args: 2,
            max_bulk: 4,
            max_inline: 8,
            max_request: 20,
        };
        assert!(parse_request(b"*3\r\n", &small).is_err());
        assert!(parse_request(b"*1\r\n$5\r\n", &small).is_err());
        assert!(parse_request(b"GET aaaaaaaaa", &small).is_err());
        assert!(parse_request(b"*1\r\n$4\r\nPING\r\n", &small).is_ok());
        // Arguments within their limit, the whole over the request's: refused as soon
        // as the framing shows it, before the data is there.
        assert!(parse_request(b"*2\r\n$4\r\nPING\r\n$4\r\n", &small).is_err());
    }

    #[test]
    fn inline_commands_split_as_redis_does() {
        let (a, used) = parse(b"SET  k \"a b\\x41\\n\" 'c\\'d'\r\nGET k\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(a, args(&[b"SET", b"k", b"a bA\n", b"c'd"]));
        assert_eq!(used, 27);
        assert_eq!(parse(b"PING\n").unwrap(), Some((args(&[b"PING"]), 5)));
        assert_eq!(parse(b"   \r\n").unwrap(), Some((vec![], 5)));
        assert_eq!(parse(b"PING").unwrap(), None);
    }

    #[test]
    fn replies_encode_for_either_protocol() {
        let enc = |r: &Reply, v: u8| {
            let mut out = Vec::new();
            r.encode(v, &mut out);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(enc(&Reply::ok(), 2), "+OK\r\n");
        assert_eq!(enc(&Reply::error("ERR a\r\nb"), 2), "-ERR a  b\r\n");
        assert_eq!(enc(&Reply::Int(-3), 3), ":-3\r\n");
        assert_eq!(enc(&Reply::Bulk(b"a\r\n".to_vec()), 2), "$3\r\na\r\n\r\n");
        assert_eq!(enc(&Reply::Null, 2), "$-1\r\n");
        assert_eq!(enc(&Reply::Null, 3), "_\r\n");
        assert_eq!(enc(&Reply::NullArray, 2), "*-1\r\n");
        let arr = Reply::Array(vec![Reply::Int(1), Reply::Null]);
        assert_eq!(enc(&arr, 2), "*2\r\n:1\r\n$-1\r\n");
        let map = Reply::Map(vec![(Reply::text("a"), Reply::Int(1))]);
        assert_eq!(enc(&map, 2), "*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(enc(&map, 3), "%1\r\n$1\r\na\r\n:1\r\n");
    }
}
