//! A client connection: reads requests (pipelined or not), runs each command against
//! the [`Store`] in order, and writes the replies back in order, flushed once the
//! requests at hand are answered.
//!
//! Commands that read and then write (SET with NX, XX or GET, SETNX, GETSET, DEL) are
//! compare-and-swaps on the key, retried while another client changes it in between:
//! each is atomic. INCR and its kin are one replicated command (`Store::incr`), or the
//! same compare-and-swap loop on a cluster with a node too old for it. A write whose outcome is unknown (a leader lost mid-way) is
//! answered with an error saying so, never guessed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::codec::{parse_request, Limits, Reply};
use crate::command::{
    self, Command, CommandInfo, CommandQuery, ExpireWhen, Pattern, SetCond, SetExpiry, COMMANDS,
};
use crate::store::{Store, StoreError};
use phoenix_client::{ExpireAt, ExpireCondition, Expiry, IncrOutcome, KeyTtl};

/// Compare-and-swap attempts a read-modify-write command makes before it gives up on a
/// key other clients keep changing.
pub const SWAP_ATTEMPTS_MAX: usize = 64;

/// SCAN cursors a connection keeps at once (the oldest are forgotten).
pub const CURSORS_MAX: usize = 1024;

/// Keys one scan page asks the cluster for at most (KEYS and DBSIZE page through).
const PAGE: u32 = 1000;

/// Read buffer a connection keeps between requests.
const BUF_KEEP: usize = 64 * 1024;

/// How long a stopping connection takes (and drops) what its client still sends, after
/// its last reply.
const STOP_DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Room a connection's buffers start with, and the least room a read is given.
const READ_ROOM: usize = 4 * 1024;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// SCAN cursors are numbered over the process, not the connection: a client library
/// that sends a cursor on another pooled connection gets `invalid cursor`, never
/// another scan's keys.
static NEXT_CURSOR: AtomicU64 = AtomicU64::new(1);

/// What the server says of itself in HELLO and INFO, and the password it asks for.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// This node's id.
    pub node_id: u64,
    /// The Redis version it answers like (clients check it for features).
    pub redis_version: &'static str,
    /// The password of the default user (Redis' `requirepass`): a connection must give
    /// it (AUTH, or HELLO … AUTH) before any other command. None: no password.
    pub password: Option<Password>,
}

impl Default for ServerInfo {
    fn default() -> ServerInfo {
        ServerInfo {
            node_id: 0,
            redis_version: "7.2.0",
            password: None,
        }
    }
}

/// The passwords the default user takes (the `--resp-password-file` password and the
/// node's tokens), never printed.
#[derive(Clone)]
pub struct Password(Vec<Vec<u8>>);

impl Password {
    /// The password `bytes` (refused if empty: an empty password would let anyone in).
    pub fn new(bytes: Vec<u8>) -> Option<Password> {
        Password::any_of(vec![bytes])
    }

    /// Any of `secrets` (refused if there is none, or one is empty).
    pub fn any_of(secrets: Vec<Vec<u8>>) -> Option<Password> {
        (!secrets.is_empty() && secrets.iter().all(|s| !s.is_empty())).then_some(Password(secrets))
    }

    /// Whether `given` is one of the passwords, in time that depends on the length of
    /// `given` and the number of passwords only (each is compared).
    fn matches(&self, given: &[u8]) -> bool {
        phoenix_proto::security::matches_any(&self.0, given)
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(…)")
    }
}

/// The limits of a connection not yet authenticated (as Redis bounds them): small, so
/// a client without the password cannot make the node hold big requests.
const UNAUTHENTICATED: Limits = Limits {
    max_args: 10,
    max_bulk: 16 * 1024,
    max_inline: 16 * 1024,
    max_request: 64 * 1024,
};

/// A connection's own state.
pub struct Conn<S> {
    store: Arc<S>,
    limits: Limits,
    info: Arc<ServerInfo>,
    id: u64,
    version: u8,
    /// Whether the connection gave the password (or none is asked for).
    authenticated: bool,
    /// `limits`, no larger than [`UNAUTHENTICATED`]: what a request may be before then.
    unauthenticated_limits: Limits,
    name: Option<Vec<u8>>,
    /// SCAN cursor → the key the scan goes on from (`cursors_order`: oldest first).
    cursors: HashMap<u64, Vec<u8>>,
    cursors_order: VecDeque<u64>,
}

