//! Commands as the front end understands them: the arguments of a request checked for
//! arity and options, before anything is read or written.

use crate::codec::Reply;

/// SET's condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetCond {
    /// Always.
    Always,
    /// NX: only if the key is absent.
    IfAbsent,
    /// XX: only if the key is present.
    IfPresent,
}

/// The expiry a SET gives its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetExpiry {
    /// None (the key's is removed).
    None,
    /// EX / PX: this many ms from now (at least 1).
    AfterMs(u64),
    /// EXAT / PXAT: at this time, ms since the Unix epoch.
    AtMs(u64),
    /// KEEPTTL.
    Keep,
}

/// When an EXPIRE-family command sets the expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireWhen {
    /// EXPIRE / PEXPIRE: this many ms from now (zero or less: the key is deleted).
    AfterMs(i64),
    /// EXPIREAT / PEXPIREAT: at this time, ms since the Unix epoch (past: deleted).
    AtMs(i64),
}

/// The subcommands of COMMAND.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandQuery {
    /// COMMAND: every command's description.
    All,
    /// COMMAND COUNT.
    Count,
    /// COMMAND INFO name…
    Info(Vec<String>),
    /// COMMAND DOCS [name…]: no documentation is served (an empty map).
    Docs,
}

/// A SCAN or KEYS pattern: every key, a prefix (`prefix*`), or one key (no glob
/// characters at all). Other globs are refused: a range scan answers these, and a
/// pattern that needs every key filtered one by one has no range to scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Keys starting with this (empty: every key).
    Prefix(Vec<u8>),
    /// This key alone.
    Exact(Vec<u8>),
}

impl Pattern {
    fn parse(p: &[u8]) -> Result<Pattern, Reply> {
        let glob = |c: &u8| matches!(c, b'*' | b'?' | b'[' | b']' | b'\\');
        match p.split_last() {
            Some((b'*', head)) if !head.iter().any(glob) => Ok(Pattern::Prefix(head.to_vec())),
            _ if !p.iter().any(glob) => Ok(Pattern::Exact(p.to_vec())),
            _ => Err(Reply::error(
                "ERR only patterns of the form prefix* (or a key without glob characters) are supported",
            )),
        }
    }

    /// Whether `key` matches.
    pub fn matches(&self, key: &[u8]) -> bool {
        match self {
            Pattern::Prefix(p) => key.starts_with(p),
            Pattern::Exact(k) => key == k.as_slice(),
        }
    }

    /// The key the matching range starts at.
    pub fn start(&self) -> &[u8] {
        match self {
            Pattern::Prefix(p) | Pattern::Exact(p) => p,
        }
    }
}

/// A request, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// PING [message].
    Ping(Option<Vec<u8>>),
    /// ECHO message.
    Echo(Vec<u8>),
    /// QUIT: answered OK, then the connection is closed.
    Quit,
    /// HELLO [protover [AUTH user pass] [SETNAME name]].
    Hello {
        /// The protocol version asked for (None: keep the current one).
        version: Option<u8>,
        /// AUTH's user and password, if given.
        auth: Option<(Vec<u8>, Vec<u8>)>,
        /// SETNAME's name.
        name: Option<Vec<u8>>,
    },
    /// AUTH [user] password.
    Auth {
        /// The user (None: the default user).
        user: Option<Vec<u8>>,
        /// The password.
        password: Vec<u8>,
    },
    /// CLIENT SETNAME name.
    ClientSetName(Vec<u8>),
    /// CLIENT GETNAME.
    ClientGetName,
    /// CLIENT ID.
    ClientId,
    /// CLIENT SETINFO LIB-NAME|LIB-VER value (accepted and ignored, as clients send it).
    ClientSetInfo,
    /// COMMAND [COUNT | INFO … | DOCS …].
    Command(CommandQuery),
    /// SELECT index: only database 0 exists.
    Select(i64),
    /// INFO [section…].
    Info,
    /// CONFIG GET pattern…: no parameter is exposed (an empty answer, as for a pattern
    /// matching none; redis-benchmark asks).
    ConfigGet,
    /// GET key.
    Get(Vec<u8>),
    /// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]; SETEX and
    /// PSETEX.
    Set {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// NX / XX.
        cond: SetCond,
        /// GET: answer with the previous value.
        get: bool,
        /// EX, PX, EXAT, PXAT or KEEPTTL.
        expiry: SetExpiry,
    },
    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT key time [NX|XX|GT|LT].
    Expire {
        /// The key.
        key: Vec<u8>,
        /// When.
        when: ExpireWhen,
        /// NX, XX, GT or LT.
        cond: phoenix_proto::ExpireCondition,
    },
    /// PERSIST key.
    Persist(Vec<u8>),
    /// EXPIRETIME / PEXPIRETIME key (`ms`: PEXPIRETIME).
    ExpireTime(Vec<u8>, bool),
    /// SETNX key value.
    SetNx(Vec<u8>, Vec<u8>),
    /// GETSET key value.
    GetSet(Vec<u8>, Vec<u8>),
    /// DEL key…
    Del(Vec<Vec<u8>>),
    /// EXISTS key…
    Exists(Vec<Vec<u8>>),
    /// MGET key…
    MGet(Vec<Vec<u8>>),
    /// MSET key value [key value …].
    MSet(Vec<(Vec<u8>, Vec<u8>)>),
    /// INCR, DECR, INCRBY, DECRBY: the amount added.
    IncrBy(Vec<u8>, i64),
    /// SCAN cursor [MATCH pattern] [COUNT n] [TYPE string].
    Scan {
        /// The cursor (0: start).
        cursor: u64,
        /// MATCH.
        pattern: Pattern,
        /// COUNT: keys to look at.
        count: usize,
    },
    /// KEYS pattern.
    Keys(Pattern),
    /// DBSIZE.
    DbSize,
    /// TTL / PTTL key (`ms`: PTTL): -2 for no key, -1 for a key without an expiry.
    Ttl(Vec<u8>, bool),
}

