//! `phoenix put/get/del/scan/cas`: one request against a running cluster.
//!
//! Keys and values are given as text (UTF-8 bytes), or as hex with `--hex`. In text
//! output `get` writes the raw value to stdout and `scan` prints one `key<TAB>value`
//! line per pair with non-printable bytes escaped; `--output json` prints one JSON
//! document instead (byte strings as described in `crate::output`). A missing key and
//! a failed compare are not errors but exit code 1, so scripts can tell them from an
//! empty value and from a cluster that cannot be reached (see `super::exit`).

use std::io::Write;
use std::time::Duration;

use phoenix_client::{Client, ClientError, ClientOptions};
use phoenix_proto::security::Credentials;
use serde_json::{json, Map, Value};

use super::{CmdError, Outcome};
use crate::output::{self, Bytes, Format, Stdout};

/// How to reach the cluster (shared by every client command).
#[derive(Debug, Clone, clap::Args)]
pub struct Conn {
    /// Addresses of cluster nodes (host:port, comma separated); any node will do.
    #[arg(
        long,
        value_delimiter = ',',
        env = "PHOENIX_ENDPOINTS",
        default_value = "127.0.0.1:7001"
    )]
    pub endpoints: Vec<String>,
    /// Deadline of the request, retries included, in milliseconds.
    #[arg(long = "timeout-ms", default_value_t = 5_000)]
    pub timeout_ms: u64,
    /// Keys and values on the command line (and in the output) are hex.
    #[arg(long, default_value_t = false)]
    pub hex: bool,
    /// PEM certificate of the CA that signed the nodes' certificates: talk to the
    /// cluster over TLS.
    #[arg(long, env = "PHOENIX_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate signed by that CA (with --tls-key): the nodes let the
    /// client in by it, without a token.
    #[arg(long, env = "PHOENIX_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "PHOENIX_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// File holding the token to present (its first token, as in a node's
    /// --token-file).
    #[arg(long, env = "PHOENIX_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

impl Conn {
    pub(crate) fn decode(&self, what: &str, s: &str) -> Result<Vec<u8>, CmdError> {
        if !self.hex {
            return Ok(s.as_bytes().to_vec());
        }
        if !s.len().is_multiple_of(2) {
            return Err(CmdError::Usage(format!(
                "{what} {s:?}: odd number of hex digits"
            )));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| {
                s.get(i..i + 2)
                    .and_then(|d| u8::from_str_radix(d, 16).ok())
                    .ok_or_else(|| CmdError::Usage(format!("{what} {s:?}: not hex at offset {i}")))
            })
            .collect()
    }

    pub(crate) fn show(&self, b: &[u8]) -> String {
        if self.hex {
            output::hex(b)
        } else {
            b.escape_ascii().to_string()
        }
    }
}

/// `phoenix put KEY VALUE`.
#[derive(Debug, clap::Args)]
pub struct PutArgs {
    #[command(flatten)]
    conn: Conn,
    /// The key.
    key: String,
    /// The value.
    value: String,
}

/// `phoenix get KEY`.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    conn: Conn,
    /// The key.
    key: String,
}

/// `phoenix del KEY` or `phoenix del --prefix P` / `--range START END`.
#[derive(Debug, clap::Args)]
pub struct DelArgs {
    #[command(flatten)]
    conn: Conn,
    /// The key (or, with --prefix, the prefix; with --range, the start).
    key: String,
    /// Delete every key starting with KEY.
    #[arg(long, default_value_t = false, conflicts_with = "range_end")]
    prefix: bool,
    /// Delete every key in [KEY, END).
    #[arg(long = "range", value_name = "END")]
    range_end: Option<String>,
}

/// `phoenix scan`.
#[derive(Debug, clap::Args)]
pub struct ScanArgs {
    #[command(flatten)]
    conn: Conn,
    /// Only keys starting with this.
    #[arg(long, conflicts_with_all = ["start", "end"])]
    prefix: Option<String>,
    /// First key (inclusive); default: the beginning.
    #[arg(long)]
    start: Option<String>,
    /// End key (exclusive); default: the end of the key space.
    #[arg(long)]
    end: Option<String>,
    /// At most this many pairs (0 = all).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Print keys only.
    #[arg(long = "keys-only", default_value_t = false)]
    keys_only: bool,
}

