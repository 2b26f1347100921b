//! The Redis front end against a model of Redis's own semantics: random pipelined
//! commands (binary keys, integers and not, keys given twice, MSET across groups) sent
//! over a connection to a [`MemoryStore`] cut into groups, each reply compared with
//! the model's. Then garbage: answered with an error and the connection closed, the
//! data unharmed. `PHOENIX_SEED` replays a run (a failure prints its seed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

mod common;

use common::{encode, pipeline, R};
use phoenix_resp::{Conn, Limits, MemoryStore, ServerInfo};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// Redis's semantics over a map, and where the groups split (for MSET).
struct Model {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    split: Vec<u8>,
}

fn ok() -> R {
    R::Simple("OK".into())
}

fn int_of(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?;
    let d = s.strip_prefix('-').unwrap_or(s);
    if s.starts_with('+') || d.is_empty() || (d.len() > 1 && d.starts_with('0')) || s == "-0" {
        return None;
    }
    s.parse().ok()
}

impl Model {
    fn apply(&mut self, args: &[Vec<u8>]) -> R {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let a = &args[1..];
        match name.as_str() {
            "GET" => R::Bulk(self.map.get(&a[0]).cloned()),
            "SET" => {
                let opts: Vec<String> = a[2..]
                    .iter()
                    .map(|o| String::from_utf8_lossy(o).to_ascii_uppercase())
                    .collect();
                let prev = self.map.get(&a[0]).cloned();
                let get = opts.iter().any(|o| o == "GET");
                let allowed = if opts.iter().any(|o| o == "NX") {
                    prev.is_none()
                } else if opts.iter().any(|o| o == "XX") {
                    prev.is_some()
                } else {
                    true
                };
                if allowed {
                    self.map.insert(a[0].clone(), a[1].clone());
                }
                match (get, allowed) {
                    (true, _) => R::Bulk(prev),
                    (false, true) => ok(),
                    (false, false) => R::Bulk(None),
                }
            }
            "SETNX" => {
                if self.map.contains_key(&a[0]) {
                    R::Int(0)
                } else {
                    self.map.insert(a[0].clone(), a[1].clone());
                    R::Int(1)
                }
            }
            "GETSET" => R::Bulk(self.map.insert(a[0].clone(), a[1].clone())),
            "DEL" => {
                let mut n = 0;
                for k in a {
                    n += i64::from(self.map.remove(k).is_some());
                }
                R::Int(n)
            }
            "EXISTS" => R::Int(a.iter().filter(|k| self.map.contains_key(*k)).count() as i64),
            "MGET" => R::Array(Some(
                a.iter()
                    .map(|k| R::Bulk(self.map.get(k).cloned()))
                    .collect(),
            )),
            "MSET" => {
                let left = a.iter().step_by(2).any(|k| *k < self.split);
                let right = a.iter().step_by(2).any(|k| *k >= self.split);
                if left && right {
                    return R::Error("CROSSSLOT".into());
                }
                for p in a.chunks(2) {
                    self.map.insert(p[0].clone(), p[1].clone());
                }
                ok()
            }
            "INCRBY" | "DECRBY" | "INCR" | "DECR" => {
                let by: i64 = match name.as_str() {
                    "INCR" => 1,
                    "DECR" => -1,
                    "INCRBY" => int_of(&a[1]).unwrap(),
                    _ => -int_of(&a[1]).unwrap(),
                };
                let cur = match self.map.get(&a[0]) {
                    None => 0,
                    Some(v) => match int_of(v) {
                        Some(n) => n,
                        None => {
                            return R::Error("ERR value is not an integer or out of range".into())
                        }
                    },
                };
                match cur.checked_add(by) {
                    Some(n) => {
                        self.map.insert(a[0].clone(), n.to_string().into_bytes());
                        R::Int(n)
                    }
                    None => R::Error("ERR increment or decrement would overflow".into()),
                }
            }
            "KEYS" => {
                let p = &a[0][..a[0].len() - 1];
                R::Array(Some(
                    self.map
                        .keys()
                        .filter(|k| k.starts_with(p))
                        .map(|k| R::Bulk(Some(k.clone())))
                        .collect(),
                ))
            }
            "DBSIZE" => R::Int(self.map.len() as i64),
            "TTL" => R::Int(if self.map.contains_key(&a[0]) { -1 } else { -2 }),
            "PING" => R::Simple("PONG".into()),
            other => panic!("model lacks {other}"),
        }
    }
}

