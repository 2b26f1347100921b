//! The request parser against random input (a seeded fuzz run; `PHOENIX_SEED` replays
//! one, and a failure prints its seed):
//! - any bytes: an answer (a request, "need more", or an error), never a panic, and a
//!   request never claims more bytes than it was given;
//! - a pipeline of random well-formed requests (RESP arrays with binary arguments, and
//!   inline commands), cut into random pieces as a socket delivers them: the same
//!   requests come out, in order, whatever the cuts;
//! - a well-formed request with random bytes changed: never a panic, and the same
//!   answer from any prefix that holds what the whole input frames.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::encode;
use phoenix_resp::codec::parse_request;
use phoenix_resp::Limits;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn seed() -> u64 {
    std::env::var("PHOENIX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen())
}

fn limits() -> Limits {
    // Small limits, so random input reaches them too.
    Limits {
        max_args: 16,
        max_bulk: 64,
        max_inline: 128,
        max_request: 512,
    }
}

/// Random arguments within `limits()`; `inline`: plain words only.
fn random_args(rng: &mut ChaCha8Rng, inline: bool) -> Vec<Vec<u8>> {
    let n = rng.gen_range(1..=if inline { 4 } else { 8 });
    (0..n)
        .map(|_| {
            let len = rng.gen_range(if inline { 1 } else { 0 }..=12);
            (0..len)
                .map(|_| {
                    if inline {
                        rng.gen_range(b'a'..=b'z')
                    } else {
                        rng.gen()
                    }
                })
                .collect()
        })
        .collect()
}

/// Parses `stream` as a socket would deliver it in `pieces`: whatever has arrived is
/// parsed until it needs more, then the next piece is added.
fn parse_in_pieces(stream: &[u8], cuts: &[usize]) -> Result<Vec<Vec<Vec<u8>>>, String> {
    let l = limits();
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        buf.extend_from_slice(&stream[from..cut]);
        from = cut;
        loop {
            match parse_request(&buf, &l) {
                Ok(Some((args, used))) => {
                    assert!(
                        used > 0 && used <= buf.len(),
                        "used {used} of {}",
                        buf.len()
                    );
                    out.push(args);
                    buf.drain(..used);
                }
                Ok(None) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    if !buf.is_empty() {
        return Err(format!("{} bytes left unframed", buf.len()));
    }
    Ok(out)
}

#[test]
fn the_parser_survives_random_input_and_frames_pipelines_whatever_the_cuts() {
    let seed = seed();
    // (Printed first: a panic inside the parser would not reach the asserts below.)
    eprintln!("replay with PHOENIX_SEED={seed}");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let l = limits();
    let ctx = |what: &str, round: usize| {
        format!("seed {seed} (replay with PHOENIX_SEED={seed}), {what}, round {round}")
    };
    // Any bytes.
    for round in 0..20_000 {
        let len = rng.gen_range(0..96);
        let mut input: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if rng.gen_bool(0.5) {
            // Mostly framing characters, to get past the first checks.
            for b in input.iter_mut() {
                *b = *[
                    b'*', b'$', b'\r', b'\n', b'1', b'2', b'-', b'0', b'"', b'\'', b'\\', b' ',
                    b'x',
                ]
                .get(rng.gen_range(0..13))
                .unwrap();
            }
        }
        if let Ok(Some((_, used))) = parse_request(&input, &l) {
            assert!(
                used > 0 && used <= input.len(),
                "{}",
                ctx("random bytes", round)
            );
        }
    }
    // Pipelines of well-formed requests, cut anywhere.
    for round in 0..2_000 {
        let mut stream = Vec::new();
        let mut want = Vec::new();
        for _ in 0..rng.gen_range(1..6) {
            if rng.gen_bool(0.2) {
                let args = random_args(&mut rng, true);
                let words: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                stream.extend_from_slice(&words.join(&b' '));
                stream.extend_from_slice(b"\r\n");
                want.push(args);
            } else {
                let args = random_args(&mut rng, false);
                stream.extend_from_slice(&encode(&args));
                want.push(args);
            }
        }
        let mut cuts: Vec<usize> = (0..rng.gen_range(0..6))
            .map(|_| rng.gen_range(0..=stream.len()))
            .collect();
        cuts.sort_unstable();
        let got = parse_in_pieces(&stream, &cuts);
        assert_eq!(
            got.as_ref(),
            Ok(&want),
            "{} cuts {cuts:?}",
            ctx("pipeline", round)
        );
    }
    // Well-formed requests with bytes changed: an answer, never a panic, and the same
    // answer whatever part of the input has arrived: a request framed from the whole is
    // framed the same from any prefix that holds it, and a shorter prefix needs more;
    // no prefix of refused input frames a request.
    for round in 0..5_000 {
        let mut req = encode(&random_args(&mut rng, false));
        for _ in 0..rng.gen_range(1..4) {
            let i = rng.gen_range(0..req.len());
            req[i] = rng.gen();
        }
        let whole = parse_request(&req, &l);
        let cut = rng.gen_range(0..=req.len());
        let part = parse_request(&req[..cut], &l);
        let what = ctx("a changed request", round);
        match &whole {
            Ok(Some((args, n))) if cut >= *n => {
                assert_eq!(
                    part.as_ref(),
                    Ok(&Some((args.clone(), *n))),
                    "{what}, cut {cut}"
                )
            }
            Ok(Some(_)) | Ok(None) => {
                assert!(matches!(part, Ok(None)), "{what}, cut {cut}: {part:?}")
            }
            Err(_) => assert!(!matches!(part, Ok(Some(_))), "{what}, cut {cut}: {part:?}"),
        }
    }
}

#[test]
fn quoted_inline_arguments_split_as_redis_cli_does() {
    let l = limits();
    let parse = |s: &[u8]| parse_request(s, &l).map(|r| r.map(|(a, _)| a));
    let words = |w: &[&[u8]]| Some(w.iter().map(|x| x.to_vec()).collect::<Vec<_>>());
    assert_eq!(
        parse(b"SET k \"a\\qb\\xZZ\"\r\n").unwrap(),
        words(&[b"SET", b"k", b"aqbxZZ"])
    );
    assert_eq!(
        parse(b"SET k 'a\\b'\r\n").unwrap(),
        words(&[b"SET", b"k", b"a\\b"])
    );
    assert_eq!(
        parse(b"SET k \"\"\r\n").unwrap(),
        words(&[b"SET", b"k", b""])
    );
    // Every escape in double quotes (a one-digit \x is no escape), \' in single quotes.
    assert_eq!(
        parse(b"X \"\\x41\\x4\\n\\r\\t\\b\\a\\\\\\\"\" 'it\\'s'\r\n").unwrap(),
        words(&[b"X", b"Ax4\n\r\t\x08\x07\\\"", b"it's"])
    );
    for bad in [
        &b"SET k \"abc\r\n"[..],
        b"SET k \"a\"b\r\n",
        b"SET k 'a\r\n",
        b"SET k \"\\\r\n",
        b"SET k 'a'b\r\n",
    ] {
        assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
}