/// How many keys SCAN looks at when COUNT is not given (Redis's default).
pub const SCAN_COUNT_DEFAULT: usize = 10;

fn arity(name: &str) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

fn syntax() -> Reply {
    Reply::error("ERR syntax error")
}

fn not_integer() -> Reply {
    Reply::error("ERR value is not an integer or out of range")
}

fn bad_expire(name: &str) -> Reply {
    Reply::error(format!(
        "ERR invalid expire time in '{}' command",
        name.to_ascii_lowercase()
    ))
}

/// A time argument of `name` given in seconds (`unit` 1000) or ms (1): in ms, overflow
/// refused as Redis refuses it.
fn time_ms(name: &str, arg: &[u8], unit: i64) -> Result<i64, Reply> {
    let n = parse_i64(arg).ok_or_else(not_integer)?;
    n.checked_mul(unit).ok_or_else(|| bad_expire(name))
}

/// A SET-style expiry argument (EX, PX, SETEX's): a positive count of `unit` ms.
fn positive_ms(name: &str, arg: &[u8], unit: i64) -> Result<u64, Reply> {
    let ms = time_ms(name, arg, unit)?;
    if ms <= 0 {
        return Err(bad_expire(name));
    }
    Ok(ms as u64)
}

/// An argument as an i64, as Redis reads integers (no spaces, no `+`, no leading
/// zeros past a lone `0`): the rules INCR applies to values too.
pub use phoenix_proto::counter::parse_i64;

/// An argument as an error shows it: at most 128 bytes (as Redis cuts it).
fn shown_arg(a: &[u8]) -> String {
    String::from_utf8_lossy(&a[..a.len().min(128)]).into_owned()
}

fn upper(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_uppercase()
}