/// A random command over a few keys that collide often.
fn random_command(rng: &mut ChaCha8Rng) -> Vec<Vec<u8>> {
    let keys: [&[u8]; 6] = [b"a", b"b\r\n", b"k\x00z", b"n", b"zz", b"\xff"];
    let key = |rng: &mut ChaCha8Rng| keys[rng.gen_range(0..keys.len())].to_vec();
    let value = |rng: &mut ChaCha8Rng| -> Vec<u8> {
        match rng.gen_range(0..5) {
            0 => rng.gen_range(-5i64..5).to_string().into_bytes(),
            1 => i64::MAX.to_string().into_bytes(),
            2 => b"007".to_vec(),
            3 => vec![b'v'; rng.gen_range(0..64)],
            _ => (0..rng.gen_range(0..16)).map(|_| rng.gen()).collect(),
        }
    };
    let v = |s: &str| s.as_bytes().to_vec();
    match rng.gen_range(0..15) {
        0 => vec![v("GET"), key(rng)],
        1 => vec![v("SET"), key(rng), value(rng)],
        2 => {
            let mut c = vec![v("set"), key(rng), value(rng)];
            match rng.gen_range(0..3) {
                0 => c.push(v("NX")),
                1 => c.push(v("xx")),
                _ => {}
            }
            if rng.gen_bool(0.5) {
                c.push(v("GET"));
            }
            c
        }
        3 => vec![v("SETNX"), key(rng), value(rng)],
        4 => vec![v("GETSET"), key(rng), value(rng)],
        5 => {
            let mut c = vec![v("DEL")];
            c.extend((0..rng.gen_range(1..4)).map(|_| key(rng)));
            c
        }
        6 => {
            let mut c = vec![v("EXISTS")];
            c.extend((0..rng.gen_range(1..4)).map(|_| key(rng)));
            c
        }
        7 => {
            let mut c = vec![v("MGET")];
            c.extend((0..rng.gen_range(1..4)).map(|_| key(rng)));
            c
        }
        8 => {
            let mut c = vec![v("MSET")];
            for _ in 0..rng.gen_range(1..3) {
                c.push(key(rng));
                c.push(value(rng));
            }
            c
        }
        9 => vec![v("INCR"), key(rng)],
        10 => vec![
            v("DECRBY"),
            key(rng),
            rng.gen_range(-3i64..3).to_string().into_bytes(),
        ],
        11 => vec![v("INCRBY"), key(rng), v("9223372036854775807")],
        12 => vec![v("KEYS"), [&key(rng)[..1], b"*"].concat()],
        13 => vec![v("DBSIZE")],
        _ => vec![v("TTL"), key(rng)],
    }
}