/// What to do after a reply.
enum Then {
    Go,
    Close,
}

fn store_err(e: StoreError) -> Reply {
    match e {
        StoreError::CrossGroup(_) => Reply::error(format!("CROSSSLOT {e}")),
        other => Reply::error(format!("ERR {other}")),
    }
}

fn contended(what: &str) -> Reply {
    Reply::error(format!(
        "ERR {what}: the key changed under {SWAP_ATTEMPTS_MAX} attempts in a row; try again"
    ))
}

fn bulk_or_null(v: Option<Vec<u8>>) -> Reply {
    v.map_or(Reply::Null, Reply::Bulk)
}

impl<S: Store> Conn<S> {
    /// A new connection's state.
    pub fn new(store: Arc<S>, limits: Limits, info: Arc<ServerInfo>) -> Conn<S> {
        Conn {
            store,
            authenticated: info.password.is_none(),
            unauthenticated_limits: Limits {
                max_args: limits.max_args.min(UNAUTHENTICATED.max_args),
                max_bulk: limits.max_bulk.min(UNAUTHENTICATED.max_bulk),
                max_inline: limits.max_inline.min(UNAUTHENTICATED.max_inline),
                max_request: limits.max_request.min(UNAUTHENTICATED.max_request),
            },
            limits,
            info,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            version: 2,
            name: None,
            cursors: HashMap::new(),
            cursors_order: VecDeque::new(),
        }
    }

    /// Lets the connection in without a password: its client showed a certificate the
    /// cluster's CA signed (checked in the TLS handshake).
    pub fn authenticated_by_certificate(&mut self) {
        self.authenticated = true;
    }