/// The command `args` name, checked; an error reply if it is unknown or malformed.
pub fn parse(args: Vec<Vec<u8>>) -> Result<Command, Reply> {
    let mut it = args.into_iter();
    let Some(name_raw) = it.next() else {
        return Err(Reply::error("ERR empty command"));
    };
    let name = upper(&name_raw);
    let rest: Vec<Vec<u8>> = it.collect();
    let n = rest.len();
    let exactly = |k: usize| if n == k { Ok(()) } else { Err(arity(&name)) };
    let at_least = |k: usize| if n >= k { Ok(()) } else { Err(arity(&name)) };
    let mut rest = rest.into_iter();
    let mut next = || rest.next().unwrap_or_default();
    Ok(match name.as_str() {
        "PING" => {
            if n > 1 {
                return Err(arity(&name));
            }
            Command::Ping((n == 1).then(&mut next))
        }
        "ECHO" => {
            exactly(1)?;
            Command::Echo(next())
        }
        "QUIT" => Command::Quit,
        "HELLO" => {
            let mut version = None;
            let mut auth = None;
            let mut name_opt = None;
            if n > 0 {
                let v = next();
                version = Some(match parse_i64(&v) {
                    Some(2) => 2,
                    Some(3) => 3,
                    Some(_) => {
                        return Err(Reply::error("NOPROTO unsupported protocol version"));
                    }
                    None => {
                        return Err(Reply::error(
                            "ERR Protocol version is not an integer or out of range",
                        ));
                    }
                });
                let mut left = n - 1;
                while left > 0 {
                    let opt = upper(&next());
                    left -= 1;
                    match opt.as_str() {
                        "AUTH" if left >= 2 => {
                            let user = next();
                            auth = Some((user, next()));
                            left -= 2;
                        }
                        "SETNAME" if left >= 1 => {
                            name_opt = Some(next());
                            left -= 1;
                        }
                        _ => return Err(syntax()),
                    }
                }
            }
            Command::Hello {
                version,
                auth,
                name: name_opt,
            }
        }
        "AUTH" => {
            if n == 0 {
                return Err(arity(&name));
            }
            if n > 2 {
                return Err(syntax());
            }
            let first = next();
            if n == 2 {
                Command::Auth {
                    user: Some(first),
                    password: next(),
                }
            } else {
                Command::Auth {
                    user: None,
                    password: first,
                }
            }
        }
        "CLIENT" => {
            at_least(1)?;
            let sub = upper(&next());
            match (sub.as_str(), n) {
                ("SETNAME", 2) => {
                    let v = next();
                    if v.iter().any(|c| *c <= b' ' || *c > b'~') {
                        return Err(Reply::error(
                            "ERR Client names cannot contain spaces, newlines or special characters.",
                        ));
                    }
                    Command::ClientSetName(v)
                }
                ("GETNAME", 1) => Command::ClientGetName,
                ("ID", 1) => Command::ClientId,
                ("SETINFO", 3) => Command::ClientSetInfo,
                ("SETNAME" | "GETNAME" | "ID" | "SETINFO", _) => {
                    return Err(arity(&format!("client|{}", sub.to_ascii_lowercase())));
                }
                _ => {
                    return Err(Reply::error(format!(
                        "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                        sub.to_ascii_lowercase()
                    )));
                }
            }
        }
        "COMMAND" => {
            if n == 0 {
                Command::Command(CommandQuery::All)
            } else {
                let sub = upper(&next());
                match sub.as_str() {
                    "COUNT" if n == 1 => Command::Command(CommandQuery::Count),
                    "DOCS" => Command::Command(CommandQuery::Docs),
                    "INFO" => Command::Command(CommandQuery::Info(
                        (1..n).map(|_| upper(&next())).collect(),
                    )),
                    _ => {
                        return Err(Reply::error(format!(
                            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
                            sub.to_ascii_lowercase()
                        )));
                    }
                }
            }
        }
        "SELECT" => {
            exactly(1)?;
            Command::Select(parse_i64(&next()).ok_or_else(not_integer)?)
        }
        "INFO" => Command::Info,
        "CONFIG" => {
            at_least(1)?;
            let sub = upper(&next());
            match sub.as_str() {
                "GET" if n >= 2 => Command::ConfigGet,
                "GET" => return Err(arity("config|get")),
                _ => {
                    return Err(Reply::error(format!(
                        "ERR unknown subcommand '{}'. Try CONFIG HELP.",
                        sub.to_ascii_lowercase()
                    )));
                }
            }
        }
        "GET" => {
            exactly(1)?;
            Command::Get(next())
        }
        "SET" => {
            at_least(2)?;
            let (key, value) = (next(), next());
            let mut cond = SetCond::Always;
            let mut get = false;
            let mut expiry = SetExpiry::None;
            let mut i = 2;
            while i < n {
                i += 1;
                let opt = upper(&next());
                let unset = expiry == SetExpiry::None;
                match opt.as_str() {
                    "NX" if cond == SetCond::Always => cond = SetCond::IfAbsent,
                    "XX" if cond == SetCond::Always => cond = SetCond::IfPresent,
                    "GET" => get = true,
                    "KEEPTTL" if unset => expiry = SetExpiry::Keep,
                    "EX" | "PX" | "EXAT" | "PXAT" if unset && i < n => {
                        i += 1;
                        let arg = next();
                        let unit = if opt.starts_with('E') { 1000 } else { 1 };
                        let ms = positive_ms(&name, &arg, unit)?;
                        expiry = if opt.ends_with("AT") {
                            SetExpiry::AtMs(ms)
                        } else {
                            SetExpiry::AfterMs(ms)
                        };
                    }
                    _ => return Err(syntax()),
                }
            }
            Command::Set {
                key,
                value,
                cond,
                get,
                expiry,
            }
        }
        "SETEX" | "PSETEX" => {
            exactly(3)?;
            let key = next();
            let unit = if name == "SETEX" { 1000 } else { 1 };
            let ms = positive_ms(&name, &next(), unit)?;
            Command::Set {
                key,
                value: next(),
                cond: SetCond::Always,
                get: false,
                expiry: SetExpiry::AfterMs(ms),
            }
        }
        "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" => {
            use phoenix_proto::ExpireCondition as C;
            at_least(2)?;
            let key = next();
            let unit = if name.starts_with('P') { 1 } else { 1000 };
            let ms = time_ms(&name, &next(), unit)?;
            let when = if name.ends_with("AT") {
                ExpireWhen::AtMs(ms)
            } else {
                ExpireWhen::AfterMs(ms)
            };
            let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
            for _ in 2..n {
                match upper(&next()).as_str() {
                    "NX" => nx = true,
                    "XX" => xx = true,
                    "GT" => gt = true,
                    "LT" => lt = true,
                    other => return Err(Reply::error(format!("ERR Unsupported option {other}"))),
                }
            }
            if nx && (xx || gt || lt) {
                return Err(Reply::error(
                    "ERR NX and XX, GT or LT options at the same time are not compatible",
                ));
            }
            if gt && lt {
                return Err(Reply::error(
                    "ERR GT and LT options at the same time are not compatible",
                ));
            }
            if xx && lt {
                // Earlier than an expiry the key must have: not one condition the
                // cluster applies; refused rather than served as something else.
                return Err(Reply::error("ERR XX and LT together are not supported"));
            }
            // (XX with GT is GT: no expiry counts as never, which nothing is later than.)
            let cond = if nx {
                C::ExpireIfNone
            } else if gt {
                C::ExpireIfLater
            } else if lt {
                C::ExpireIfEarlier
            } else if xx {
                C::ExpireIfSet
            } else {
                C::ExpireAlways
            };
            Command::Expire { key, when, cond }
        }
        "PERSIST" => {
            exactly(1)?;
            Command::Persist(next())
        }
        "EXPIRETIME" | "PEXPIRETIME" => {
            exactly(1)?;
            Command::ExpireTime(next(), name == "PEXPIRETIME")
        }
        "SETNX" => {
            exactly(2)?;
            Command::SetNx(next(), next())
        }
        "GETSET" => {
            exactly(2)?;
            Command::GetSet(next(), next())
        }
        "DEL" | "UNLINK" => {
            at_least(1)?;
            Command::Del((0..n).map(|_| next()).collect())
        }
        "EXISTS" => {
            at_least(1)?;
            Command::Exists((0..n).map(|_| next()).collect())
        }
        "MGET" => {
            at_least(1)?;
            Command::MGet((0..n).map(|_| next()).collect())
        }
        "MSET" => {
            if n == 0 || !n.is_multiple_of(2) {
                return Err(arity(&name));
            }
            Command::MSet((0..n / 2).map(|_| (next(), next())).collect())
        }
        "INCR" | "DECR" => {
            exactly(1)?;
            Command::IncrBy(next(), if name == "INCR" { 1 } else { -1 })
        }
        "INCRBY" | "DECRBY" => {
            exactly(2)?;
            let key = next();
            let by = parse_i64(&next()).ok_or_else(not_integer)?;
            let by = if name == "INCRBY" {
                by
            } else {
                by.checked_neg()
                    .ok_or_else(|| Reply::error("ERR decrement would overflow"))?
            };
            Command::IncrBy(key, by)
        }
        "SCAN" => {
            at_least(1)?;
            let cursor = std::str::from_utf8(&next())
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| Reply::error("ERR invalid cursor"))?;
            let mut pattern = Pattern::Prefix(Vec::new());
            let mut count = SCAN_COUNT_DEFAULT;
            let mut left = n - 1;
            while left > 0 {
                let opt = upper(&next());
                if left < 2 {
                    return Err(syntax());
                }
                let v = next();
                left -= 2;
                match opt.as_str() {
                    "MATCH" => pattern = Pattern::parse(&v)?,
                    "COUNT" => {
                        count = match parse_i64(&v) {
                            Some(c) if c >= 1 => c as usize,
                            Some(_) => return Err(syntax()),
                            None => return Err(not_integer()),
                        }
                    }
                    // Every key is a string.
                    "TYPE" if v.eq_ignore_ascii_case(b"string") => {}
                    "TYPE" => pattern = Pattern::Exact(Vec::new()),
                    _ => return Err(syntax()),
                }
            }
            Command::Scan {
                cursor,
                pattern,
                count,
            }
        }
        "KEYS" => {
            exactly(1)?;
            Command::Keys(Pattern::parse(&next())?)
        }
        "DBSIZE" => {
            exactly(0)?;
            Command::DbSize
        }
        "TTL" | "PTTL" => {
            exactly(1)?;
            Command::Ttl(next(), name == "PTTL")
        }
        _ => {
            let shown: Vec<String> = std::iter::repeat_with(&mut next)
                .take(n.min(3))
                .map(|a| format!("'{}'", shown_arg(&a)))
                .collect();
            return Err(Reply::error(format!(
                "ERR unknown command '{}', with args beginning with: {}",
                shown_arg(&name_raw),
                shown.join(" ")
            )));
        }
    })
}

