//! A Redis client's side of the protocol, for the tests: requests encoded, RESP2
//! replies decoded.
#![allow(dead_code, clippy::unwrap_used)]

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A reply as a client decodes it (RESP2).
#[derive(Debug, Clone, PartialEq)]
pub enum R {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<R>>),
}

/// Decodes one reply from `buf` at `pos`; None if incomplete.
pub fn decode(buf: &[u8], pos: &mut usize) -> Option<R> {
    let start = *pos;
    let line_end = buf[start..].windows(2).position(|w| w == b"\r\n")? + start;
    let line = std::str::from_utf8(&buf[start + 1..line_end])
        .unwrap()
        .to_string();
    *pos = line_end + 2;
    let r = match buf[start] {
        b'+' => R::Simple(line),
        b'-' => R::Error(line),
        b':' => R::Int(line.parse().unwrap()),
        b'$' => {
            let n: i64 = line.parse().unwrap();
            if n < 0 {
                R::Bulk(None)
            } else {
                let n = n as usize;
                if buf.len() < *pos + n + 2 {
                    *pos = start;
                    return None;
                }
                let v = buf[*pos..*pos + n].to_vec();
                *pos += n + 2;
                R::Bulk(Some(v))
            }
        }
        b'*' => {
            let n: i64 = line.parse().unwrap();
            if n < 0 {
                R::Array(None)
            } else {
                let mut items = Vec::new();
                for _ in 0..n {
                    match decode(buf, pos) {
                        Some(r) => items.push(r),
                        None => {
                            *pos = start;
                            return None;
                        }
                    }
                }
                R::Array(Some(items))
            }
        }
        other => panic!("unexpected reply type {:?}", other as char),
    };
    Some(r)
}

pub fn encode(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Sends `reqs` at once (a pipeline) and reads as many replies.
pub async fn pipeline<IO: AsyncRead + AsyncWrite + Unpin>(
    io: &mut IO,
    reqs: &[Vec<Vec<u8>>],
) -> Vec<R> {
    let mut wire = Vec::new();
    for r in reqs {
        wire.extend(encode(r));
    }
    io.write_all(&wire).await.unwrap();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut pos = 0;
    while out.len() < reqs.len() {
        let mut chunk = [0u8; 8192];
        let n = io.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed after {} replies", out.len());
        buf.extend_from_slice(&chunk[..n]);
        while let Some(r) = decode(&buf, &mut pos) {
            out.push(r);
        }
    }
    out
}

/// A request from words.
pub fn req(words: &[&[u8]]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.to_vec()).collect()
}