    /// Serves requests from `io` until the client leaves, sends QUIT, or breaks the
    /// protocol (answered with an error, then closed).
    pub async fn serve<IO: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        io: IO,
    ) -> std::io::Result<()> {
        self.serve_until(io, None).await
    }

    /// [`serve`](Self::serve), and closes the connection once `stop` turns true: at
    /// once if it waits for a request, else after answering the requests it has read.
    pub async fn serve_until<IO: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        mut io: IO,
        mut stop: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> std::io::Result<()> {
        // Small to start: a node may hold thousands of idle connections. A request
        // bigger than the room left makes it grow (parse_request bounds it).
        let mut buf: Vec<u8> = Vec::with_capacity(READ_ROOM);
        let mut out: Vec<u8> = Vec::with_capacity(READ_ROOM);
        loop {
            if buf.capacity() - buf.len() < READ_ROOM / 4 {
                buf.reserve(buf.capacity().max(READ_ROOM));
            }
            // Read straight into the request buffer: no copy between buffers.
            let room = buf.capacity() - buf.len();
            let read = match stop.as_mut() {
                Some(stop) => tokio::select! {
                    // (The stop first: nothing more is read once it is asked.)
                    biased;
                    _ = stop.wait_for(|s| *s) => None,
                    n = io.read_buf(&mut buf) => Some(n?),
                },
                None => Some(io.read_buf(&mut buf).await?),
            };
            let Some(n) = read else {
                // Every reply owed is written. End the sending side, then take what the
                // client still sends for a moment, unread: closing with bytes unread
                // would reset the connection and could lose replies it has not read.
                io.shutdown().await?;
                let _ = tokio::time::timeout(STOP_DRAIN, async {
                    let mut sink = [0u8; 4096];
                    while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
                return Ok(());
            };
            if n == 0 {
                return Ok(());
            }
            if n >= room && buf.capacity() < BUF_KEEP {
                // A read that filled the room: a pipelining client has more waiting.
                buf.reserve(buf.capacity());
            }
            let mut used = 0;
            let mut close = false;
            loop {
                let limits = if self.authenticated {
                    &self.limits
                } else {
                    &self.unauthenticated_limits
                };
                match parse_request(&buf[used..], limits) {
                    Ok(None) => break,
                    Ok(Some((args, took))) => {
                        used += took;
                        if args.is_empty() {
                            continue;
                        }
                        let (reply, then) = self.run(args).await;
                        reply.encode(self.version, &mut out);
                        if let Then::Close = then {
                            close = true;
                            break;
                        }
                    }
                    Err(e) => {
                        Reply::error(format!("ERR {e}")).encode(self.version, &mut out);
                        close = true;
                        break;
                    }
                }
                // Answer a long pipeline in pieces rather than holding every reply.
                if out.len() >= 1 << 20 {
                    io.write_all(&out).await?;
                    out.clear();
                }
            }
            buf.drain(..used);
            // A big request's room is given back once it is served.
            if buf.capacity() > BUF_KEEP && buf.len() < BUF_KEEP / 2 {
                buf.shrink_to(BUF_KEEP);
            }
            if out.capacity() > BUF_KEEP {
                out.shrink_to(BUF_KEEP);
            }
            if !out.is_empty() {
                io.write_all(&out).await?;
                out.clear();
            }
            if close {
                io.flush().await?;
                return Ok(());
            }
        }
    }

    /// Runs one request.
    async fn run(&mut self, args: Vec<Vec<u8>>) -> (Reply, Then) {
        // An HTTP request sent here (a web page making the browser post to this port
        // could otherwise have each line of its body run as a command): closed without a
        // word, as Redis does.
        if args[0].eq_ignore_ascii_case(b"POST") || args[0].eq_ignore_ascii_case(b"HOST:") {
            tracing::warn!("resp: an HTTP request on the Redis port; connection closed");
            return (Reply::Silent, Then::Close);
        }
        let cmd = match command::parse(args) {
            Ok(c) => c,
            Err(reply) => return (reply, Then::Go),
        };
        if let Command::Quit = cmd {
            return (Reply::ok(), Then::Close);
        }
        if !self.authenticated && !matches!(cmd, Command::Auth { .. } | Command::Hello { .. }) {
            return (Reply::error("NOAUTH Authentication required."), Then::Go);
        }
        let reply = self.execute(cmd).await.unwrap_or_else(store_err);
        (reply, Then::Go)
    }

    async fn execute(&mut self, cmd: Command) -> Result<Reply, StoreError> {
        let store = Arc::clone(&self.store);
        Ok(match cmd {
            Command::Ping(None) => Reply::Simple("PONG".into()),
            Command::Ping(Some(m)) | Command::Echo(m) => Reply::Bulk(m),
            Command::Quit => Reply::ok(),
            Command::Hello {
                version,
                auth,
                name,
            } => {
                match auth {
                    Some((user, password)) => {
                        if let Err(reply) = self.authenticate(Some(&user), &password) {
                            return Ok(reply);
                        }
                    }
                    None if !self.authenticated => {
                        return Ok(Reply::error(
                            "NOAUTH HELLO must be called with the client already authenticated, \
                             otherwise the HELLO <proto> AUTH <user> <pass> option can be used \
                             to authenticate the client and select the RESP protocol version at \
                             the same time",
                        ));
                    }
                    None => {}
                }
                if let Some(v) = version {
                    self.version = v;
                }
                if name.is_some() {
                    self.name = name;
                }
                self.hello()
            }
            Command::Auth { user, password } => self
                .authenticate(user.as_deref(), &password)
                .map_or_else(|reply| reply, |()| Reply::ok()),
            Command::ClientSetName(n) => {
                self.name = (!n.is_empty()).then_some(n);
                Reply::ok()
            }
            Command::ClientGetName => bulk_or_null(self.name.clone()),
            Command::ClientId => Reply::Int(self.id as i64),
            Command::ClientSetInfo => Reply::ok(),
            Command::Command(q) => command_reply(q),
            Command::Select(0) => Reply::ok(),
            Command::Select(_) => Reply::error("ERR DB index is out of range"),
            Command::Info => Reply::Bulk(self.info_text().into_bytes()),
            Command::ConfigGet => Reply::Map(Vec::new()),
            Command::Get(k) => bulk_or_null(store.get(&k).await?),
            Command::Set {
                key,
                value,
                cond: SetCond::Always,
                get: false,
                expiry: SetExpiry::None,
            } => {
                store.put(&key, &value).await?;
                Reply::ok()
            }
            Command::Set {
                key,
                value,
                cond: SetCond::Always,
                get: false,
                expiry,
            } => {
                store.put_with(&key, &value, set_expiry(expiry)).await?;
                Reply::ok()
            }
            Command::Set {
                key,
                value,
                cond,
                get,
                expiry,
            } => set_swapped(&*store, &key, &value, cond, get, set_expiry(expiry)).await?,
            Command::Expire { key, when, cond } => {
                let at = match when {
                    ExpireWhen::AfterMs(ms) => {
                        ExpireAt::After(Duration::from_millis(ms.max(0) as u64))
                    }
                    ExpireWhen::AtMs(ms) => ExpireAt::UnixMs(ms.max(1) as u64),
                };
                Reply::Int(i64::from(store.expire(&key, at, cond).await?))
            }
            Command::Persist(key) => Reply::Int(i64::from(
                store
                    .expire(&key, ExpireAt::Never, ExpireCondition::ExpireAlways)
                    .await?,
            )),
            Command::ExpireTime(key, ms) => Reply::Int(match ttl_of(&*store, &key).await? {
                KeyTtl::Absent => -2,
                KeyTtl::Never => -1,
                KeyTtl::At { at_ms, .. } if ms => at_ms as i64,
                // Rounded to the nearest second, as Redis does.
                KeyTtl::At { at_ms, .. } => at_ms.saturating_add(500) as i64 / 1000,
            }),
            Command::Ttl(key, ms) => Reply::Int(match ttl_of(&*store, &key).await? {
                KeyTtl::Absent => -2,
                KeyTtl::Never => -1,
                KeyTtl::At { left_ms, .. } if ms => left_ms as i64,
                KeyTtl::At { left_ms, .. } => left_ms.saturating_add(500) as i64 / 1000,
            }),
            Command::SetNx(k, v) => {
                let r = store.cas(&k, None, Some(&v)).await?;
                Reply::Int(i64::from(r.succeeded))
            }
            Command::GetSet(k, v) => {
                set_swapped(&*store, &k, &v, SetCond::Always, true, Expiry::Never).await?
            }
            Command::Del(keys) => {
                let mut n = 0;
                for k in keys {
                    n += i64::from(delete_swapped(&*store, &k).await?);
                }
                Reply::Int(n)
            }
            Command::Exists(keys) => {
                let vals = store.get_many(&keys).await?;
                Reply::Int(vals.iter().filter(|v| v.is_some()).count() as i64)
            }
            Command::MGet(keys) => {
                let vals = store.get_many(&keys).await?;
                Reply::Array(vals.into_iter().map(bulk_or_null).collect())
            }
            Command::MSet(pairs) => {
                // A key given twice keeps its last value, as in Redis.
                let mut ops: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(pairs.len());
                let mut seen = std::collections::HashSet::with_capacity(pairs.len());
                for (k, v) in pairs.into_iter().rev() {
                    if seen.insert(k.clone()) {
                        ops.push((k, Some(v)));
                    }
                }
                ops.reverse();
                store.write(&ops).await?;
                Reply::ok()
            }
            Command::IncrBy(k, by) => match store.incr(&k, by).await {
                Ok(outcome) => incr_reply(outcome),
                Err(StoreError::Unsupported(_)) => incr_swapped(&*store, &k, by).await?,
                Err(e) => return Err(e),
            },
            Command::Scan {
                cursor,
                pattern,
                count,
            } => self.scan(cursor, &pattern, count).await?,
            Command::Keys(pattern) => {
                let mut keys = Vec::new();
                each_key(&*store, &pattern, |k| keys.push(Reply::Bulk(k))).await?;
                Reply::Array(keys)
            }
            Command::DbSize => {
                let mut n = 0;
                each_key(&*store, &Pattern::Prefix(Vec::new()), |_| n += 1).await?;
                Reply::Int(n)
            }
        })
    }

    fn hello(&self) -> Reply {
        Reply::Map(vec![
            (Reply::text("server"), Reply::text("redis")),
            (Reply::text("version"), Reply::text(self.info.redis_version)),
            (Reply::text("proto"), Reply::Int(i64::from(self.version))),
            (Reply::text("id"), Reply::Int(self.id as i64)),
            (Reply::text("mode"), Reply::text("standalone")),
            (Reply::text("role"), Reply::text("master")),
            (Reply::text("modules"), Reply::Array(Vec::new())),
        ])
    }

    fn info_text(&self) -> String {
        format!(
            "# Server\r\nredis_version:{}\r\nredis_mode:standalone\r\nserver_name:phoenixkv\r\n\
             phoenixkv_version:{}\r\nphoenixkv_node_id:{}\r\n\r\n# Replication\r\nrole:master\r\n",
            self.info.redis_version,
            env!("CARGO_PKG_VERSION"),
            self.info.node_id
        )
    }

    /// One SCAN step: up to `count` keys from where `cursor` left off.
    async fn scan(
        &mut self,
        cursor: u64,
        pattern: &Pattern,
        count: usize,
    ) -> Result<Reply, StoreError> {
        let from = if cursor == 0 {
            pattern.start().to_vec()
        } else {
            // (Kept after use: a SCAN sent again after a lost answer goes on.)
            match self.cursors.get(&cursor) {
                Some(k) => k.clone(),
                None => return Ok(Reply::error("ERR invalid cursor")),
            }
        };
        let end = range_end(pattern);
        let limit = count.min(phoenix_proto::limits::SCAN_LIMIT_MAX as usize) as u32;
        let page = self.store.scan(&from, &end, limit).await?;
        let keys: Vec<Reply> = page
            .pairs
            .into_iter()
            .filter(|(k, _)| pattern.matches(k))
            .map(|(k, _)| Reply::Bulk(k))
            .collect();
        let next = match page.next {
            Some(k) => {
                let id = NEXT_CURSOR.fetch_add(1, Ordering::Relaxed);
                self.cursors.insert(id, k);
                self.cursors_order.push_back(id);
                while self.cursors_order.len() > CURSORS_MAX {
                    if let Some(old) = self.cursors_order.pop_front() {
                        self.cursors.remove(&old);
                    }
                }
                id
            }
            None => 0,
        };
        Ok(Reply::Array(vec![
            Reply::text(next.to_string()),
            Reply::Array(keys),
        ]))
    }
}

impl<S> Conn<S> {
    /// Checks a password given by AUTH or HELLO: the connection is authenticated if it
    /// is the default user's; else the refusal (and the connection stays as it was).
    fn authenticate(&mut self, user: Option<&[u8]>, password: &[u8]) -> Result<(), Reply> {
        let default_user = user.is_none_or(|u| u == b"default");
        let right = match &self.info.password {
            Some(want) => default_user && want.matches(password),
            // No password: the default user takes any (as Redis' `nopass` user does),
            // but a password alone is a mistake worth saying.
            None if user.is_none() => return Err(no_auth()),
            None => default_user,
        };
        if right {
            self.authenticated = true;
            Ok(())
        } else {
            // (Debug only: a client may send thousands of these in one write.)
            tracing::debug!(conn = self.id, "resp: a wrong password");
            Err(Reply::error(
                "WRONGPASS invalid username-password pair or user is disabled.",
            ))
        }
    }
}

fn no_auth() -> Reply {
    Reply::error(
        "ERR AUTH <password> called without any password configured for the default user. \
         Are you sure your configuration is correct?",
    )
}

/// The end of the range a pattern's keys lie in (empty: unbounded).
fn range_end(pattern: &Pattern) -> Vec<u8> {
    match pattern {
        Pattern::Prefix(p) => phoenix_client::prefix_end(p),
        Pattern::Exact(k) => {
            let mut e = k.clone();
            e.push(0);
            e
        }
    }
}

/// Calls `f` with every key matching `pattern`, page by page.
async fn each_key<S: Store>(
    store: &S,
    pattern: &Pattern,
    mut f: impl FnMut(Vec<u8>),
) -> Result<(), StoreError> {
    let end = range_end(pattern);
    let mut from = pattern.start().to_vec();
    loop {
        let page = store.scan(&from, &end, PAGE).await?;
        for (k, _) in page.pairs {
            if pattern.matches(&k) {
                f(k);
            }
        }
        match page.next {
            Some(n) => from = n,
            None => return Ok(()),
        }
    }
}

/// SET with NX, XX or GET (and GETSET): a compare-and-swap on what was read.
async fn set_swapped<S: Store>(
    store: &S,
    key: &[u8],
    value: &[u8],
    cond: SetCond,
    get: bool,
    expiry: Expiry,
) -> Result<Reply, StoreError> {
    let mut cur = store.get(key).await?;
    for _ in 0..SWAP_ATTEMPTS_MAX {
        let allowed = match cond {
            SetCond::Always => true,
            SetCond::IfAbsent => cur.is_none(),
            SetCond::IfPresent => cur.is_some(),
        };
        if !allowed {
            return Ok(if get { bulk_or_null(cur) } else { Reply::Null });
        }
        let r = if expiry == Expiry::Never {
            store.cas(key, cur.as_deref(), Some(value)).await?
        } else {
            store
                .cas_with(key, cur.as_deref(), Some(value), expiry)
                .await?
        };
        if r.succeeded {
            return Ok(if get { bulk_or_null(cur) } else { Reply::ok() });
        }
        cur = r.previous;
    }
    Ok(contended("SET"))
}

/// `key`'s expiry; on a cluster that does not serve expiries yet, from whether the key
/// exists (no key expires there).
async fn ttl_of<S: Store>(store: &S, key: &[u8]) -> Result<KeyTtl, StoreError> {
    match store.ttl(key).await {
        Err(StoreError::Unsupported(_)) => Ok(if store.get(key).await?.is_some() {
            KeyTtl::Never
        } else {
            KeyTtl::Absent
        }),
        r => r,
    }
}

/// The expiry a SET's option gives (EXAT/PXAT from this node's clock: one already past
/// leaves the key for a millisecond).
fn set_expiry(e: SetExpiry) -> Expiry {
    match e {
        SetExpiry::None => Expiry::Never,
        SetExpiry::Keep => Expiry::Keep,
        SetExpiry::AfterMs(ms) => Expiry::After(Duration::from_millis(ms)),
        SetExpiry::AtMs(at) => {
            let now = crate::store::now_ms();
            Expiry::After(Duration::from_millis(at.saturating_sub(now).max(1)))
        }
    }
}

/// Deletes `key` if present; whether it was.
async fn delete_swapped<S: Store>(store: &S, key: &[u8]) -> Result<bool, StoreError> {
    let mut cur = store.get(key).await?;
    for _ in 0..SWAP_ATTEMPTS_MAX {
        let Some(v) = cur else {
            return Ok(false);
        };
        let r = store.cas(key, Some(&v), None).await?;
        if r.succeeded {
            return Ok(true);
        }
        cur = r.previous;
    }
    Err(StoreError::Unavailable(format!(
        "DEL: the key changed under {SWAP_ATTEMPTS_MAX} attempts in a row; try again"
    )))
}

/// The reply to an increment's outcome, in Redis' words.
fn incr_reply(outcome: IncrOutcome) -> Reply {
    match outcome {
        IncrOutcome::Value(n) => Reply::Int(n),
        IncrOutcome::NotAnInteger => Reply::error("ERR value is not an integer or out of range"),
        IncrOutcome::Overflow => Reply::error("ERR increment or decrement would overflow"),
    }
}

/// INCRBY on a cluster that does not serve increments yet: the value read as a decimal
/// i64 (absent: 0), plus `by`, swapped in.
async fn incr_swapped<S: Store>(store: &S, key: &[u8], by: i64) -> Result<Reply, StoreError> {
    let mut cur = store.get(key).await?;
    for _ in 0..SWAP_ATTEMPTS_MAX {
        let next = match phoenix_proto::counter::incremented(cur.as_deref(), by) {
            Ok(n) => n,
            Err(f) => return Ok(incr_reply(IncrOutcome::of(Err(f)))),
        };
        let text = next.to_string();
        let r = store
            .cas(key, cur.as_deref(), Some(text.as_bytes()))
            .await?;
        if r.succeeded {
            return Ok(Reply::Int(next));
        }
        cur = r.previous;
    }
    Ok(contended("INCRBY"))
}

/// COMMAND's replies.
fn command_reply(q: CommandQuery) -> Reply {
    let info = |&(name, arity, flags, first, last, step): &CommandInfo| {
        Reply::Array(vec![
            Reply::text(name),
            Reply::Int(arity),
            Reply::Array(flags.iter().map(|f| Reply::Simple((*f).into())).collect()),
            Reply::Int(first),
            Reply::Int(last),
            Reply::Int(step),
        ])
    };
    match q {
        CommandQuery::All => Reply::Array(COMMANDS.iter().map(info).collect()),
        CommandQuery::Count => Reply::Int(COMMANDS.len() as i64),
        CommandQuery::Docs => Reply::Map(Vec::new()),
        CommandQuery::Info(names) => Reply::Array(
            names
                .iter()
                .map(|n| {
                    COMMANDS
                        .iter()
                        .find(|c| c.0.eq_ignore_ascii_case(n))
                        .map_or(Reply::NullArray, info)
                })
                .collect(),
        ),
    }
}