/// A command as COMMAND describes it: (name, arity, flags, first key, last key, step);
/// arity counts the name, negative meaning "at least".
pub type CommandInfo = (&'static str, i64, &'static [&'static str], i64, i64, i64);

/// The commands served, as COMMAND lists them.
pub const COMMANDS: &[CommandInfo] = &[
    ("ping", -1, &["fast"], 0, 0, 0),
    ("echo", 2, &["fast"], 0, 0, 0),
    ("quit", -1, &["fast"], 0, 0, 0),
    ("hello", -1, &["fast"], 0, 0, 0),
    ("auth", -2, &["fast"], 0, 0, 0),
    ("client", -2, &[], 0, 0, 0),
    ("command", -1, &[], 0, 0, 0),
    ("select", 2, &["fast"], 0, 0, 0),
    ("info", -1, &[], 0, 0, 0),
    ("config", -2, &[], 0, 0, 0),
    ("get", 2, &["readonly", "fast"], 1, 1, 1),
    ("set", -3, &["write"], 1, 1, 1),
    ("setnx", 3, &["write", "fast"], 1, 1, 1),
    ("getset", 3, &["write", "fast"], 1, 1, 1),
    ("del", -2, &["write"], 1, -1, 1),
    ("unlink", -2, &["write", "fast"], 1, -1, 1),
    ("exists", -2, &["readonly", "fast"], 1, -1, 1),
    ("mget", -2, &["readonly", "fast"], 1, -1, 1),
    ("mset", -3, &["write"], 1, -1, 2),
    ("incr", 2, &["write", "fast"], 1, 1, 1),
    ("decr", 2, &["write", "fast"], 1, 1, 1),
    ("incrby", 3, &["write", "fast"], 1, 1, 1),
    ("decrby", 3, &["write", "fast"], 1, 1, 1),
    ("scan", -2, &["readonly"], 0, 0, 0),
    ("keys", 2, &["readonly"], 0, 0, 0),
    ("dbsize", 1, &["readonly", "fast"], 0, 0, 0),
    ("ttl", 2, &["readonly", "fast"], 1, 1, 1),
    ("pttl", 2, &["readonly", "fast"], 1, 1, 1),
    ("setex", 4, &["write"], 1, 1, 1),
    ("psetex", 4, &["write"], 1, 1, 1),
    ("expire", -3, &["write", "fast"], 1, 1, 1),
    ("pexpire", -3, &["write", "fast"], 1, 1, 1),
    ("expireat", -3, &["write", "fast"], 1, 1, 1),
    ("pexpireat", -3, &["write", "fast"], 1, 1, 1),
    ("persist", 2, &["write", "fast"], 1, 1, 1),
    ("expiretime", 2, &["readonly", "fast"], 1, 1, 1),
    ("pexpiretime", 2, &["readonly", "fast"], 1, 1, 1),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(s: &str) -> Result<Command, Reply> {
        parse(s.split(' ').map(|a| a.as_bytes().to_vec()).collect())
    }

    fn err_text(r: Result<Command, Reply>) -> String {
        match r {
            Err(Reply::Error(e)) => e,
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn commands_are_checked_for_arity_and_options() {
        assert_eq!(
            cmd("set k v NX get").unwrap(),
            Command::Set {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                cond: SetCond::IfAbsent,
                get: true,
                expiry: SetExpiry::None,
            }
        );
        assert_eq!(err_text(cmd("set k v NX XX")), "ERR syntax error");
        assert_eq!(cmd("config get save").unwrap(), Command::ConfigGet);
        assert!(err_text(cmd("config set save x")).starts_with("ERR unknown subcommand"));
        assert!(matches!(
            cmd("set k v EX 10"),
            Ok(Command::Set {
                expiry: SetExpiry::AfterMs(10_000),
                ..
            })
        ));
        assert!(matches!(
            cmd("set k v pxat 5 nx"),
            Ok(Command::Set {
                expiry: SetExpiry::AtMs(5),
                cond: SetCond::IfAbsent,
                ..
            })
        ));
        assert!(err_text(cmd("set k v EX 0")).contains("invalid expire time in 'set'"));
        assert!(err_text(cmd("set k v EX 1 PX 1")).contains("syntax"));
        assert!(err_text(cmd("set k v KEEPTTL EX 1")).contains("syntax"));
        assert!(err_text(cmd("set k v EX")).contains("syntax"));
        assert!(err_text(cmd("set k v EX x")).contains("not an integer"));
        assert!(err_text(cmd("set k v EX 9223372036854775807")).contains("invalid expire time"));
        assert!(err_text(cmd("setex k 0 v")).contains("invalid expire time in 'setex'"));
        assert!(matches!(
            cmd("expire k -5 GT"),
            Ok(Command::Expire {
                when: ExpireWhen::AfterMs(-5000),
                cond: phoenix_proto::ExpireCondition::ExpireIfLater,
                ..
            })
        ));
        assert!(err_text(cmd("expire k 5 NX XX")).contains("not compatible"));
        assert!(err_text(cmd("expire k 5 GT LT")).contains("not compatible"));
        assert!(err_text(cmd("expire k 5 FOO")).contains("Unsupported option"));
        assert_eq!(
            err_text(cmd("get")),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(
            err_text(cmd("get a b")),
            "ERR wrong number of arguments for 'get' command"
        );
        assert_eq!(
            err_text(cmd("mset a 1 b")),
            "ERR wrong number of arguments for 'mset' command"
        );
        assert_eq!(
            cmd("decrby k 5").unwrap(),
            Command::IncrBy(b"k".to_vec(), -5)
        );
        assert_eq!(
            err_text(cmd("incrby k 1.5")),
            "ERR value is not an integer or out of range"
        );
        assert!(err_text(cmd("decrby k -9223372036854775808")).contains("overflow"));
        assert_eq!(
            err_text(cmd("frob a b c d")),
            "ERR unknown command 'frob', with args beginning with: 'a' 'b' 'c'"
        );
        assert_eq!(
            cmd("scan 0 match user:* count 100").unwrap(),
            Command::Scan {
                cursor: 0,
                pattern: Pattern::Prefix(b"user:".to_vec()),
                count: 100
            }
        );
        assert!(err_text(cmd("scan 0 match u?er*")).contains("prefix*"));
        assert_eq!(err_text(cmd("scan x")), "ERR invalid cursor");
        assert_eq!(err_text(cmd("scan 0 count 0")), "ERR syntax error");
        assert_eq!(
            cmd("keys k1").unwrap(),
            Command::Keys(Pattern::Exact(b"k1".to_vec()))
        );
        assert_eq!(
            err_text(cmd("hello 4")),
            "NOPROTO unsupported protocol version"
        );
        assert!(matches!(
            cmd("hello 3 setname x").unwrap(),
            Command::Hello {
                version: Some(3),
                ..
            }
        ));
    }

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        for (s, v) in [
            ("0", Some(0)),
            ("-12", Some(-12)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("+1", None),
            ("01", None),
            ("-0", None),
            (" 1", None),
            ("", None),
            ("1e3", None),
        ] {
            assert_eq!(parse_i64(s.as_bytes()), v, "{s:?}");
        }
    }
}