fn seed() -> u64 {
    std::env::var("PHOENIX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen())
}

async fn connect(store: &MemoryStore) -> DuplexStream {
    let (client, server) = tokio::io::duplex(1 << 16);
    let mut conn = Conn::new(
        Arc::new(store.clone()),
        Limits::default(),
        Arc::new(ServerInfo::default()),
    );
    tokio::spawn(async move {
        let _ = conn.serve(server).await;
    });
    client
}

#[tokio::test]
async fn pipelined_commands_answer_as_redis_would() {
    pipelined_against_the_model(MemoryStore::with_split_keys(vec![b"m".to_vec()])).await;
}

/// As above on a store that does not serve increments (a cluster with an older node):
/// INCR and its kin answer the same through their compare-and-swap fallback.
#[tokio::test]
async fn increments_fall_back_to_swaps_where_not_served() {
    pipelined_against_the_model(MemoryStore::with_split_keys(vec![b"m".to_vec()]).without_incr())
        .await;
}

async fn pipelined_against_the_model(store: MemoryStore) {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let split = b"m".to_vec();
    let mut model = Model {
        map: BTreeMap::new(),
        split,
    };
    let mut io = connect(&store).await;
    for round in 0..300 {
        let reqs: Vec<Vec<Vec<u8>>> = (0..rng.gen_range(1..20))
            .map(|_| random_command(&mut rng))
            .collect();
        let got = pipeline(&mut io, &reqs).await;
        for (req, got) in reqs.iter().zip(got) {
            let want = model.apply(req);
            let same = match (&want, &got) {
                // The model names the error's code; the front end says more.
                (R::Error(w), R::Error(g)) => g.starts_with(w.as_str()),
                _ => want == got,
            };
            assert!(
                same,
                "seed {seed} (replay with PHOENIX_SEED={seed}), round {round}: {:?}\nwant {want:?}\ngot  {got:?}",
                req.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>()
            );
        }
    }
}

#[tokio::test]
async fn inline_commands_resp3_and_connection_commands_work() {
    let store = MemoryStore::default();
    let mut io = connect(&store).await;
    io.write_all(b"SET k \"a b\"\r\nGET k\r\nPING\r\nECHO hi\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 256];
    let mut got = Vec::new();
    while !got.ends_with(b"$2\r\nhi\r\n") {
        let n = io.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"+OK\r\n$3\r\na b\r\n+PONG\r\n$2\r\nhi\r\n");
    // RESP3 after HELLO 3: a map, then nulls as `_`.
    io.write_all(&encode(&[b"HELLO".to_vec(), b"3".to_vec()]))
        .await
        .unwrap();
    io.write_all(&encode(&[b"GET".to_vec(), b"missing".to_vec()]))
        .await
        .unwrap();
    let mut got = Vec::new();
    while !got.ends_with(b"_\r\n") {
        let n = io.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"%7\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // Unknown commands and wrong arity are errors; the connection goes on.
    let replies = pipeline(
        &mut io,
        &[
            vec![b"FLUSHALL".to_vec()],
            vec![b"GET".to_vec()],
            vec![
                b"SET".to_vec(),
                b"k2".to_vec(),
                b"v".to_vec(),
                b"EX".to_vec(),
                b"100".to_vec(),
            ],
            vec![b"CLIENT".to_vec(), b"SETNAME".to_vec(), b"me".to_vec()],
            vec![b"CLIENT".to_vec(), b"GETNAME".to_vec()],
            vec![b"SELECT".to_vec(), b"1".to_vec()],
        ],
    )
    .await;
    let err = |r: &R, s: &str| matches!(r, R::Error(e) if e.starts_with(s));
    assert!(
        err(&replies[0], "ERR unknown command 'FLUSHALL'"),
        "{replies:?}"
    );
    assert!(
        err(&replies[1], "ERR wrong number of arguments for 'get'"),
        "{replies:?}"
    );
    assert_eq!(replies[2], R::Simple("OK".into()), "{replies:?}");
    assert_eq!(replies[3], R::Simple("OK".into()));
    assert_eq!(replies[4], R::Bulk(Some(b"me".to_vec())));
    assert!(
        err(&replies[5], "ERR DB index is out of range"),
        "{replies:?}"
    );
    // An HTTP request (a browser made to post here): closed without a word, nothing run.
    let mut web = connect(&store).await;
    web.write_all(b"POST / HTTP/1.1\r\nHost: localhost:6379\r\n\r\nSET k evil\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    loop {
        let n = web.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let r = pipeline(&mut io, &[vec![b"GET".to_vec(), b"k".to_vec()]]).await;
    assert_eq!(r[0], R::Bulk(Some(b"a b".to_vec())));
    // An unknown command's arguments are cut in its error.
    let r = pipeline(&mut io, &[vec![b"NOPE".to_vec(), vec![b'x'; 10_000]]]).await;
    assert!(matches!(&r[0], R::Error(e) if e.len() < 300), "{r:?}");
    // QUIT: OK, then closed.
    io.write_all(b"QUIT\r\n").await.unwrap();
    let mut got = Vec::new();
    loop {
        let n = io.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"+OK\r\n");
}

/// SCAN pages through a prefix with cursors; every key is seen once.
/// The expiry commands as Redis answers them: SET's EX/PX/EXAT/PXAT/KEEPTTL, SETEX,
/// PSETEX, EXPIRE and kin with NX/XX/GT/LT, PERSIST, TTL, PTTL, EXPIRETIME; an expired
/// key is gone for GET, EXISTS, MGET, DBSIZE and KEYS; INCR keeps the expiry, SET and
/// GETSET remove it.
#[tokio::test]
async fn keys_expire_as_redis_expires_them() {
    let store = MemoryStore::with_split_keys(vec![b"m".to_vec()]);
    let mut io = connect(&store).await;
    let c = |s: &str| -> Vec<Vec<u8>> { s.split(' ').map(|a| a.as_bytes().to_vec()).collect() };
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let replies = pipeline(
        &mut io,
        &[
            c("SET a 1 EX 100"),
            c("TTL a"),
            c("EXPIRE a 10 GT"),
            c("EXPIRE a 200 GT"),
            c("TTL a"),
            c("EXPIRE a 50 NX"),
            c("EXPIRE a 50 XX"),
            c("TTL a"),
            c("INCR a"),
            c("TTL a"),
            c("SET a 5 KEEPTTL"),
            c("TTL a"),
            c("PERSIST a"),
            c("PERSIST a"),
            c("TTL a"),
            c("TTL missing"),
            c("PTTL missing"),
            c("EXPIRE missing 10"),
            c("EXPIRE a 10 LT"),
            c("EXPIRETIME a"),
            c("SET a 6"),
            c("TTL a"),
            c(&format!("SET e x EXAT {}", now_s + 1000)),
            c("EXPIRETIME e"),
            c("GETSET e y"),
            c("TTL e"),
            c("SET n 1 PX 100000 NX"),
            c("SET n 2 PX 100000 NX"),
            c("PSETEX p 100000 v"),
            c("SETEX s 100 v"),
            c("EXPIRE s 0"),
            c("EXISTS s"),
            c("EXPIREAT p 1"),
            c("GET p"),
            c("SETEX short 1 v"),
            c("PSETEX shorter 300 v"),
        ],
    )
    .await;
    let want = [
        ok(),
        R::Int(100),
        R::Int(0),
        R::Int(1),
        R::Int(200),
        R::Int(0),
        R::Int(1),
        R::Int(50),
        R::Int(2),
        R::Int(50),
        ok(),
        R::Int(50),
        R::Int(1),
        R::Int(0),
        R::Int(-1),
        R::Int(-2),
        R::Int(-2),
        R::Int(0),
        R::Int(1),
    ];
    assert_eq!(&replies[..want.len()], &want[..], "{replies:?}");
    let R::Int(t) = replies[19] else {
        panic!("{replies:?}");
    };
    assert!((now_s as i64 + 9..=now_s as i64 + 11).contains(&t), "{t}");
    assert_eq!(replies[20], ok());
    assert_eq!(replies[21], R::Int(-1), "SET removes the expiry");
    assert_eq!(replies[22], ok());
    assert_eq!(replies[23], R::Int(now_s as i64 + 1000), "{replies:?}");
    assert_eq!(replies[24], R::Bulk(Some(b"x".to_vec())));
    assert_eq!(replies[25], R::Int(-1), "GETSET removes the expiry");
    assert_eq!(replies[26], ok());
    assert_eq!(replies[27], R::Bulk(None));
    assert_eq!(replies[28], ok());
    assert_eq!(replies[29], ok());
    assert_eq!(replies[30], R::Int(1), "EXPIRE 0 deletes");
    assert_eq!(replies[31], R::Int(0));
    assert_eq!(replies[32], R::Int(1), "EXPIREAT in the past deletes");
    assert_eq!(replies[33], R::Bulk(None));
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let replies = pipeline(
        &mut io,
        &[
            c("GET short"),
            c("EXISTS short shorter a"),
            c("MGET short a"),
            c("TTL short"),
            c("KEYS *"),
            c("DBSIZE"),
            c("PERSIST short"),
        ],
    )
    .await;
    assert_eq!(replies[0], R::Bulk(None), "{replies:?}");
    assert_eq!(replies[1], R::Int(1));
    assert_eq!(
        replies[2],
        R::Array(Some(vec![R::Bulk(None), R::Bulk(Some(b"6".to_vec()))]))
    );
    assert_eq!(replies[3], R::Int(-2));
    let R::Array(Some(keys)) = &replies[4] else {
        panic!("{replies:?}");
    };
    let mut keys: Vec<R> = keys.clone();
    keys.sort_by_key(|k| match k {
        R::Bulk(Some(b)) => b.clone(),
        _ => Vec::new(),
    });
    assert_eq!(
        keys,
        vec![
            R::Bulk(Some(b"a".to_vec())),
            R::Bulk(Some(b"e".to_vec())),
            R::Bulk(Some(b"n".to_vec())),
        ]
    );
    assert_eq!(replies[5], R::Int(3));
    assert_eq!(replies[6], R::Int(0));
}

#[tokio::test]
async fn scan_pages_through_a_prefix() {
    let store = MemoryStore::default();
    let mut io = connect(&store).await;
    let mut sets = Vec::new();
    for i in 0..95 {
        sets.push(vec![
            b"SET".to_vec(),
            format!("user:{i:03}").into_bytes(),
            b"x".to_vec(),
        ]);
        sets.push(vec![
            b"SET".to_vec(),
            format!("other:{i:03}").into_bytes(),
            b"x".to_vec(),
        ]);
    }
    pipeline(&mut io, &sets).await;
    let mut cursor = b"0".to_vec();
    let mut seen = Vec::new();
    let mut steps = 0;
    loop {
        let r = pipeline(
            &mut io,
            &[vec![
                b"SCAN".to_vec(),
                cursor.clone(),
                b"MATCH".to_vec(),
                b"user:*".to_vec(),
                b"COUNT".to_vec(),
                b"10".to_vec(),
            ]],
        )
        .await;
        let R::Array(Some(parts)) = &r[0] else {
            panic!("{r:?}")
        };
        let (R::Bulk(Some(next)), R::Array(Some(keys))) = (&parts[0], &parts[1]) else {
            panic!("{r:?}")
        };
        for k in keys {
            let R::Bulk(Some(k)) = k else { panic!() };
            seen.push(String::from_utf8(k.clone()).unwrap());
        }
        steps += 1;
        if next == b"0" {
            break;
        }
        cursor = next.clone();
    }
    let want: Vec<String> = (0..95).map(|i| format!("user:{i:03}")).collect();
    assert_eq!(seen, want);
    assert_eq!(steps, 10);
    let r = pipeline(&mut io, &[vec![b"SCAN".to_vec(), b"77777777".to_vec()]]).await;
    assert!(
        matches!(&r[0], R::Error(e) if e == "ERR invalid cursor"),
        "{r:?}"
    );
    // A cursor is its connection's: another connection is told it is invalid, and the
    // connection that has it may send it again (an answer lost).
    let first = pipeline(&mut io, &[vec![b"SCAN".to_vec(), b"0".to_vec()]]).await;
    let R::Array(Some(parts)) = &first[0] else {
        panic!("{first:?}")
    };
    let R::Bulk(Some(cursor)) = &parts[0] else {
        panic!("{first:?}")
    };
    let mut other = connect(&store).await;
    let r = pipeline(&mut other, &[vec![b"SCAN".to_vec(), cursor.clone()]]).await;
    assert!(
        matches!(&r[0], R::Error(e) if e == "ERR invalid cursor"),
        "{r:?}"
    );
    let again = [vec![b"SCAN".to_vec(), cursor.clone()]];
    let (a, b) = (
        pipeline(&mut io, &again).await,
        pipeline(&mut io, &again).await,
    );
    // The same keys (the cursor to go on with is a new one).
    let keys = |r: &[R]| match &r[0] {
        R::Array(Some(parts)) => parts[1].clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(keys(&a), keys(&b));
}

/// Garbage after good requests: the good ones are answered, then a protocol error,
/// and the connection is closed; the data is unharmed for the next connection.
#[tokio::test]
async fn garbage_gets_an_error_and_the_connection_closed() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let store = MemoryStore::default();
    let mut io = connect(&store).await;
    pipeline(
        &mut io,
        &[vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()]],
    )
    .await;
    for case in 0..50 {
        let mut io = connect(&store).await;
        let mut junk: Vec<u8> = match case % 3 {
            0 => b"*2\r\n$3\r\nGET\r\n$99999999999\r\n".to_vec(),
            1 => b"*1\r\n:1\r\n".to_vec(),
            _ => [
                b"*".to_vec(),
                (0..rng.gen_range(1..64)).map(|_| rng.gen()).collect(),
            ]
            .concat(),
        };
        junk.extend_from_slice(b"\r\n*1\r\n$4\r\nPING\r\n");
        io.write_all(&junk).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        let closed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                let n = io.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        let text = String::from_utf8_lossy(&got).into_owned();
        // Random bytes may frame a request or ask for more: only a protocol error
        // must close.
        if text.contains("-ERR Protocol error") {
            assert!(
                closed.is_ok(),
                "seed {seed} case {case}: not closed after {text:?}"
            );
        } else {
            assert!(
                closed.is_err() || !text.is_empty(),
                "seed {seed} case {case}: closed without a word"
            );
        }
    }
    let mut io = connect(&store).await;
    let r = pipeline(&mut io, &[vec![b"GET".to_vec(), b"k".to_vec()]]).await;
    assert_eq!(r[0], R::Bulk(Some(b"v".to_vec())));
}
