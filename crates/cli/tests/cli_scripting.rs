//! `phoenix` as scripts use it, against a real cluster: a `phoenix playground` on free
//! loopback ports (three `phoenix server` processes) started with `--output json`.
//!
//! Checks the documented exit codes (0 found/ok, 1 not found or compare failed, 2 usage,
//! 3 cluster unreachable), the JSON documents of every client command, that a closed
//! standard output ends a command quietly instead of with a panic, and that completion
//! scripts are generated.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use phoenix_client::{Client, ClientOptions};
use serde_json::Value;

const PHOENIX: &str = env!("CARGO_BIN_EXE_phoenix");

/// Every command of a test must end within this; a hang fails the test instead.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A `phoenix playground` child; stopped (SIGTERM, then SIGKILL) when dropped.
struct Playground {
    child: Child,
    endpoints: String,
    dir: tempfile::TempDir,
    /// Keeps the pipe open: the playground may print again when it stops.
    _stdout: BufReader<ChildStdout>,
    /// The playground's ready document.
    ready: Value,
}

impl Playground {
    fn start() -> Playground {
        Self::start_with(&[])
    }

    /// A playground whose servers also get `server_args`.
    fn start_with(server_args: &[String]) -> Playground {
        Self::launch(&[], server_args)
    }

    /// A playground started with `flags`, its servers with `server_args`.
    fn launch(flags: &[&str], server_args: &[String]) -> Playground {
        let dir = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(dir.path().join("playground.err")).unwrap();
        let mut child = Command::new(PHOENIX)
            .args(["playground", "--base-port", "0", "--output", "json"])
            .args(flags)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(server_args.iter().map(|a| format!("--server-arg={a}")))
            .env_remove("PHOENIX_ENDPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        // The playground prints one JSON document once the cluster serves, or exits
        // (closing the pipe) when it does not within its --ready-timeout (60 s).
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let mut pg = Playground {
            child,
            endpoints: String::new(),
            dir,
            _stdout: stdout,
            ready: Value::Null,
        };
        let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
            panic!(
                "no ready document ({e}): {line:?}; stderr: {}",
                pg.stderr_text()
            )
        });
        assert_eq!(ready["ready"], true, "{ready}");
        assert_eq!(ready["nodes"].as_array().unwrap().len(), 3, "{ready}");
        pg.endpoints = ready["endpoints"].as_str().unwrap().to_string();
        pg.ready = ready;
        pg
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("playground.err")).unwrap_or_default()
    }

    /// `phoenix ARGS --endpoints <this cluster>`.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(PHOENIX);
        c.args(args)
            .args(["--endpoints", &self.endpoints])
            .stdin(Stdio::null());
        for v in [
            "PHOENIX_ENDPOINTS",
            "PHOENIX_TLS_CA",
            "PHOENIX_TLS_CERT",
            "PHOENIX_TLS_KEY",
            "PHOENIX_TOKEN_FILE",
        ] {
            c.env_remove(v);
        }
        c
    }

    /// Runs `phoenix ARGS` against this cluster to completion.
    fn run(&self, args: &[&str]) -> Output {
        finish(self.cmd(args))
    }
}

