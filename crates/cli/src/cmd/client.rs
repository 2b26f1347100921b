//! `phoenix put/get/del/scan/cas`: one request against a running cluster.
//!
//! Keys and values are given as text (UTF-8 bytes), or as hex with `--hex`. `get` writes
//! the raw value to stdout; `scan` prints one `key<TAB>value` line per pair with
//! non-printable bytes escaped. A missing key is an error (exit code 1) so scripts can
//! tell it from an empty value.

use std::io::Write;
use std::time::Duration;

use phoenix_client::{Client, ClientOptions};

use super::CmdError;

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
}

impl Conn {
    fn decode(&self, what: &str, s: &str) -> Result<Vec<u8>, CmdError> {
        if !self.hex {
            return Ok(s.as_bytes().to_vec());
        }
        if !s.len().is_multiple_of(2) {
            return Err(format!("{what} {s:?}: odd number of hex digits").into());
        }
        (0..s.len())
            .step_by(2)
            .map(|i| {
                s.get(i..i + 2)
                    .and_then(|d| u8::from_str_radix(d, 16).ok())
                    .ok_or_else(|| format!("{what} {s:?}: not hex at offset {i}").into())
            })
            .collect()
    }

    fn show(&self, b: &[u8]) -> String {
        if self.hex {
            b.iter().map(|x| format!("{x:02x}")).collect()
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

fn runtime() -> Result<tokio::runtime::Runtime, CmdError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("start the async runtime: {e}").into())
}

async fn connect(conn: &Conn) -> Result<Client, CmdError> {
    let opts = ClientOptions {
        timeout: Duration::from_millis(conn.timeout_ms),
        ..ClientOptions::default()
    };
    Client::connect(conn.endpoints.clone(), opts)
        .await
        .map_err(|e| {
            format!(
                "cannot reach the cluster at {}: {e}",
                conn.endpoints.join(",")
            )
            .into()
        })
}

/// Runs `phoenix put`.
pub fn put(args: PutArgs) -> Result<(), CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    let value = args.conn.decode("value", &args.value)?;
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        c.put(&key, &value).await?;
        println!("OK");
        Ok(())
    })
}

/// Runs `phoenix get`.
pub fn get(args: GetArgs) -> Result<(), CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        match c.get(&key).await? {
            Some(v) => {
                let mut out = std::io::stdout().lock();
                if args.conn.hex {
                    writeln!(out, "{}", args.conn.show(&v))?;
                } else {
                    out.write_all(&v)?;
                    out.write_all(b"\n")?;
                }
                Ok(())
            }
            None => Err(format!("key {} not found", args.conn.show(&key)).into()),
        }
    })
}

/// Runs `phoenix del`.
pub fn del(args: DelArgs) -> Result<(), CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        if args.prefix {
            c.delete_range(&key, &phoenix_client::prefix_end(&key))
                .await?;
        } else if let Some(end) = &args.range_end {
            let end = args.conn.decode("end", end)?;
            c.delete_range(&key, &end).await?;
        } else {
            c.delete(&key).await?;
        }
        println!("OK");
        Ok(())
    })
}

/// Runs `phoenix scan`.
pub fn scan(args: ScanArgs) -> Result<(), CmdError> {
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
        let mut out = std::io::stdout().lock();
        for (k, v) in &pairs {
            if args.keys_only {
                writeln!(out, "{}", args.conn.show(k))?;
            } else {
                writeln!(out, "{}\t{}", args.conn.show(k), args.conn.show(v))?;
            }
        }
        eprintln!("({} pairs)", pairs.len());
        Ok(())
    })
}

/// Runs `phoenix cas`.
pub fn cas(args: CasArgs) -> Result<(), CmdError> {
    let key = args.conn.decode("key", &args.key)?;
    let expected = match &args.expect {
        Some(e) => Some(args.conn.decode("expected value", e)?),
        None => None,
    };
    let new = match (&args.new_value, args.delete) {
        (Some(v), false) => Some(args.conn.decode("new value", v)?),
        (None, true) => None,
        _ => return Err("give the new value, or --delete".into()),
    };
    runtime()?.block_on(async {
        let c = connect(&args.conn).await?;
        let out = c.cas(&key, expected.as_deref(), new.as_deref()).await?;
        let prev = out
            .previous
            .as_deref()
            .map_or_else(|| "(absent)".to_string(), |p| args.conn.show(p));
        if out.succeeded {
            println!("OK (previous: {prev})");
            Ok(())
        } else {
            Err(format!("compare failed: the key holds {prev}").into())
        }
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