/// `phoenix cas KEY NEW --expect OLD` (or `--expect-absent`, or `--delete`).
#[derive(Debug, clap::Args)]
pub struct CasArgs {
    #[command(flatten)]
    conn: Conn,
    /// The key.
    key: String,
    /// The new value (omit with --delete).
    new_value: Option<String>,
    /// Swap only if the key holds exactly this value.
    #[arg(
        long,
        conflicts_with = "expect_absent",
        required_unless_present = "expect_absent"
    )]
    expect: Option<String>,
    /// Swap only if the key is absent.
    #[arg(long = "expect-absent", default_value_t = false)]
    expect_absent: bool,
    /// On success delete the key instead of writing a new value.
    #[arg(long, default_value_t = false, conflicts_with = "new_value")]
    delete: bool,
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, CmdError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CmdError::Failed(format!("start the async runtime: {e}").into()))
}

/// The client options a command's flags ask for.
pub(crate) fn options(conn: &Conn) -> Result<ClientOptions, CmdError> {
    let credentials = Credentials::from_files(
        conn.tls_ca.as_deref(),
        conn.tls_cert.as_deref(),
        conn.tls_key.as_deref(),
        conn.token_file.as_deref(),
    )
    .map_err(|e| CmdError::Usage(e.to_string()))?;
    Ok(ClientOptions {
        timeout: Duration::from_millis(conn.timeout_ms),
        credentials,
        ..ClientOptions::default()
    })
}

/// A client that has the routing table, or the reason none of the endpoints gave it.
async fn connect(conn: &Conn) -> Result<Client, CmdError> {
    Client::connect(conn.endpoints.clone(), options(conn)?)
        .await
        .map_err(|e| unreachable_or(conn, e))
}

/// A deadline passing while the cluster is first contacted means no endpoint answered.
pub(crate) fn unreachable_or(conn: &Conn, e: ClientError) -> CmdError {
    match e {
        ClientError::DeadlineExceeded { ref last, .. } => CmdError::Unreachable {
            endpoints: conn.endpoints.join(","),
            // A node serving TLS closes a plaintext connection without a word (the
            // connection was made: not "refused").
            hint: if conn.tls_ca.is_none()
                && !last.contains("connect error")
                && ["transport error", "h2 protocol error", "connection closed"]
                    .iter()
                    .any(|s| last.contains(s))
            {
                " (if the cluster serves TLS, give --tls-ca and a --token-file or client certificate)"
            } else {
                ""
            },
            source: e,
        },
        e => CmdError::Client(e),
    }
}

impl Conn {
    /// How byte strings are shown in JSON.
    pub(crate) fn bytes(&self) -> Bytes {
        if self.hex {
            Bytes::Hex
        } else {
            Bytes::Text
        }
    }

    /// A JSON object holding `fields` (name, bytes) in this command's byte encoding.
    fn object(&self, fields: &[(&str, &[u8])]) -> Map<String, Value> {
        let mut m = Map::new();
        for (name, b) in fields {
            self.bytes().put(&mut m, name, b);
        }
        m
    }
}

/// Runs `phoenix put`.
pub fn put(args: PutArgs, format: Format) -> Result<Outcome, CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    let value = args.conn.decode("value", &args.value)?;
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        c.put(&key, &value).await?;
        done(format)
    })
}

/// Prints the answer of a write that has nothing to report but its success.
fn done(format: Format) -> Result<Outcome, CmdError> {
    match format {
        Format::Text => {
            let mut out = Stdout::lock();
            writeln!(out, "OK")?;
            out.flush()?;
        }
        Format::Json => output::print_json(&json!({ "ok": true }))?,
    }
    Ok(Outcome::Done)
}

/// Runs `phoenix get`.
pub fn get(args: GetArgs, format: Format) -> Result<Outcome, CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        let found = c.get(&key).await?;
        match format {
            Format::Json => {
                let mut m = args.conn.object(&[("key", &key)]);
                m.insert("found".into(), Value::Bool(found.is_some()));
                if let Some(v) = &found {
                    args.conn.bytes().put(&mut m, "value", v);
                }
                output::print_json(&Value::Object(m))?;
            }
            Format::Text => match &found {
                Some(v) => {
                    let mut out = Stdout::lock();
                    if args.conn.hex {
                        writeln!(out, "{}", args.conn.show(v))?;
                    } else {
                        out.write_all(v)?;
                        out.write_all(b"\n")?;
                    }
                    out.flush()?;
                }
                None => output::note(format_args!("key {} not found", args.conn.show(&key))),
            },
        }
        Ok(if found.is_some() {
            Outcome::Done
        } else {
            Outcome::Miss
        })
    })
}