impl Drop for Playground {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- playground stderr ----\n{}", self.stderr_text());
            for n in 1..=3 {
                let log = self.dir.path().join(format!("data/node-{n}/server.log"));
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                eprintln!("---- node {n} log tail ----");
                for l in tail.into_iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child,
        // not yet reaped (so not reused).
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        // The playground stops its nodes (SIGTERM, SIGKILL after 10 s) before exiting.
        if wait_until(&mut self.child, Duration::from_secs(30)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits for `child` to exit, at most `limit`; None if it is still running.
fn wait_until(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` with its output captured, killing it if it outlives [`COMMAND_TIMEOUT`].
fn finish(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drain both pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let err_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let status = match wait_until(&mut child, COMMAND_TIMEOUT) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {COMMAND_TIMEOUT:?}");
        }
    };
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

fn code(o: &Output) -> i32 {
    o.status
        .code()
        .unwrap_or_else(|| panic!("killed by a signal: {o:?}"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?} / {:?}", stdout(o), stderr(o)))
}

/// Asserts exit code `want`, showing the whole output otherwise.
#[track_caller]
fn expect_code(o: &Output, want: i32) {
    assert_eq!(
        code(o),
        want,
        "stdout {:?}, stderr {:?}",
        stdout(o),
        stderr(o)
    );
    assert!(!stderr(o).contains("panicked"), "{}", stderr(o));
}

#[path = "../../engine/tests/support/port.rs"]
mod port;
use port::free_port;

/// Spawns `cmd` with stdout piped, reads at most one line, closes the pipe and checks
/// the command still exits with `want` and no panic.
fn closed_pipe(mut cmd: Command, read_one_line: bool, want: i32, dir: &Path) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let err_path = dir.join(format!("pipe-{}.err", RUNS.fetch_add(1, Ordering::Relaxed)));
    let err = std::fs::File::create(&err_path).unwrap();
    let mut child = cmd.stdout(Stdio::piped()).stderr(err).spawn().unwrap();
    let out = child.stdout.take().unwrap();
    if read_one_line {
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "no first line");
    } else {
        drop(out);
    }
    let status = wait_until(&mut child, COMMAND_TIMEOUT).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{cmd:?} hung after its stdout closed")
    });
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert!(!err.contains("panicked"), "{cmd:?}: {err}");
    assert_eq!(status.code(), Some(want), "{cmd:?}: {err}");
}

#[test]
fn exit_codes_json_closed_pipes_and_completions() {
    let pg = Playground::start();

    // Exit codes: 0 written / found, 1 missing / compare failed.
    let o = pg.run(&["put", "user/1", "alice"]);
    expect_code(&o, 0);
    assert_eq!(stdout(&o), "OK\n");
    let o = pg.run(&["get", "user/1"]);
    expect_code(&o, 0);
    assert_eq!(stdout(&o), "alice\n");
    let o = pg.run(&["get", "user/missing"]);
    expect_code(&o, 1);
    assert_eq!(stdout(&o), "", "a missing key prints no value");
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    let o = pg.run(&["cas", "user/1", "--expect", "nobody", "carol"]);
    expect_code(&o, 1);
    assert!(stderr(&o).contains("compare failed"), "{}", stderr(&o));
    let o = pg.run(&["cas", "user/1", "--expect", "alice", "bob"]);
    expect_code(&o, 0);
    assert_eq!(stdout(&o), "OK (previous: alice)\n");
    let o = pg.run(&["del", "user/1"]);
    expect_code(&o, 0);
    expect_code(&pg.run(&["get", "user/1"]), 1);

    // Errors: 2 for a malformed argument, 3 for a cluster that cannot be reached; both
    // with a message.
    let o = pg.run(&["get", "--hex", "abc"]);
    expect_code(&o, 2);
    assert!(
        stderr(&o).contains("odd number of hex digits"),
        "{}",
        stderr(&o)
    );
    let o = pg.run(&["frobnicate"]);
    expect_code(&o, 2);
    let dead = format!("127.0.0.1:{}", free_port());
    let o = finish({
        let mut c = Command::new(PHOENIX);
        c.args(["get", "--endpoints", &dead, "--timeout-ms", "500", "k"])
            .env_remove("PHOENIX_ENDPOINTS");
        c
    });
    expect_code(&o, 3);
    assert!(
        stderr(&o).contains("cannot reach the cluster") && stderr(&o).contains(&dead),
        "{}",
        stderr(&o)
    );
    let o = finish({
        let mut c = Command::new(PHOENIX);
        c.args([
            "cluster",
            "status",
            "--endpoints",
            &dead,
            "--timeout-ms",
            "500",
        ])
        .env_remove("PHOENIX_ENDPOINTS");
        c
    });
    expect_code(&o, 3);

    // JSON: one document per command, byte strings as UTF-8 text or base64.
    let o = pg.run(&["put", "--output", "json", "user/2", "dave"]);
    expect_code(&o, 0);
    assert_eq!(json(&o)["ok"], true);
    let o = pg.run(&["--output", "json", "get", "user/2"]);
    expect_code(&o, 0);
    let v = json(&o);
    assert_eq!(
        (v["found"].clone(), v["key"].clone()),
        (true.into(), "user/2".into())
    );
    assert_eq!(v["value"], "dave");
    let o = pg.run(&["get", "--output", "json", "user/none"]);
    expect_code(&o, 1);
    let v = json(&o);
    assert_eq!(v["found"], false);
    assert!(v.get("value").is_none(), "{v}");
    // A value that is not UTF-8 (written as hex) comes back in base64.
    expect_code(&pg.run(&["put", "--hex", "62696e", "ff00"]), 0);
    let o = pg.run(&["get", "--output", "json", "bin"]);
    expect_code(&o, 0);
    assert_eq!(json(&o)["value_base64"], "/wA=");
    let o = pg.run(&["get", "--output", "json", "--hex", "62696e"]);
    assert_eq!(json(&o)["value_hex"], "ff00");
    let o = pg.run(&["cas", "--output", "json", "user/2", "--expect", "x", "y"]);
    expect_code(&o, 1);
    let v = json(&o);
    assert_eq!(
        (v["succeeded"].clone(), v["previous"].clone()),
        (false.into(), "dave".into())
    );
    let o = pg.run(&[
        "cas",
        "--output",
        "json",
        "user/3",
        "--expect-absent",
        "erin",
    ]);
    expect_code(&o, 0);
    let v = json(&o);
    assert_eq!(v["succeeded"], true);
    assert!(v["previous"].is_null(), "{v}");
    let o = pg.run(&["scan", "--output", "json", "--prefix", "user/"]);
    expect_code(&o, 0);
    let v = json(&o);
    assert_eq!(v["count"], 2);
    assert_eq!(v["pairs"][0]["key"], "user/2");
    assert_eq!(v["pairs"][1]["value"], "erin");
    let o = pg.run(&["del", "--output", "json", "--prefix", "user/"]);
    expect_code(&o, 0);
    assert_eq!(json(&o)["ok"], true);
    let o = pg.run(&["cluster", "status", "--output", "json"]);
    expect_code(&o, 0);
    let v = json(&o);
    assert_eq!(v["nodes"].as_array().unwrap().len(), 3, "{v}");
    assert!(!v["groups"].as_array().unwrap().is_empty(), "{v}");
    assert!(v["nodes"][0]["addr"].is_string() && v["groups"][0]["replicas"].is_array());

    // Closed pipes. A scan whose output is well over a pipe buffer (64 KiB), read for
    // one line: the writes after the reader left fail with EPIPE.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = ClientOptions {
            timeout: Duration::from_secs(20),
            ..ClientOptions::default()
        };
        let eps = pg.endpoints.split(',').map(String::from).collect();
        let c = Client::connect(eps, opts).await.unwrap();
        let value = vec![b'v'; 2048];
        for i in 0..200 {
            c.put(format!("pipe/{i:04}").as_bytes(), &value)
                .await
                .unwrap();
        }
    });
    let dir = pg.dir.path();
    closed_pipe(
        pg.cmd(&["scan", "--prefix", "pipe/", "--limit", "0"]),
        true,
        0,
        dir,
    );
    let mut scan_json = pg.cmd(&["scan", "--prefix", "pipe/", "--limit", "0"]);
    scan_json.args(["--output", "json"]);
    closed_pipe(scan_json, false, 0, dir);
    // The reader gone before anything is written (`phoenix cluster status | true`).
    closed_pipe(pg.cmd(&["cluster", "status"]), false, 0, dir);
    closed_pipe(pg.cmd(&["get", "pipe/0001"]), false, 0, dir);
    closed_pipe(pg.cmd(&["get", "pipe/none"]), false, 1, dir);

    // Completions.
    for shell in ["bash", "zsh", "fish"] {
        let o = finish({
            let mut c = Command::new(PHOENIX);
            c.args(["completions", shell]);
            c
        });
        expect_code(&o, 0);
        assert!(
            stdout(&o).len() > 1000 && stdout(&o).contains("phoenix"),
            "{shell}: {}",
            stdout(&o)
        );
    }
    let mut c = Command::new(PHOENIX);
    c.args(["completions", "bash"]);
    closed_pipe(c, false, 0, dir);
}

/// `phoenix server --resp-password-file`: the Redis port serves nothing until the
/// password is given (checked over a raw connection, as any Redis client talks).
#[test]
fn the_redis_port_asks_for_the_password_in_its_file() {
    use std::io::Write as _;
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("resp-password");
    std::fs::write(&file, "s3cret\n").unwrap();
    let pg = Playground::start_with(&[format!("--resp-password-file={}", file.display())]);
    let port = pg.ready["nodes"][0]["resp"].as_str().unwrap().to_string();
    let mut conn = std::net::TcpStream::connect(&port).unwrap();
    conn.set_read_timeout(Some(COMMAND_TIMEOUT)).unwrap();
    let mut ask = |request: &[u8], want: &str| {
        conn.write_all(request).unwrap();
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n") {
            conn.read_exact(&mut byte).unwrap();
            got.push(byte[0]);
        }
        let got = String::from_utf8_lossy(&got).into_owned();
        assert!(
            got.starts_with(want),
            "{:?}: got {got:?}, want {want:?}",
            String::from_utf8_lossy(request)
        );
    };
    ask(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", "-NOAUTH");
    ask(b"*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n", "-WRONGPASS");
    // The trailing newline of the file is not part of the password.
    ask(b"*2\r\n$4\r\nAUTH\r\n$6\r\ns3cret\r\n", "+OK");
    ask(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", "+OK");
}

/// `playground --shared-storage`: the nodes keep their tables on a MinIO the playground
/// started (each node's objects under its prefix in MinIO's data directory) and serve as
/// usual; the same data directory is refused without the flag, before anything starts.
#[test]
#[ignore = "needs minio"]
fn a_shared_storage_playground_keeps_its_tables_on_minio() {
    let pg = Playground::launch(&["--shared-storage"], &[]);
    let shared = &pg.ready["shared_storage"];
    let data = std::path::PathBuf::from(
        shared["data"]
            .as_str()
            .unwrap_or_else(|| panic!("{shared}")),
    );
    for i in 0..50 {
        let put = pg.run(&["put", &format!("shared-{i:02}"), "on minio"]);
        assert_eq!(put.status.code(), Some(0), "{}", stderr(&put));
    }
    let get = pg.run(&["get", "shared-07"]);
    assert_eq!(get.status.code(), Some(0), "{}", stderr(&get));
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "on minio");
    for n in 1..=3 {
        let prefix = data.join("phoenix/cluster").join(format!("node-{n}"));
        let objects = std::fs::read_dir(&prefix).map(|d| d.count()).unwrap_or(0);
        assert!(
            objects > 0,
            "node {n} has no objects under {}",
            prefix.display()
        );
        assert!(
            !pg.dir
                .path()
                .join(format!("data/node-{n}/db/MANIFEST"))
                .exists()
                && !pg
                    .dir
                    .path()
                    .join(format!("data/node-{n}/db/CURRENT"))
                    .exists(),
            "node {n} keeps a manifest on local disk"
        );
    }
    let local = Command::new(PHOENIX)
        .args(["playground", "--base-port", "0", "--data-dir"])
        .arg(pg.dir.path().join("data"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(local.status.code(), Some(4), "{}", stderr(&local));
    assert!(
        stderr(&local).contains("start it with --shared-storage"),
        "{}",
        stderr(&local)
    );
}

/// `playground --tls`: every port speaks TLS and asks for the token it made. The CLI
/// gets in with the CA and the token (flags or environment) or with the client
/// certificate, and is refused without them, with a message saying what is missing.
#[test]
fn a_tls_playground_takes_the_cli_with_its_token_or_certificate_only() {
    let pg = Playground::launch(&["--tls"], &[]);
    let tls = &pg.ready["tls"];
    let path = |k: &str| {
        tls[k]
            .as_str()
            .unwrap_or_else(|| panic!("{k} in {tls}"))
            .to_string()
    };
    let (ca, token_file) = (path("ca"), path("token_file"));
    let (cert, key) = (path("client_cert"), path("client_key"));

    let mut put = pg.cmd(&["put", "tls-key", "tls-value"]);
    put.env("PHOENIX_TLS_CA", &ca)
        .env("PHOENIX_TOKEN_FILE", &token_file);
    let put = finish(put);
    assert_eq!(put.status.code(), Some(0), "{}", stderr(&put));
    let get = pg.run(&[
        "get",
        "tls-key",
        "--tls-ca",
        &ca,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ]);
    assert_eq!(get.status.code(), Some(0), "{}", stderr(&get));
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "tls-value");

    // The CA alone: the node says a token or a certificate is needed.
    let no_token = pg.run(&["get", "tls-key", "--tls-ca", &ca]);
    assert_eq!(no_token.status.code(), Some(4), "{}", stderr(&no_token));
    assert!(
        stderr(&no_token).contains("authentication with node"),
        "{}",
        stderr(&no_token)
    );
    // Plaintext: the node closes the connection; the message says TLS may be why.
    let plain = pg.run(&["get", "tls-key", "--timeout-ms", "1500"]);
    assert_eq!(plain.status.code(), Some(3), "{}", stderr(&plain));
    assert!(stderr(&plain).contains("--tls-ca"), "{}", stderr(&plain));
    // A token file without a token is a usage error, said before anything is sent.
    let empty = pg.dir.path().join("empty-tokens");
    std::fs::write(&empty, "# none\n").unwrap();
    let bad = pg.run(&[
        "get",
        "tls-key",
        "--tls-ca",
        &ca,
        "--token-file",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("holds no token"), "{}", stderr(&bad));
}