/// Runs `phoenix del`.
pub fn del(args: DelArgs, format: Format) -> Result<Outcome, CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    let end = match &args.range_end {
        Some(end) => Some(args.conn.decode("end", end)?),
        None => None,
    };
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        if args.prefix {
            c.delete_range(&key, &phoenix_client::prefix_end(&key))
                .await?;
        } else if let Some(end) = &end {
            c.delete_range(&key, end).await?;
        } else {
            c.delete(&key).await?;
        }
        done(format)
    })
}

/// Runs `phoenix scan`.
pub fn scan(args: ScanArgs, format: Format) -> Result<Outcome, CmdError> {
    let (start, end) = match &args.prefix {
        Some(p) => {
            let p = args.conn.decode("prefix", p)?;
            let end = phoenix_client::prefix_end(&p);
            (p, end)
        }
        None => (
            match &args.start {
                Some(s) => args.conn.decode("start", s)?,
                None => Vec::new(),
            },
            match &args.end {
                Some(e) => args.conn.decode("end", e)?,
                None => Vec::new(),
            },
        ),
    };
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        let pairs = c.scan(&start, &end, args.limit).await?;
        match format {
            Format::Json => {
                let list: Vec<Value> = pairs
                    .iter()
                    .map(|(k, v)| {
                        let fields: &[(&str, &[u8])] = if args.keys_only {
                            &[("key", k)]
                        } else {
                            &[("key", k), ("value", v)]
                        };
                        Value::Object(args.conn.object(fields))
                    })
                    .collect();
                output::print_json(&json!({ "count": pairs.len(), "pairs": list }))?;
            }
            Format::Text => {
                let mut out = Stdout::lock();
                for (k, v) in &pairs {
                    if args.keys_only {
                        writeln!(out, "{}", args.conn.show(k))?;
                    } else {
                        writeln!(out, "{}\t{}", args.conn.show(k), args.conn.show(v))?;
                    }
                }
                out.flush()?;
                output::note(format_args!("({} pairs)", pairs.len()));
            }
        }
        Ok(Outcome::Done)
    })
}

/// Runs `phoenix cas`.
pub fn cas(args: CasArgs, format: Format) -> Result<Outcome, CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    let expected = match &args.expect {
        Some(e) => Some(args.conn.decode("expected value", e)?),
        None => None,
    };
    let new = match (&args.new_value, args.delete) {
        (Some(v), false) => Some(args.conn.decode("new value", v)?),
        (None, true) => None,
        _ => return Err(CmdError::Usage("give the new value, or --delete".into())),
    };
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        let out = c.cas(&key, expected.as_deref(), new.as_deref()).await?;
        match format {
            Format::Json => {
                let mut m = args.conn.object(&[("key", &key)]);
                m.insert("succeeded".into(), Value::Bool(out.succeeded));
                match &out.previous {
                    Some(p) => args.conn.bytes().put(&mut m, "previous", p),
                    None => {
                        m.insert("previous".into(), Value::Null);
                    }
                }
                output::print_json(&Value::Object(m))?;
            }
            Format::Text => {
                let prev = out
                    .previous
                    .as_deref()
                    .map_or_else(|| "(absent)".to_string(), |p| args.conn.show(p));
                if out.succeeded {
                    let mut o = Stdout::lock();
                    writeln!(o, "OK (previous: {prev})")?;
                    o.flush()?;
                } else {
                    output::note(format_args!("compare failed: the key holds {prev}"));
                }
            }
        }
        Ok(if out.succeeded {
            Outcome::Done
        } else {
            Outcome::Miss
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_decoding() {
        let c = Conn {
            endpoints: vec![],
            timeout_ms: 1,
            hex: true,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            token_file: None,
        };
        assert_eq!(c.decode("k", "00ff10").unwrap(), vec![0, 0xff, 0x10]);
        assert!(c.decode("k", "0").is_err());
        assert!(c.decode("k", "zz").is_err());
        assert_eq!(c.show(&[0, 0xab]), "00ab");
        let t = Conn { hex: false, ..c };
        assert_eq!(t.decode("k", "ab").unwrap(), b"ab".to_vec());
        assert_eq!(t.show(b"a\x00\n"), "a\\x00\\n");
    }
}
