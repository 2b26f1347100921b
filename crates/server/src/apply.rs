//! The apply stage of one group: turns committed `KvCommand` entries into engine writes
//! plus the group's applied-index sentinel (seed 000: the log is the WAL, so the
//! sentinel must name exactly the entries whose writes the engine holds).
//!
//! [`Applier`] collects one round's entries into one write batch; compare-and-swap reads
//! see the round's earlier writes (puts, deletes and range deletions) through an overlay,
//! so nothing is written to the engine before the round's batch, which carries the
//! sentinel of its last entry. It reads the engine through [`StateReader`] and writes
//! through [`StateWriter`], so its crash behaviour is tested without a node.
//!
//! Exactly-once writes: a command may carry its client's session (client id, sequence
//! number, "every write below this has its answer", the leader's clock). Per client the
//! group keeps a [`Session`] record in its system keys, written in the same batch as the
//! data: a low-water sequence and the results of the writes at or above it. A write whose
//! sequence has a result is not applied again: it gets that result. One below the
//! low-water mark gets `SessionExpired`. The results are kept by sequence, not as "the
//! last one", so the record stays right if entries are applied out of order later
//! (ParallelRaft). At most [`SESSION_RESULTS_MAX`] results per client.
//!
//! Sessions expire by log time: every command of a session carries its leader's clock,
//! and once a group's log time has moved [`SESSION_SWEEP_INTERVAL_MS`] past its last
//! sweep, the next session command sweeps first (at that entry, so every replica sweeps
//! at the same point whatever its apply rounds): a record idle (by its own `last_ms`)
//! for over [`SESSION_IDLE_EXPIRY_MS`] drops its results and raises its low-water mark
//! past them, so a resend of one of them gets `SessionExpired`; one idle for twice that
//! is deleted. A client's resend comes within its request's deadline (at most
//! `limits::TIMEOUT_MS_MAX`, ten minutes), far inside the hour a record is kept. The
//! clock assumption, written down: the leaders' clocks agree within about 50 minutes. A
//! leader whose clock runs more than that behind or ahead makes records look idle too
//! early; past 50 minutes a resend gets `SessionExpired` (refused, safe), past 1 h 50 min
//! its record may be gone and the resend applied again.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use phoenix_engine::{ReadOptions, WriteBatch, WriteOptions};
use phoenix_proto as proto;
use prost::Message as _;

use crate::keys;

/// What a committed command produced, for the proposer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyResult {
    /// Applied.
    Done,
    /// Compare-and-swap outcome and the value before it.
    Cas {
        /// Whether the condition held and the write happened.
        succeeded: bool,
        /// The value before, if any.
        current: Option<Vec<u8>>,
    },
    /// An increment's outcome: the key's new value, or why it stayed as it was.
    Incr(Result<i64, proto::IncrFailure>),
    /// An expiry change's outcome: whether it changed the key (false: the key is absent,
    /// or the condition did not hold, or there was no expiry to remove).
    Expire(bool),
    /// The state machine refused the command (meta commands).
    Refused(String),
    /// The command was checked against another range epoch than the group's (a split
    /// came between), or names a key outside the group's range: not applied.
    StaleEpoch {
        /// The epoch the command was checked against (0: none).
        request_epoch: u64,
    },
    /// A split command: applied by the node (`node.rs`), not by the round.
    Split(proto::SplitCommand),
    /// A scrub point: the node writes the round up to it and checksums the group's
    /// data there (`node.rs`, scrub.rs); the state does not change.
    Scrub,
    /// A merge's prepare (in its source): applied by the node.
    PrepareMerge(proto::PrepareMergeCommand),
    /// A merge's commit (in its target): applied by the node.
    CommitMerge(proto::CommitMergeCommand),
    /// A merge's rollback (in its source): applied by the node.
    RollbackMerge(proto::RollbackMergeCommand),
    /// A resent write whose first result is forgotten: it may or may not have applied.
    SessionExpired {
        /// The client.
        client_id: u64,
        /// The write's sequence number.
        seq: u64,
    },
}

/// What a split applied: the new group's range and the range epoch both groups have now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitDone {
    /// The new group's first key (the split key).
    pub start: Vec<u8>,
    /// The new group's exclusive end (empty: unbounded).
    pub end: Vec<u8>,
    /// The range epoch of both groups after the split.
    pub epoch: u64,
}

/// Results other than `Done` (compare-and-swap, refusals) kept per client session; past
/// it the oldest are forgotten (a resend of one gets `SessionExpired`).
pub const SESSION_RESULTS_MAX: usize = 1024;
/// Runs of applied sequences kept per client session (a run ends at a write not applied
/// yet); past it the low-water mark passes the oldest run.
pub const SESSION_RUNS_MAX: usize = 4096;
/// Version of the session record format written (1 is still read).
const SESSION_FORMAT: u8 = 2;
/// A session idle this long (log time) loses its results; twice this long, its record.
pub const SESSION_IDLE_EXPIRY_MS: u64 = 60 * 60 * 1000;
/// Log time between two expiry sweeps of a group.
pub const SESSION_SWEEP_INTERVAL_MS: u64 = 60 * 1000;
const _: () = assert!(
    SESSION_IDLE_EXPIRY_MS > 4 * phoenix_proto::limits::TIMEOUT_MS_MAX,
    "a resend must come long before its session can expire"
);
/// Byte offset of `last_ms` in a record (formats 1 and 2): the sweep reads it without
/// decoding the record.
const SESSION_LAST_MS_AT: usize = 9;

/// One client's session in one group (system key `sess/ ‖ client_id`).
///
/// ```text
/// record := version: u8 (2) ‖ low_water: u64 BE ‖ last_ms: u64 BE ‖ forgotten_below: u64 BE
///           ‖ runs: u32 BE ‖ (start: u64 BE ‖ end: u64 BE)* ‖ count: u32 BE ‖ (seq: u64 BE ‖ result)*
/// result := 1 ‖ succeeded: u8 ‖ found: u8 ‖ len: u32 BE ‖ current (cas)
///         | 2 ‖ len: u32 BE ‖ utf-8 message (refused)
///         | 3 ‖ failure: u8 (0 none, 1 not an integer, 2 overflow) ‖ value: i64 BE (incr)
///         | 4 ‖ changed: u8 (expire)
/// ```
///
/// Every applied sequence at or above `low_water` is in a run `[start, end)` (runs are
/// disjoint and not adjacent: a gap is a write not applied yet), so a record stays small
/// however many writes a client has applied around one held up by a failure (with many
/// writers on one session it can trail thousands). Results other than `Done` are listed;
/// an applied sequence without a listed result was `Done`, unless it is below
/// `forgotten_below` (its result may have been dropped by the cap: a resend gets
/// `SessionExpired`). Format 1 (`low_water ‖ last_ms ‖ count ‖ results`, `Done` as tag 0)
/// is read too. A cluster must not mix builds that write format 2 with older ones, which
/// refuse it. Tag 3 (increments) is written only by entries the version gate let
/// through, that is once every registered node reads it; so is tag 4 (expiry changes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    /// Every sequence below it is answered and forgotten.
    pub low_water: u64,
    /// The newest proposer clock seen (ms since the Unix epoch).
    pub last_ms: u64,
    /// Results below it may have been dropped by the cap.
    pub forgotten_below: u64,
    /// Applied sequences at or above `low_water`: start → end (exclusive).
    pub applied: BTreeMap<u64, u64>,
    /// Results other than `Done` of applied sequences, by sequence.
    pub results: BTreeMap<u64, ApplyResult>,
}

impl Session {
    fn is_applied(&self, seq: u64) -> bool {
        self.applied
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, &end)| seq < end)
    }

    /// The result of write `seq` if it was applied: `SessionExpired` if it is forgotten.
    pub fn result(&self, client_id: u64, seq: u64) -> Option<ApplyResult> {
        let expired = ApplyResult::SessionExpired { client_id, seq };
        if seq < self.low_water {
            return Some(expired);
        }
        if !self.is_applied(seq) {
            return None;
        }
        Some(match self.results.get(&seq) {
            Some(r) => r.clone(),
            None if seq < self.forgotten_below => expired,
            None => ApplyResult::Done,
        })
    }

    /// Records that write `seq` (at or above the low-water mark, not applied before, below
    /// `u64::MAX`) was applied with `r`.
    pub fn record(&mut self, seq: u64, r: ApplyResult) {
        debug_assert!(seq >= self.low_water && seq < u64::MAX && !self.is_applied(seq));
        if r != ApplyResult::Done {
            self.results.insert(seq, r);
        }
        let mut start = seq;
        let mut end = seq.saturating_add(1);
        if let Some((&s, &e)) = self.applied.range(..=seq).next_back() {
            if e >= seq {
                start = s;
                end = end.max(e);
                self.applied.remove(&s);
            }
        }
        if let Some(e) = self.applied.remove(&end) {
            end = e;
        }
        self.applied.insert(start, end);
    }

    /// Raises the low-water mark to `lw` (if higher), forgetting what is below it.
    pub fn forget_below(&mut self, lw: u64) {
        if lw <= self.low_water {
            return;
        }
        self.low_water = lw;
        self.forgotten_below = self.forgotten_below.max(lw);
        self.results = self.results.split_off(&lw);
        let mut kept = self.applied.split_off(&lw);
        if let Some((_, &e)) = self.applied.last_key_value() {
            if e > lw {
                kept.insert(lw, e);
            }
        }
        self.applied = kept;
    }

    /// Bounds the record: past [`SESSION_RESULTS_MAX`] listed results the oldest are
    /// dropped (their writes stay applied; a resend gets `SessionExpired`), past
    /// [`SESSION_RUNS_MAX`] runs the low-water mark passes the oldest run.
    fn enforce_cap(&mut self) {
        while self.results.len() > SESSION_RESULTS_MAX {
            if let Some((seq, _)) = self.results.pop_first() {
                self.forgotten_below = self.forgotten_below.max(seq.saturating_add(1));
            }
        }
        while self.applied.len() > SESSION_RUNS_MAX {
            match self.applied.first_key_value() {
                Some((_, &end)) => self.forget_below(end),
                None => break,
            }
        }
    }

    /// Drops every result: the low-water mark passes every applied write.
    fn expire_results(&mut self) {
        if let Some((_, &end)) = self.applied.last_key_value() {
            self.forget_below(end);
        }
        self.results.clear();
    }

    /// Takes in `other`, the same client's record in a group merged into this one: a
    /// sequence is applied if either applied it (a client's sequences are its own,
    /// whichever group applied them), with its result. The low-water marks are the
    /// client's word ("every write below has its answer"), so the higher stands.
    pub fn merge_from(&mut self, other: &Session) {
        let lw = self.low_water.max(other.low_water);
        self.last_ms = self.last_ms.max(other.last_ms);
        self.forgotten_below = self.forgotten_below.max(other.forgotten_below);
        // The runs' union (a run of either may span many sequences: merged as runs).
        let mut runs: Vec<(u64, u64)> = self
            .applied
            .iter()
            .chain(other.applied.iter())
            .map(|(&s, &e)| (s, e))
            .collect();
        runs.sort_unstable();
        self.applied.clear();
        let mut cur: Option<(u64, u64)> = None;
        for (s, e) in runs {
            cur = match cur {
                Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
                Some((cs, ce)) => {
                    self.applied.insert(cs, ce);
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some((cs, ce)) = cur {
            self.applied.insert(cs, ce);
        }
        for (seq, r) in &other.results {
            self.results.entry(*seq).or_insert_with(|| r.clone());
        }
        // Below the higher mark goes, from both (`forget_below` trims only when the mark
        // moves).
        self.low_water = 0;
        self.forget_below(lw);
        self.enforce_cap();
    }

    /// Whether it keeps any applied write above its low-water mark.
    fn holds_writes(&self) -> bool {
        !self.applied.is_empty()
    }

    /// Encodes the record.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(33 + self.applied.len() * 16 + self.results.len() * 10);
        out.push(SESSION_FORMAT);
        out.extend_from_slice(&self.low_water.to_be_bytes());
        out.extend_from_slice(&self.last_ms.to_be_bytes());
        out.extend_from_slice(&self.forgotten_below.to_be_bytes());
        out.extend_from_slice(&(self.applied.len() as u32).to_be_bytes());
        for (s, e) in &self.applied {
            out.extend_from_slice(&s.to_be_bytes());
            out.extend_from_slice(&e.to_be_bytes());
        }
        out.extend_from_slice(&(self.results.len() as u32).to_be_bytes());
        for (seq, r) in &self.results {
            out.extend_from_slice(&seq.to_be_bytes());
            match r {
                ApplyResult::Cas { succeeded, current } => {
                    out.push(1);
                    out.push(u8::from(*succeeded));
                    out.push(u8::from(current.is_some()));
                    let v = current.as_deref().unwrap_or_default();
                    out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                    out.extend_from_slice(v);
                }
                ApplyResult::Refused(why) => {
                    out.push(2);
                    out.extend_from_slice(&(why.len() as u32).to_be_bytes());
                    out.extend_from_slice(why.as_bytes());
                }
                ApplyResult::Incr(r) => {
                    out.push(3);
                    let (failure, value) = match r {
                        Ok(v) => (proto::IncrFailure::None, *v),
                        Err(f) => (*f, 0),
                    };
                    out.push(failure as i32 as u8);
                    out.extend_from_slice(&value.to_be_bytes());
                }
                ApplyResult::Expire(changed) => {
                    out.push(4);
                    out.push(u8::from(*changed));
                }
                // Never listed (`Done` is a run; an expiry is not a result).
                // (`StaleEpoch`, `Split`, `Scrub` and merges are decided before a session is
                // looked at.)
                ApplyResult::Done
                | ApplyResult::SessionExpired { .. }
                | ApplyResult::StaleEpoch { .. }
                | ApplyResult::Split(_)
                | ApplyResult::PrepareMerge(_)
                | ApplyResult::CommitMerge(_)
                | ApplyResult::RollbackMerge(_)
                | ApplyResult::Scrub => out.push(0),
            }
        }
        out
    }

    /// Decodes a record (format 1 or 2); the error says what is malformed.
    pub fn decode(v: &[u8]) -> Result<Session, String> {
        fn take<'a>(v: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
            if v.len() < n {
                return Err(format!("truncated: {n} bytes wanted, {} left", v.len()));
            }
            let (a, b) = v.split_at(n);
            *v = b;
            Ok(a)
        }
        fn u64_of(v: &mut &[u8]) -> Result<u64, String> {
            let b = take(v, 8)?;
            Ok(u64::from_be_bytes(b.try_into().map_err(|_| "u64")?))
        }
        fn u32_of(v: &mut &[u8]) -> Result<usize, String> {
            let b = take(v, 4)?;
            Ok(u32::from_be_bytes(b.try_into().map_err(|_| "u32")?) as usize)
        }
        let mut v = v;
        let version = take(&mut v, 1)?[0];
        if version != 1 && version != SESSION_FORMAT {
            return Err(format!(
                "session record format {version}, this build reads 1 and {SESSION_FORMAT}"
            ));
        }
        let mut rec = Session {
            low_water: u64_of(&mut v)?,
            last_ms: u64_of(&mut v)?,
            ..Session::default()
        };
        rec.forgotten_below = rec.low_water;
        if version >= 2 {
            rec.forgotten_below = u64_of(&mut v)?;
            let runs = u32_of(&mut v)?;
            let mut prev_end = None;
            for _ in 0..runs {
                let (s, e) = (u64_of(&mut v)?, u64_of(&mut v)?);
                let ordered = match prev_end {
                    Some(p) => s > p,
                    None => s >= rec.low_water,
                };
                if !ordered || e <= s {
                    return Err(format!(
                        "run [{s}, {e}) out of order (previous end {prev_end:?}, low water {})",
                        rec.low_water
                    ));
                }
                rec.applied.insert(s, e);
                prev_end = Some(e);
            }
        }
        let n = u32_of(&mut v)?;
        for _ in 0..n {
            let seq = u64_of(&mut v)?;
            let r = match take(&mut v, 1)?[0] {
                0 if version == 1 => ApplyResult::Done,
                1 => {
                    let flags = take(&mut v, 2)?;
                    let (succeeded, found) = (flags[0] == 1, flags[1] == 1);
                    let len = u32_of(&mut v)?;
                    let cur = take(&mut v, len)?;
                    ApplyResult::Cas {
                        succeeded,
                        current: found.then(|| cur.to_vec()),
                    }
                }
                2 => {
                    let len = u32_of(&mut v)?;
                    let why = take(&mut v, len)?;
                    ApplyResult::Refused(String::from_utf8_lossy(why).into_owned())
                }
                3 => {
                    let failure = take(&mut v, 1)?[0];
                    let value = u64_of(&mut v)? as i64;
                    ApplyResult::Incr(match proto::IncrFailure::try_from(i32::from(failure)) {
                        Ok(proto::IncrFailure::None) => Ok(value),
                        Ok(f) => Err(f),
                        Err(_) => return Err(format!("increment failure {failure}")),
                    })
                }
                4 => match take(&mut v, 1)?[0] {
                    c @ (0 | 1) => ApplyResult::Expire(c == 1),
                    c => return Err(format!("expiry change outcome {c}")),
                },
                t => return Err(format!("result tag {t}")),
            };
            if seq < rec.low_water || seq == u64::MAX {
                return Err(format!(
                    "result of sequence {seq} outside [{}, {})",
                    rec.low_water,
                    u64::MAX
                ));
            }
            if version == 1 {
                if rec.is_applied(seq) {
                    return Err(format!("result of sequence {seq} listed twice"));
                }
                rec.record(seq, r);
            } else {
                if !rec.is_applied(seq) || rec.results.insert(seq, r).is_some() {
                    return Err(format!(
                        "result of sequence {seq} not in an applied run, or listed twice"
                    ));
                }
            }
        }
        if !v.is_empty() {
            return Err(format!("{} trailing bytes", v.len()));
        }
        Ok(rec)
    }
}

/// Reads of the applied state (the engine).
pub trait StateReader {
    /// The value of engine key `key`.
    fn get(&self, key: &[u8]) -> crate::Result<Option<Vec<u8>>>;
    /// Every key in `[start, end)` with its value, in key order.
    fn scan(&self, start: &[u8], end: &[u8]) -> crate::Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Whether any key lies in `[start, end)`.
    fn any_in(&self, start: &[u8], end: &[u8]) -> crate::Result<bool> {
        Ok(!self.scan(start, end)?.is_empty())
    }
}

/// Writes to the applied state (the engine).
pub trait StateWriter {
    /// Writes one batch atomically.
    fn write(&self, batch: WriteBatch) -> crate::Result<()>;
}

/// The node's engine as the state machine's store (WAL per the node's setting: off by
/// default, the raft log is the WAL).
pub struct EngineState<'a> {
    /// The engine.
    pub db: &'a phoenix_engine::Db,
    /// Whether the engine's own WAL is on.
    pub wal: bool,
}

impl StateReader for EngineState<'_> {
    fn get(&self, key: &[u8]) -> crate::Result<Option<Vec<u8>>> {
        Ok(self.db.get(&ReadOptions::default(), key)?)
    }

    fn scan(&self, start: &[u8], end: &[u8]) -> crate::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let ro = ReadOptions {
            lower_bound: Some(start.to_vec()),
            upper_bound: Some(end.to_vec()),
            fill_cache: false,
            ..ReadOptions::default()
        };
        let mut it = self.db.iter(&ro)?;
        it.seek(start);
        let mut out = Vec::new();
        while it.valid() {
            out.push((it.key().to_vec(), it.value().to_vec()));
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    fn any_in(&self, start: &[u8], end: &[u8]) -> crate::Result<bool> {
        let ro = ReadOptions {
            lower_bound: Some(start.to_vec()),
            upper_bound: Some(end.to_vec()),
            fill_cache: false,
            ..ReadOptions::default()
        };
        let mut it = self.db.iter(&ro)?;
        it.seek(start);
        let any = it.valid();
        it.status()?;
        Ok(any)
    }
}

impl StateWriter for EngineState<'_> {
    fn write(&self, batch: WriteBatch) -> crate::Result<()> {
        let wo = WriteOptions {
            sync: false,
            disable_wal: !self.wal,
        };
        Ok(self.db.write(&wo, batch)?)
    }
}

/// Most session records a group keeps decoded in memory; past it the group's cache
/// starts over (the records stay in the engine, read again when their clients write).
const SESSION_CACHE_MAX: usize = 4096;
/// A record bigger than this (encoded) is not cached: compare-and-swap results hold whole
/// values, and a client that never acknowledges its answers keeps up to
/// [`SESSION_RESULTS_MAX`] of them.
const SESSION_CACHED_BYTES_MAX: usize = 64 << 10;
/// Memory counted per cached record besides its encoded bytes.
const SESSION_ENTRY_OVERHEAD: usize = 96;

/// The decoded session records of one group as applied (the engine holds the same,
/// encoded), so a write does not read and decode its client's record from the engine.
/// Owned by the replica; a record is taken out while a round works on it and put back
/// only once the round's batch is written, so after a failed write the cache holds
/// nothing the engine does not. Cleared when the group's data is replaced (snapshot
/// install) or its replica stops. `bytes` counts the (approximate) memory of the
/// records of every group of the node, so the node can bound them all.
#[derive(Debug, Default)]
pub struct SessionCache {
    /// By client: the record and the bytes counted for it.
    records: HashMap<u64, (Session, usize)>,
    /// The group's last sweep time as written (None: read it from the engine).
    swept_at: Option<u64>,
    /// Whether the group may hold key expiries, as written (None: look in the engine).
    expiring: Option<bool>,
    bytes: Arc<AtomicUsize>,
}

impl SessionCache {
    /// An empty cache counting its memory in the node-wide `bytes`.
    pub fn new(bytes: Arc<AtomicUsize>) -> SessionCache {
        SessionCache {
            records: HashMap::new(),
            swept_at: None,
            expiring: None,
            bytes,
        }
    }

    /// Forgets every record (they are read from the engine again when needed).
    pub fn clear(&mut self) {
        let held: usize = self.records.values().map(|(_, b)| *b).sum();
        self.bytes.fetch_sub(held, Ordering::Relaxed);
        self.records = HashMap::new();
        self.swept_at = None;
        self.expiring = None;
    }

    /// Whether the group may hold key expiries, as last written (None: not known).
    pub fn expiring(&self) -> Option<bool> {
        self.expiring
    }

    /// Forgets every record to bound memory, but not what it knows of the group's
    /// expiries: readers were told the group holds none on that knowledge, and a fresh
    /// look after a sweep could tell them so while a reader's older snapshot still holds
    /// one (the view would pass from "some" to "none" under it).
    pub fn shed(&mut self) {
        let expiring = self.expiring;
        self.clear();
        self.expiring = expiring;
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn take(&mut self, client: u64) -> Option<Session> {
        let (rec, b) = self.records.remove(&client)?;
        self.bytes.fetch_sub(b, Ordering::Relaxed);
        Some(rec)
    }

    /// Keeps the records of a written round (with their encoded sizes).
    fn put_all(&mut self, sessions: Vec<(u64, Session, usize)>) {
        if self.records.len() + sessions.len() > SESSION_CACHE_MAX {
            self.clear();
        }
        for (client, rec, encoded) in sessions {
            if encoded > SESSION_CACHED_BYTES_MAX {
                continue;
            }
            let b = encoded + SESSION_ENTRY_OVERHEAD;
            self.bytes.fetch_add(b, Ordering::Relaxed);
            if let Some((_, old)) = self.records.insert(client, (rec, b)) {
                self.bytes.fetch_sub(old, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for SessionCache {
    fn drop(&mut self) {
        self.clear();
    }
}

/// One round of applies of group `g` (see the module doc).
pub struct Applier<'a> {
    g: u64,
    reader: &'a dyn StateReader,
    cache: &'a mut SessionCache,
    /// Session records this round works on (out of the cache): written in its batch.
    sessions: HashMap<u64, Session>,
    wb: WriteBatch,
    /// Keys written by this round, not yet in the engine (`None` = deleted).
    overlay: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// Range deletions of this round `[start, end)`, applied before the overlay's later
    /// writes: a key in one of them and not in the overlay reads as absent.
    deleted: Vec<(Vec<u8>, Vec<u8>)>,
    /// (index, term) of the last entry taken.
    last: Option<(u64, u64)>,
    /// The group's last sweep time as of the entries taken (None: not read yet).
    swept_at: Option<u64>,
    /// Session records this round deleted (expired): absent, whatever the engine holds.
    expired: std::collections::HashSet<u64>,
    /// The group's range and range epoch as of the entries taken (`start`, `end`
    /// exclusive, empty = unbounded): commands outside them are refused.
    range: (Vec<u8>, Vec<u8>, u64),
    /// Frozen for a merge: (target, prepare index). Every key-value command is refused.
    merging: Option<(u64, u64)>,
    /// The log index of the last split or merge applied (`GroupRange.split_index`).
    floor: u64,
    /// The time of the command being applied (`KvCommand.now_ms`): a key whose expiry is
    /// before it is absent. 0: none is.
    now: u64,
    /// Whether the group may hold key expiries as of the entries taken (None: not looked
    /// yet). Only ever turns true within a round: a record written says so.
    expiring: Option<bool>,
}

/// What a merge's commit applied in the target: its range and range epoch now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeDone {
    /// The target's first key.
    pub start: Vec<u8>,
    /// Its exclusive end (empty: unbounded).
    pub end: Vec<u8>,
    /// Its range epoch.
    pub epoch: u64,
}

impl<'a> Applier<'a> {
    /// A round of group `g` reading the state through `reader`, its session records
    /// through `cache` first.
    pub fn new(g: u64, reader: &'a dyn StateReader, cache: &'a mut SessionCache) -> Applier<'a> {
        Applier {
            g,
            reader,
            cache,
            sessions: HashMap::new(),
            wb: WriteBatch::new(),
            overlay: HashMap::new(),
            deleted: Vec::new(),
            last: None,
            swept_at: None,
            expired: std::collections::HashSet::new(),
            range: (Vec::new(), Vec::new(), 0),
            merging: None,
            floor: 0,
            now: 0,
            expiring: None,
        }
    }

    /// Sets the group's merge state as applied: frozen for a merge (target, prepare
    /// index), and the log index of its last split or merge.
    pub fn set_merge_state(&mut self, merging: Option<(u64, u64)>, floor: u64) {
        self.merging = merging;
        self.floor = floor;
    }

    /// Whether the entries taken wrote a key expiry (or took one in by a merge): readers
    /// must be told before the round's batch is written.
    pub fn holds_expiries(&self) -> bool {
        self.expiring == Some(true)
    }

    /// The group's range record as of the entries taken.
    fn range_record(&self) -> proto::GroupRange {
        let (start, end, epoch) = &self.range;
        let (into, index) = self.merging.unwrap_or((0, 0));
        proto::GroupRange {
            format: if self.merging.is_some() {
                keys::RANGE_FORMAT_MERGE
            } else {
                keys::RANGE_FORMAT
            },
            start_key: start.clone().into(),
            end_key: end.clone().into(),
            epoch: *epoch,
            split_index: self.floor,
            merging_into: into,
            merge_index: index,
            merged_into: 0,
        }
    }

    /// Applies a merge's prepare (entry `index`) in its source: at the range epoch the
    /// merge was planned at, the group freezes (epoch one up, every later key-value
    /// command refused). Returns the new epoch, or the refusal.
    pub fn prepare_merge(
        &mut self,
        index: u64,
        cmd: &proto::PrepareMergeCommand,
    ) -> Result<u64, String> {
        let g = self.g;
        if let Some((t, _)) = self.merging {
            return Err(format!("group {g} is frozen for a merge into group {t}"));
        }
        if cmd.epoch != self.range.2 {
            return Err(format!(
                "merge of group {g} asked at range epoch {}, the group is at {}",
                cmd.epoch, self.range.2
            ));
        }
        if cmd.target == g || cmd.target == 0 {
            return Err(format!("merge of group {g}: bad target {}", cmd.target));
        }
        self.range.2 += 1;
        self.merging = Some((cmd.target, index));
        let rec = self.range_record();
        self.wb.put(&keys::range_key(g), &rec.encode_to_vec());
        Ok(self.range.2)
    }

    /// Applies a merge's rollback in its source: a group frozen for this merge thaws,
    /// and one that never froze (its prepare still in flight) moves its epoch on so the
    /// prepare is refused when it comes. Returns the new epoch, or the refusal.
    pub fn rollback_merge(&mut self, cmd: &proto::RollbackMergeCommand) -> Result<u64, String> {
        let g = self.g;
        let frozen = self
            .merging
            .is_some_and(|(t, _)| t == cmd.target && self.range.2 == cmd.epoch + 1);
        if !frozen && (self.merging.is_some() || self.range.2 != cmd.epoch) {
            return Err(format!(
                "rollback of a merge of group {g} planned at range epoch {}: the group is at {}",
                cmd.epoch, self.range.2
            ));
        }
        self.range.2 += 1;
        self.merging = None;
        let rec = self.range_record();
        self.wb.put(&keys::range_key(g), &rec.encode_to_vec());
        Ok(self.range.2)
    }

    /// Applies a merge's commit (entry `index`) in its target: at the range epoch the
    /// merge was planned at, with the source its neighbour and frozen for this merge at
    /// `cmd.prepare_index` on this node (the caller waited for that), the source's data
    /// and client sessions are copied under this group's id, its range joins this one's
    /// (epoch past both), and the source's record says it merged here (its replica is
    /// dropped). All in the round's batch: a crash keeps the merge whole or not at all.
    /// Returns the refusal when the merge no longer fits this group.
    pub fn commit_merge(
        &mut self,
        index: u64,
        cmd: &proto::CommitMergeCommand,
    ) -> crate::Result<Result<MergeDone, String>> {
        let (g, s) = (self.g, cmd.source);
        let (start, end, epoch) = self.range.clone();
        if self.merging.is_some() {
            return Ok(Err(format!("group {g} is frozen for a merge itself")));
        }
        if cmd.target_epoch != epoch {
            return Ok(Err(format!(
                "merge into group {g} asked at range epoch {}, the group is at {epoch}",
                cmd.target_epoch
            )));
        }
        let (src_start, src_end) = (cmd.source_start.to_vec(), cmd.source_end.to_vec());
        let (new_start, new_end) = if !src_end.is_empty() && src_end == start {
            (src_start.clone(), end.clone())
        } else if !end.is_empty() && end == src_start {
            (start.clone(), src_end.clone())
        } else {
            return Ok(Err(format!("group {s} is not group {g}'s neighbour")));
        };
        // The source's state on this node, frozen for this merge (its data is final).
        let src = match self.reader.get(&keys::range_key(s))? {
            Some(v) => proto::GroupRange::decode(v.as_slice()).map_err(|e| {
                crate::Error::Corruption(format!("group {s}: undecodable range record: {e}"))
            })?,
            None => proto::GroupRange::default(),
        };
        let applied = self
            .reader
            .get(&keys::applied_key(s))?
            .and_then(|v| keys::decode_applied(&v))
            .map_or(0, |(i, _)| i);
        if src.merging_into != g
            || src.merge_index != cmd.prepare_index
            || src.epoch != cmd.source_epoch
            || src.start_key != cmd.source_start
            || src.end_key != cmd.source_end
            || applied < cmd.prepare_index
        {
            return Err(crate::Error::Corruption(format!(
                "merge of group {s} into {g}: the source here is not frozen for it \
                 (into {}, index {}, epoch {}, applied {applied})",
                src.merging_into, src.merge_index, src.epoch
            )));
        }
        let prefix = 9; // group id and namespace byte
        for (k, v) in self
            .reader
            .scan(&keys::data_key(s, &[]), &keys::data_end(s))?
        {
            let to = keys::data_key(g, &k[prefix..]);
            self.wb.put(&to, &v);
            self.overlay.insert(to, Some(v));
        }
        // Their expiries (the source is frozen: the engine holds its state).
        for (k, v) in self
            .reader
            .scan(&keys::expiry_key(s, &[]), &keys::expiry_end(s))?
        {
            let to = keys::expiry_key(g, &k[prefix..]);
            self.wb.put(&to, &v);
            self.overlay.insert(to, Some(v));
            self.expiring = Some(true);
        }
        // Sessions: the source's records taken into this round's.
        let sess = keys::sessions_prefix(s);
        let mut sess_end = sess.clone();
        if let Some(last) = sess_end.last_mut() {
            *last += 1;
        }
        for (k, v) in self.reader.scan(&sess, &sess_end)? {
            let client = keys::session_client(s, &k).ok_or_else(|| {
                crate::Error::Corruption(format!("group {s}: malformed session key {k:02x?}"))
            })?;
            let theirs = Session::decode(&v).map_err(|why| {
                crate::Error::Corruption(format!(
                    "group {s}: session record of client {client:#x}: {why}"
                ))
            })?;
            let mut ours = match self.sessions.remove(&client) {
                Some(r) => r,
                None if self.expired.remove(&client) => Session::default(),
                None => match self.cache.take(client) {
                    Some(r) => r,
                    None => match self.reader.get(&keys::session_key(g, client))? {
                        Some(v) => Session::decode(&v).map_err(|why| {
                            crate::Error::Corruption(format!(
                                "group {g} entry {index}: session record of client \
                                 {client:#x}: {why}"
                            ))
                        })?,
                        None => Session::default(),
                    },
                },
            };
            ours.merge_from(&theirs);
            self.sessions.insert(client, ours);
        }
        let merged = proto::GroupRange {
            format: keys::RANGE_FORMAT_MERGE,
            merged_into: g,
            ..src
        };
        self.wb.put(&keys::range_key(s), &merged.encode_to_vec());
        let new_epoch = epoch.max(cmd.source_epoch) + 1;
        self.range = (new_start.clone(), new_end.clone(), new_epoch);
        self.floor = index;
        let rec = self.range_record();
        self.wb.put(&keys::range_key(g), &rec.encode_to_vec());
        Ok(Ok(MergeDone {
            start: new_start,
            end: new_end,
            epoch: new_epoch,
        }))
    }

    /// Sets the group's range `[start, end)` and range epoch (before any entry, and
    /// after a split the node applied): commands checked against another epoch, or with
    /// keys outside the range, are refused with [`ApplyResult::StaleEpoch`].
    pub fn set_range(&mut self, start: &[u8], end: &[u8], epoch: u64) {
        self.range = (start.to_vec(), end.to_vec(), epoch);
    }

    /// For a committed entry's `data`: if it is a merge's commit at this group's range
    /// epoch whose source's replica here has not applied the prepare yet, that source:
    /// the commit must wait for it (the caller holds it and what follows). A commit at
    /// another epoch (a second copy of one applied already, say) does not wait: it is
    /// refused when applied.
    pub fn merge_waits_for(&self, data: &[u8]) -> crate::Result<Option<u64>> {
        // Cheap look first: prost writes the oneof first, so a commit's encoding starts
        // with its field's tag (9, length-delimited); other entries are not decoded.
        const COMMIT_TAG: u8 = (9 << 3) | 2;
        if self.g == 0 || data.first() != Some(&COMMIT_TAG) {
            return Ok(None);
        }
        let Ok(cmd) = proto::KvCommand::decode(data) else {
            return Ok(None);
        };
        let Some(proto::kv_command::Cmd::CommitMerge(m)) = cmd.cmd else {
            return Ok(None);
        };
        if m.target_epoch != self.range.2 {
            return Ok(None);
        }
        let applied = self
            .reader
            .get(&keys::applied_key(m.source))?
            .and_then(|v| keys::decode_applied(&v))
            .map_or(0, |(i, _)| i);
        let frozen = match self.reader.get(&keys::range_key(m.source))? {
            Some(v) => proto::GroupRange::decode(v.as_slice()).is_ok_and(|r| {
                r.merging_into == self.g && r.merge_index == m.prepare_index && r.merged_into == 0
            }),
            None => false,
        };
        Ok((!frozen || applied < m.prepare_index).then_some(m.source))
    }

    fn in_range(&self, key: &[u8]) -> bool {
        let (start, end, _) = &self.range;
        key >= start.as_slice() && (end.is_empty() || key < end.as_slice())
    }

    /// Whether `cmd` (checked at range epoch `epoch`) fits the group's range now.
    fn fits(&self, cmd: &Option<proto::kv_command::Cmd>, epoch: u64) -> bool {
        use proto::kv_command::Cmd;
        if epoch != 0 && epoch != self.range.2 {
            return false;
        }
        if self.merging.is_some() {
            // Frozen for a merge: its data must stay as it was at the prepare.
            return !matches!(
                cmd,
                Some(Cmd::Batch(_))
                    | Some(Cmd::Cas(_))
                    | Some(Cmd::DeleteRange(_))
                    | Some(Cmd::Incr(_))
                    | Some(Cmd::Expire(_))
                    | Some(Cmd::SweepExpired(_))
            );
        }
        match cmd {
            Some(Cmd::Batch(b)) => b.mutations.iter().all(|m| self.in_range(&m.key)),
            Some(Cmd::Cas(c)) => self.in_range(&c.key),
            Some(Cmd::Incr(c)) => self.in_range(&c.key),
            Some(Cmd::Expire(c)) => self.in_range(&c.key),
            Some(Cmd::SweepExpired(c)) => c.keys.iter().all(|k| self.in_range(k)),
            // An empty end means "to the group's end" as the proposer saw it: only
            // unambiguous while the group has no end either.
            Some(Cmd::DeleteRange(r)) => {
                self.in_range(&r.start)
                    && if r.end.is_empty() {
                        self.range.1.is_empty()
                    } else {
                        r.end.as_ref() <= self.range.1.as_slice() || self.range.1.is_empty()
                    }
            }
            Some(Cmd::Split(_))
            | Some(Cmd::Scrub(_))
            | Some(Cmd::PrepareMerge(_))
            | Some(Cmd::CommitMerge(_))
            | Some(Cmd::RollbackMerge(_))
            | None => true,
        }
    }

    /// The round's batch, for writes that are not key-value commands (membership, meta
    /// records).
    pub fn batch_mut(&mut self) -> &mut WriteBatch {
        &mut self.wb
    }

    /// Records that entry (`index`, `term`) is taken into this round (every entry, of any
    /// kind, in log order).
    pub fn entry(&mut self, index: u64, term: u64) {
        debug_assert!(
            self.last.is_none_or(|(i, _)| i < index),
            "entries out of order"
        );
        self.last = Some((index, term));
    }

    /// The value of engine key `k` as of the entries taken so far.
    fn read(&self, k: &[u8]) -> crate::Result<Option<Vec<u8>>> {
        if let Some(v) = self.overlay.get(k) {
            return Ok(v.clone());
        }
        if self
            .deleted
            .iter()
            .any(|(s, e)| s.as_slice() <= k && k < e.as_slice())
        {
            return Ok(None);
        }
        self.reader.get(k)
    }

    /// Applies the key-value command of entry `index` (taken with [`Applier::entry`]).
    /// An undecodable command is corruption of the log: the group must stop.
    pub fn kv(&mut self, index: u64, data: &[u8]) -> crate::Result<ApplyResult> {
        let g = self.g;
        let cmd = proto::KvCommand::decode(data).map_err(|err| {
            crate::Error::Corruption(format!(
                "group {g} entry {index}: undecodable command: {err}"
            ))
        })?;
        match cmd.cmd {
            Some(proto::kv_command::Cmd::Split(sp)) => return Ok(ApplyResult::Split(sp)),
            Some(proto::kv_command::Cmd::Scrub(_)) => return Ok(ApplyResult::Scrub),
            Some(proto::kv_command::Cmd::PrepareMerge(m)) => {
                return Ok(ApplyResult::PrepareMerge(m))
            }
            Some(proto::kv_command::Cmd::CommitMerge(m)) => return Ok(ApplyResult::CommitMerge(m)),
            Some(proto::kv_command::Cmd::RollbackMerge(m)) => {
                return Ok(ApplyResult::RollbackMerge(m))
            }
            _ => {}
        }
        self.now = cmd.now_ms;
        if !self.fits(&cmd.cmd, cmd.epoch) {
            // Not applied, and not recorded in the session: the client sends it again
            // to the group that holds its keys now.
            return Ok(ApplyResult::StaleEpoch {
                request_epoch: cmd.epoch,
            });
        }
        match cmd.session {
            Some(s) if s.client_id != 0 => self.kv_in_session(index, cmd.cmd, &s),
            _ => self.apply_cmd(cmd.cmd),
        }
    }

    /// Applies `cmd` at most once per (client, sequence) (see the module doc).
    fn kv_in_session(
        &mut self,
        index: u64,
        cmd: Option<proto::kv_command::Cmd>,
        s: &proto::ClientSession,
    ) -> crate::Result<ApplyResult> {
        let g = self.g;
        self.sweep_if_due(index, s.time_ms)?;
        let mut rec = match self.sessions.remove(&s.client_id) {
            Some(r) => r,
            // Expired earlier in this round: the client starts afresh.
            None if self.expired.remove(&s.client_id) => Session::default(),
            None => match self.cache.take(s.client_id) {
                Some(r) => r,
                None => match self.reader.get(&keys::session_key(g, s.client_id))? {
                    Some(v) => Session::decode(&v).map_err(|why| {
                        crate::Error::Corruption(format!(
                            "group {g} entry {index}: session record of client {:#x}: {why}",
                            s.client_id
                        ))
                    })?,
                    None => Session::default(),
                },
            },
        };
        let result = self.session_step(&mut rec, cmd, s);
        // Written with the round even when unchanged (a resend): rare, and harmless.
        self.sessions.insert(s.client_id, rec);
        result
    }

    /// Sweeps the group's session records if its log time `now` (the leader's clock on
    /// the command of entry `index`) is [`SESSION_SWEEP_INTERVAL_MS`] past the last
    /// sweep (see the module doc). Every record is judged in its state as of the entries
    /// before this one (this round's version if it has one), so the outcome does not
    /// depend on where apply rounds begin.
    fn sweep_if_due(&mut self, index: u64, now: u64) -> crate::Result<()> {
        let g = self.g;
        let swept_at = match self.swept_at.or(self.cache.swept_at) {
            Some(t) => t,
            None => match self.reader.get(&keys::session_sweep_key(g))? {
                Some(v) => {
                    let b: [u8; 8] = v.as_slice().try_into().map_err(|_| {
                        crate::Error::Corruption(format!(
                            "group {g}: session sweep time is {} bytes, not 8",
                            v.len()
                        ))
                    })?;
                    u64::from_be_bytes(b)
                }
                None => 0,
            },
        };
        self.swept_at = Some(swept_at);
        if now < swept_at.saturating_add(SESSION_SWEEP_INTERVAL_MS) {
            return Ok(());
        }
        let start = keys::sessions_prefix(g);
        let mut end = start.clone();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let mut clients: Vec<u64> = Vec::new();
        let mut stored: HashMap<u64, Vec<u8>> = HashMap::new();
        for (k, v) in self.reader.scan(&start, &end)? {
            let Some(client) = keys::session_client(g, &k) else {
                return Err(crate::Error::Corruption(format!(
                    "group {g}: malformed session key {k:02x?}"
                )));
            };
            clients.push(client);
            stored.insert(client, v);
        }
        clients.extend(self.sessions.keys().filter(|c| !stored.contains_key(c)));
        clients.sort_unstable();
        for client in clients {
            if self.expired.contains(&client) {
                continue;
            }
            // This round's version if it has one (written with the round anyway).
            let (rec, touched) = match self.sessions.remove(&client) {
                Some(r) => (r, true),
                None => {
                    let v = stored.get(&client).map(Vec::as_slice).unwrap_or_default();
                    let corrupt = |why: String| {
                        crate::Error::Corruption(format!(
                            "group {g} entry {index}: session record of client {client:#x}: {why}"
                        ))
                    };
                    // Most records are not idle: judged by `last_ms` alone, not decoded.
                    let last_ms = v
                        .get(SESSION_LAST_MS_AT..SESSION_LAST_MS_AT + 8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_be_bytes)
                        .ok_or_else(|| corrupt(format!("{} bytes", v.len())))?;
                    if now.saturating_sub(last_ms) <= SESSION_IDLE_EXPIRY_MS {
                        continue;
                    }
                    (Session::decode(v).map_err(corrupt)?, false)
                }
            };
            let idle = now.saturating_sub(rec.last_ms);
            if idle > 2 * SESSION_IDLE_EXPIRY_MS {
                self.cache.take(client);
                self.wb.delete(&keys::session_key(g, client));
                self.expired.insert(client);
            } else if idle > SESSION_IDLE_EXPIRY_MS && rec.holds_writes() {
                self.cache.take(client);
                let mut rec = rec;
                rec.expire_results();
                self.sessions.insert(client, rec);
            } else if touched {
                self.sessions.insert(client, rec);
            }
        }
        self.wb.put(&keys::session_sweep_key(g), &now.to_be_bytes());
        self.swept_at = Some(now);
        Ok(())
    }

    /// The body of [`Applier::kv_in_session`] on the client's record `rec`.
    fn session_step(
        &mut self,
        rec: &mut Session,
        cmd: Option<proto::kv_command::Cmd>,
        s: &proto::ClientSession,
    ) -> crate::Result<ApplyResult> {
        if s.seq == u64::MAX {
            // No run can end past it; refused the same way on every replica.
            return Ok(ApplyResult::Refused(format!(
                "sequence number {} out of range",
                s.seq
            )));
        }
        if let Some(r) = rec.result(s.client_id, s.seq) {
            return Ok(r);
        }
        let result = self.apply_cmd(cmd)?;
        rec.record(s.seq, result.clone());
        // A client cannot have the answer of this very write yet.
        rec.forget_below(s.acked_below.min(s.seq));
        rec.enforce_cap();
        rec.last_ms = rec.last_ms.max(s.time_ms);
        Ok(result)
    }

    /// Applies one key-value command.
    fn apply_cmd(&mut self, cmd: Option<proto::kv_command::Cmd>) -> crate::Result<ApplyResult> {
        let g = self.g;
        Ok(match cmd {
            Some(proto::kv_command::Cmd::Batch(b)) => {
                for m in b.mutations {
                    if m.op == proto::MutationOp::Delete as i32 {
                        self.delete_value(&m.key)?;
                    } else {
                        self.put_value(&m.key, &m.value, m.expire_at_ms, m.keep_ttl)?;
                    }
                }
                ApplyResult::Done
            }
            Some(proto::kv_command::Cmd::DeleteRange(r)) => {
                let start = keys::data_key(g, &r.start);
                let end = if r.end.is_empty() {
                    keys::data_end(g)
                } else {
                    keys::data_key(g, &r.end)
                };
                if start < end {
                    self.delete_range(start, end);
                    if self.may_expire()? {
                        let (s, e) = keys::expiry_range(g, &r.start, &r.end);
                        self.delete_range(s, e);
                    }
                }
                ApplyResult::Done
            }
            Some(proto::kv_command::Cmd::Cas(c)) => {
                let (current, _) = self.live(&c.key)?;
                let holds = match (&current, c.expect_exists) {
                    (Some(v), true) => v.as_slice() == c.expected.as_ref(),
                    (None, false) => true,
                    _ => false,
                };
                if holds {
                    if c.delete {
                        self.delete_value(&c.key)?;
                    } else {
                        self.put_value(&c.key, &c.new_value, c.expire_at_ms, c.keep_ttl)?;
                    }
                }
                ApplyResult::Cas {
                    succeeded: holds,
                    current,
                }
            }
            Some(proto::kv_command::Cmd::Incr(c)) => {
                let (current, _) = self.live(&c.key)?;
                let r = phoenix_proto::counter::incremented(current.as_deref(), c.by);
                if let Ok(n) = r {
                    // An increment keeps the key's expiry (Redis' INCR).
                    self.put_value(&c.key, n.to_string().as_bytes(), 0, true)?;
                }
                ApplyResult::Incr(r)
            }
            Some(proto::kv_command::Cmd::Expire(c)) => self.expire(&c)?,
            Some(proto::kv_command::Cmd::SweepExpired(c)) => {
                let up_to = match self.now {
                    0 => c.up_to_ms,
                    now => c.up_to_ms.min(now),
                };
                if self.may_expire()? {
                    for k in &c.keys {
                        if self.expiry_of(k)?.is_some_and(|at| at < up_to) {
                            self.delete_value(k)?;
                        }
                    }
                }
                ApplyResult::Done
            }
            // (`kv` hands splits, scrubs and merges to the node before this.)
            Some(proto::kv_command::Cmd::Split(_))
            | Some(proto::kv_command::Cmd::Scrub(_))
            | Some(proto::kv_command::Cmd::PrepareMerge(_))
            | Some(proto::kv_command::Cmd::CommitMerge(_))
            | Some(proto::kv_command::Cmd::RollbackMerge(_))
            | None => ApplyResult::Refused("empty command".into()),
        })
    }

    /// Applies an expiry change (Redis' EXPIRE with its NX/XX/GT/LT, and PERSIST).
    fn expire(&mut self, c: &proto::ExpireCommand) -> crate::Result<ApplyResult> {
        use proto::ExpireCondition as When;
        let (current, at) = self.live(&c.key)?;
        if current.is_none() {
            return Ok(ApplyResult::Expire(false));
        }
        if c.expire_at_ms == 0 {
            // Removing the expiry: no condition applies.
            if at.is_some() {
                self.set_expiry(&c.key, None);
            }
            return Ok(ApplyResult::Expire(at.is_some()));
        }
        let new = c.expire_at_ms;
        let holds = match When::try_from(c.condition) {
            Ok(When::ExpireAlways) => true,
            Ok(When::ExpireIfNone) => at.is_none(),
            Ok(When::ExpireIfSet) => at.is_some(),
            // No expiry counts as never: nothing is later, everything is earlier.
            Ok(When::ExpireIfLater) => at.is_some_and(|a| new > a),
            Ok(When::ExpireIfEarlier) => at.is_none_or(|a| new < a),
            Err(_) => {
                return Ok(ApplyResult::Refused(format!(
                    "unknown expiry condition {}",
                    c.condition
                )))
            }
        };
        if !holds {
            return Ok(ApplyResult::Expire(false));
        }
        if self.now != 0 && new <= self.now {
            // An expiry already past deletes the key (as Redis does).
            self.delete_value(&c.key)?;
        } else {
            self.set_expiry(&c.key, Some(new));
        }
        Ok(ApplyResult::Expire(true))
    }

    /// Deletes engine keys `[start, end)` in this round.
    fn delete_range(&mut self, start: Vec<u8>, end: Vec<u8>) {
        self.wb.delete_range(&start, &end);
        self.overlay.retain(|k, _| *k < start || *k >= end);
        self.deleted.push((start, end));
    }

    /// Whether the group may hold key expiries as of the entries taken (looked up in
    /// the engine once per replica life, then known from the records written).
    fn may_expire(&mut self) -> crate::Result<bool> {
        if let Some(e) = self.expiring {
            return Ok(e);
        }
        let e = match self.cache.expiring {
            Some(e) => e,
            None => self
                .reader
                .any_in(&keys::expiry_key(self.g, b""), &keys::expiry_end(self.g))?,
        };
        self.expiring = Some(e);
        Ok(e)
    }

    /// The expiry of user key `key` as of the entries taken (None: it has none).
    fn expiry_of(&mut self, key: &[u8]) -> crate::Result<Option<u64>> {
        if !self.may_expire()? {
            return Ok(None);
        }
        let Some(v) = self.read(&keys::expiry_key(self.g, key))? else {
            return Ok(None);
        };
        keys::decode_expiry(&v).map(Some).ok_or_else(|| {
            crate::Error::Corruption(format!(
                "group {}: the expiry of key {key:02x?} is {} bytes, not 8",
                self.g,
                v.len()
            ))
        })
    }

    /// Whether an expiry `at` has passed at the command's time (a key lives through the
    /// millisecond of its expiry, as in Redis).
    fn is_past(&self, at: Option<u64>) -> bool {
        self.now != 0 && at.is_some_and(|a| a < self.now)
    }

    /// User key `key`'s value and expiry as of the entries taken; a key whose expiry
    /// has passed at the command's time is absent (its records stay until a write or a
    /// sweep removes them).
    fn live(&mut self, key: &[u8]) -> crate::Result<(Option<Vec<u8>>, Option<u64>)> {
        let Some(v) = self.read(&keys::data_key(self.g, key))? else {
            return Ok((None, None));
        };
        let at = self.expiry_of(key)?;
        if self.is_past(at) {
            return Ok((None, None));
        }
        Ok((Some(v), at))
    }

    /// Writes (`Some`) or removes key `key`'s expiry record in this round.
    fn set_expiry(&mut self, key: &[u8], at: Option<u64>) {
        let k = keys::expiry_key(self.g, key);
        match at {
            Some(at) => {
                let v = at.to_be_bytes().to_vec();
                self.wb.put(&k, &v);
                self.overlay.insert(k, Some(v));
                self.expiring = Some(true);
            }
            None => {
                self.wb.delete(&k);
                self.overlay.insert(k, None);
            }
        }
    }

    /// Writes user key `key` with its expiry: `expire_at` (0: none), or with `keep_ttl`
    /// the one it has unless that has passed (the key was absent: it starts afresh).
    fn put_value(
        &mut self,
        key: &[u8],
        value: &[u8],
        expire_at: u64,
        keep_ttl: bool,
    ) -> crate::Result<()> {
        let k = keys::data_key(self.g, key);
        self.wb.put(&k, value);
        self.overlay.insert(k, Some(value.to_vec()));
        if expire_at != 0 {
            self.set_expiry(key, Some(expire_at));
        } else if keep_ttl {
            let at = self.expiry_of(key)?;
            if self.is_past(at) {
                self.set_expiry(key, None);
            }
        } else if self.may_expire()? {
            self.set_expiry(key, None);
        }
        Ok(())
    }

    /// Deletes user key `key` and its expiry in this round.
    fn delete_value(&mut self, key: &[u8]) -> crate::Result<()> {
        let k = keys::data_key(self.g, key);
        self.wb.delete(&k);
        self.overlay.insert(k, None);
        if self.may_expire()? {
            self.set_expiry(key, None);
        }
        Ok(())
    }

    /// Applies split `sp` (entry `index`, taken with [`Applier::entry`]) into the round's
    /// batch: the keys at or above the split key leave this group, and unless
    /// `child_exists` (its replica here has a state of its own already, e.g. from a
    /// snapshot) they become the state of group `sp.new_group_id` — its data, a copy of
    /// this group's client sessions (a resend of a write applied before the split finds
    /// its answer there), membership `conf`, range, and an applied index of
    /// [`keys::SPLIT_INIT_INDEX`]. Both groups' ranges are recorded with the range epoch
    /// one up. The same batch carries this group's sentinel, so a crash keeps the split
    /// whole or not at all. Returns the child's route as created, or the refusal when the
    /// split no longer fits (another epoch, or the key not strictly inside the range).
    pub fn split(
        &mut self,
        index: u64,
        sp: &proto::SplitCommand,
        conf: &phoenix_raft::ConfState,
        child_exists: bool,
    ) -> crate::Result<Result<SplitDone, String>> {
        let g = self.g;
        let c = sp.new_group_id;
        let (start, end, epoch) = self.range.clone();
        let key = sp.split_key.as_ref();
        if let Some((t, _)) = self.merging {
            return Ok(Err(format!(
                "group {g} is frozen for a merge into group {t}"
            )));
        }
        if sp.epoch != epoch {
            return Ok(Err(format!(
                "split of group {g} asked at range epoch {}, the group is at {epoch}",
                sp.epoch
            )));
        }
        if key <= start.as_slice() || !(end.is_empty() || key < end.as_slice()) {
            return Ok(Err(format!(
                "split key {key:02x?} is not strictly inside group {g}'s range"
            )));
        }
        if c == g || c == 0 {
            return Ok(Err(format!("split of group {g}: bad new group id {c}")));
        }
        let moved_start = keys::data_key(g, key);
        let moved_end = if end.is_empty() {
            keys::data_end(g)
        } else {
            keys::data_key(g, &end)
        };
        let new_epoch = epoch + 1;
        let expiries = if self.may_expire()? {
            Some(keys::expiry_range(g, key, &end))
        } else {
            None
        };
        if !child_exists {
            // The upper keys (and their expiries) as of the entries taken.
            let prefix = 9; // group id and namespace byte
            for (k, v) in &self.as_of(&moved_start, &moved_end)? {
                self.wb.put(&keys::data_key(c, &k[prefix..]), v);
            }
            if let Some((s, e)) = &expiries {
                for (k, v) in &self.as_of(s, e)? {
                    self.wb.put(&keys::expiry_key(c, &k[prefix..]), v);
                }
            }
            // Sessions as of the entries taken: this round's records over the engine's.
            let sess = keys::sessions_prefix(g);
            let mut sess_end = sess.clone();
            if let Some(last) = sess_end.last_mut() {
                *last += 1;
            }
            let mut records: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
            for (k, v) in self.reader.scan(&sess, &sess_end)? {
                let client = keys::session_client(g, &k).ok_or_else(|| {
                    crate::Error::Corruption(format!("group {g}: malformed session key {k:02x?}"))
                })?;
                records.insert(client, v);
            }
            for (client, rec) in self.sessions.iter() {
                records.insert(*client, rec.encode());
            }
            for client in &self.expired {
                records.remove(client);
            }
            for (client, v) in &records {
                self.wb.put(&keys::session_key(c, *client), v);
            }
            if let Some(t) = self.swept_at.or(self.cache.swept_at) {
                self.wb.put(&keys::session_sweep_key(c), &t.to_be_bytes());
            } else if let Some(v) = self.reader.get(&keys::session_sweep_key(g))? {
                self.wb.put(&keys::session_sweep_key(c), &v);
            }
            self.wb.put(
                &keys::applied_key(c),
                &keys::encode_applied(keys::SPLIT_INIT_INDEX, keys::SPLIT_INIT_TERM),
            );
            self.wb.put(&keys::conf_key(c), &keys::encode_conf(conf));
            // Its membership version: its log starts past it, so no change is skipped;
            // a replica of it created earlier from a newer route takes this one.
            self.wb.put(
                &keys::conf_version_key(c),
                &keys::SPLIT_INIT_INDEX.to_be_bytes(),
            );
            let child_range = proto::GroupRange {
                format: keys::RANGE_FORMAT,
                start_key: key.to_vec().into(),
                end_key: end.clone().into(),
                epoch: new_epoch,
                split_index: 0,
                ..proto::GroupRange::default()
            };
            self.wb
                .put(&keys::range_key(c), &child_range.encode_to_vec());
        }
        if moved_start < moved_end {
            self.delete_range(moved_start, moved_end);
        }
        if let Some((s, e)) = expiries {
            self.delete_range(s, e);
        }
        self.range = (start, key.to_vec(), new_epoch);
        self.floor = index;
        let range = self.range_record();
        self.wb.put(&keys::range_key(g), &range.encode_to_vec());
        Ok(Ok(SplitDone {
            start: key.to_vec(),
            end,
            epoch: new_epoch,
        }))
    }

    /// Engine keys `[start, end)` with their values as of the entries taken: the engine,
    /// then this round's range deletions and writes.
    fn as_of(&self, start: &[u8], end: &[u8]) -> crate::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
        let mut out: BTreeMap<Vec<u8>, Vec<u8>> = self
            .reader
            .scan(start, end)?
            .into_iter()
            .filter(|(k, _)| !self.deleted.iter().any(|(s, e)| s <= k && k < e))
            .collect();
        for (k, v) in &self.overlay {
            if k.as_slice() >= start && k.as_slice() < end {
                match v {
                    Some(v) => out.insert(k.clone(), v.clone()),
                    None => out.remove(k),
                };
            }
        }
        Ok(out)
    }

    /// Writes the round: one batch holding every write of the entries taken and the
    /// sentinel of the last one. Returns that (index, term), or `None` if no entry was
    /// taken (nothing written).
    pub fn finish(mut self, writer: &dyn StateWriter) -> crate::Result<Option<(u64, u64)>> {
        let Some((index, term)) = self.last else {
            return Ok(None);
        };
        // Once per replica life: whether the group holds expiries, so that readers can
        // be told it holds none (node.rs) and skip looking for them.
        if self.expiring.is_none() {
            self.may_expire()?;
        }
        let mut written = Vec::with_capacity(self.sessions.len());
        for (client, rec) in std::mem::take(&mut self.sessions) {
            let v = rec.encode();
            self.wb.put(&keys::session_key(self.g, client), &v);
            written.push((client, rec, v.len()));
        }
        self.wb.put(
            &keys::applied_key(self.g),
            &keys::encode_applied(index, term),
        );
        writer.write(self.wb)?;
        // Written: the cache may hold them again.
        self.cache.put_all(written);
        if self.swept_at.is_some() {
            self.cache.swept_at = self.swept_at;
        }
        if self.expiring.is_some() {
            self.cache.expiring = self.expiring;
        }
        Ok(Some((index, term)))
    }
}

#[cfg(test)]
mod tests {
    //! The log-as-WAL property under crashes: whatever prefix of the engine batches a
    //! crash keeps, restarting from its sentinel and replaying the log after it gives
    //! the state (and results) of applying everything once.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use phoenix_engine::write_batch::BatchRecord;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    type Model = BTreeMap<Vec<u8>, Vec<u8>>;

    /// An engine as a sorted map that records the state after every batch.
    #[derive(Default)]
    struct Recorder {
        state: RefCell<Model>,
        after_batch: RefCell<Vec<Model>>,
        /// The next write fails (an I/O error), writing nothing.
        fail_next: std::cell::Cell<bool>,
    }

    impl StateReader for Recorder {
        fn get(&self, key: &[u8]) -> crate::Result<Option<Vec<u8>>> {
            Ok(self.state.borrow().get(key).cloned())
        }

        fn scan(&self, start: &[u8], end: &[u8]) -> crate::Result<Vec<(Vec<u8>, Vec<u8>)>> {
            Ok(self
                .state
                .borrow()
                .range(start.to_vec()..end.to_vec())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        }
    }

    impl StateWriter for Recorder {
        fn write(&self, batch: WriteBatch) -> crate::Result<()> {
            if self.fail_next.replace(false) {
                return Err(crate::Error::Corruption("injected write failure".into()));
            }
            let mut st = self.state.borrow_mut();
            for r in batch.iter() {
                match r {
                    BatchRecord::Put(k, v) => {
                        st.insert(k.to_vec(), v.to_vec());
                    }
                    BatchRecord::Delete(k) => {
                        st.remove(k);
                    }
                    BatchRecord::RangeDelete(s, e) => {
                        st.retain(|k, _| !(s <= k.as_slice() && k.as_slice() < e));
                    }
                }
            }
            self.after_batch.borrow_mut().push(st.clone());
            Ok(())
        }
    }

    /// A random key-value command over six keys, with expiries around its time (so keys
    /// expire, are swept and come back within a few commands).
    fn random_command(rng: &mut ChaCha8Rng) -> Vec<u8> {
        let key = |rng: &mut ChaCha8Rng| format!("k{}", rng.gen_range(0..6)).into_bytes();
        let value = |rng: &mut ChaCha8Rng| format!("v{}", rng.gen_range(0..4)).into_bytes();
        let now = rng.gen_range(1_000..1_010);
        // An expiry around now (0: none).
        let at = |rng: &mut ChaCha8Rng| {
            if rng.gen_bool(0.5) {
                0
            } else {
                rng.gen_range(995..1_015)
            }
        };
        let cmd = match rng.gen_range(0..14) {
            0..=3 => proto::kv_command::Cmd::Batch(proto::BatchMutations {
                mutations: (0..rng.gen_range(1..3))
                    .map(|_| proto::Mutation {
                        expire_at_ms: at(rng),
                        keep_ttl: rng.gen_bool(0.2),
                        ttl_ms: 0,
                        op: if rng.gen_bool(0.2) {
                            proto::MutationOp::Delete as i32
                        } else {
                            proto::MutationOp::Put as i32
                        },
                        key: key(rng).into(),
                        value: value(rng).into(),
                    })
                    .collect(),
            }),
            4 => {
                let (a, b) = (key(rng), key(rng));
                proto::kv_command::Cmd::DeleteRange(proto::KeyRange {
                    start: a.min(b.clone()).into(),
                    end: if rng.gen_bool(0.2) {
                        Vec::new().into()
                    } else {
                        b.into()
                    },
                })
            }
            5..=6 => proto::kv_command::Cmd::Cas(proto::CasCommand {
                expire_at_ms: at(rng),
                keep_ttl: rng.gen_bool(0.2),
                key: key(rng).into(),
                expect_exists: rng.gen_bool(0.7),
                expected: value(rng).into(),
                new_value: value(rng).into(),
                delete: rng.gen_bool(0.1),
            }),
            7 => proto::kv_command::Cmd::Incr(proto::IncrCommand {
                key: key(rng).into(),
                by: rng.gen_range(-2..3),
            }),
            8..=10 => proto::kv_command::Cmd::Expire(proto::ExpireCommand {
                key: key(rng).into(),
                expire_at_ms: at(rng),
                condition: rng.gen_range(0..5),
            }),
            _ => proto::kv_command::Cmd::SweepExpired(proto::SweepExpiredCommand {
                up_to_ms: rng.gen_range(995..1_015),
                keys: (0..rng.gen_range(0..4)).map(|_| key(rng).into()).collect(),
            }),
        };
        proto::KvCommand {
            // Now and then a proposer that predates expiries: nothing is expired.
            now_ms: if rng.gen_bool(0.1) { 0 } else { now },
            cmd: Some(cmd),
            session: None,
            epoch: 0,
        }
        .encode_to_vec()
    }

    /// A workload of writes from 3 clients with sessions, some resent (the same entry
    /// data again, as a client's resend after an unknown outcome is), and clocks that
    /// advance, now and then by hours (so sessions expire: records lose their results or
    /// go). A resend comes within its deadline (ten minutes), as the client's do.
    /// Returns the entries and, per entry, the index of the first copy if it is a
    /// resend.
    fn session_workload(rng: &mut ChaCha8Rng, n: usize) -> (Vec<Vec<u8>>, Vec<Option<usize>>) {
        let mut next_seq = [1u64; 3];
        let mut time_ms = rng.gen_range(0..1u64 << 40);
        let mut entries: Vec<Vec<u8>> = Vec::new();
        let mut first_of: Vec<Option<usize>> = Vec::new();
        // (entry index, client) of each write, for resends.
        let mut sent: Vec<(usize, usize)> = Vec::new();
        for _ in 0..n {
            if !sent.is_empty() && rng.gen_bool(0.25) {
                // A resend comes within its request's deadline: one of the last writes.
                let recent = &sent[sent.len().saturating_sub(4)..];
                let (i, _) = recent[rng.gen_range(0..recent.len())];
                entries.push(entries[i].clone());
                first_of.push(Some(first_of[i].unwrap_or(i)));
                continue;
            }
            let client = rng.gen_range(0..3);
            let seq = next_seq[client];
            next_seq[client] += 1;
            if rng.gen_bool(0.1) {
                // An idle hour or three: sweeps expire sessions; nothing from before is
                // resent any more (past every deadline).
                time_ms += rng.gen_range(0..3 * SESSION_IDLE_EXPIRY_MS);
                sent.clear();
            } else {
                time_ms += rng.gen_range(0..60_000);
            }
            let mut cmd = proto::KvCommand::decode(random_command(rng).as_slice()).unwrap();
            cmd.session = Some(proto::ClientSession {
                client_id: client as u64 + 1,
                seq,
                // Acknowledged so far: none of the last few, so resends stay valid.
                acked_below: seq.saturating_sub(8).max(1),
                time_ms,
            });
            sent.push((entries.len(), client));
            entries.push(cmd.encode_to_vec());
            first_of.push(None);
        }
        (entries, first_of)
    }

    /// A resent write is applied once: the state equals that of the workload without
    /// the resends (session records aside), and each resend gets its first result. Any
    /// crash prefix then replay gives the same state and results.
    fn run_sessions(seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let g = 5;
        let n = rng.gen_range(1..60);
        let (entries, first_of) = session_workload(&mut rng, n);
        let engine = Recorder::default();
        let results = apply_rounds(&engine, g, &entries, 1, &[entries.len()]);
        let firsts: Vec<Vec<u8>> = entries
            .iter()
            .zip(&first_of)
            .filter(|(_, f)| f.is_none())
            .map(|(e, _)| e.clone())
            .collect();
        let once = Recorder::default();
        apply_rounds(&once, g, &firsts, 1, &[firsts.len()]);
        let data_only = |m: &Model| -> Model {
            m.iter()
                .filter(|(k, _)| k.get(8) == Some(&keys::NS_DATA))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        assert_eq!(
            data_only(&engine.state.borrow()),
            data_only(&once.state.borrow()),
            "seed {seed}: a resend was applied again"
        );
        for (i, f) in first_of.iter().enumerate() {
            if let Some(f) = f {
                assert!(
                    results[i] == results[*f]
                        || matches!(results[i], ApplyResult::SessionExpired { .. }),
                    "seed {seed}: resend {i} got {:?}, the first copy {:?}",
                    results[i],
                    results[*f]
                );
            }
        }
    }

    /// Applies `entries` (index = position + 1) in rounds of the given sizes.
    fn apply_rounds(
        engine: &Recorder,
        g: u64,
        entries: &[Vec<u8>],
        first_index: u64,
        rounds: &[usize],
    ) -> Vec<ApplyResult> {
        let mut results = Vec::new();
        let mut i = 0;
        // The replica's cache lives across rounds; a restart starts with an empty one.
        let mut cache = SessionCache::default();
        for &n in rounds {
            let mut a = Applier::new(g, engine, &mut cache);
            for data in entries.iter().skip(i).take(n) {
                let index = first_index + i as u64;
                a.entry(index, 1);
                results.push(a.kv(index, data).unwrap());
                i += 1;
            }
            a.finish(engine).unwrap();
        }
        results
    }

    /// A put of `key` = `value` by session (`client`, `seq`), nothing acknowledged, at
    /// proposer time `time_ms`.
    fn session_put(client: u64, seq: u64, time_ms: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
        proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: Some(proto::ClientSession {
                client_id: client,
                seq,
                acked_below: 1,
                time_ms,
            }),
            cmd: Some(proto::kv_command::Cmd::Batch(proto::BatchMutations {
                mutations: vec![proto::Mutation {
                    expire_at_ms: 0,
                    keep_ttl: false,
                    ttl_ms: 0,
                    op: proto::MutationOp::Put as i32,
                    key: key.to_vec().into(),
                    value: value.to_vec().into(),
                }],
            })),
        }
        .encode_to_vec()
    }

    /// Sizes of apply rounds (1 to 8 entries each) that take `n` entries in all.
    fn random_rounds(rng: &mut ChaCha8Rng, n: usize) -> Vec<usize> {
        let mut rounds = Vec::new();
        let mut left = n;
        while left > 0 {
            let r = rng.gen_range(1..=left.min(8));
            rounds.push(r);
            left -= r;
        }
        rounds
    }

    fn run(seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let g = 7;
        let n = rng.gen_range(1..40);
        let entries: Vec<Vec<u8>> = if rng.gen_bool(0.5) {
            session_workload(&mut rng, n).0
        } else {
            (0..n).map(|_| random_command(&mut rng)).collect()
        };
        let rounds = random_rounds(&mut rng, n);
        let engine = Recorder::default();
        let results = apply_rounds(&engine, g, &entries, 1, &rounds);
        let want = engine.state.borrow().clone();
        let states = engine.after_batch.borrow().clone();
        // A crash keeps the first `kept` batches (the engine flushes memtables in order,
        // a batch never spans two); the node restarts at their sentinel and replays.
        for kept in 0..states.len() {
            let restarted = Recorder::default();
            *restarted.state.borrow_mut() = states[kept].clone();
            let applied = restarted
                .get(&keys::applied_key(g))
                .unwrap()
                .and_then(|v| keys::decode_applied(&v))
                .map_or(0, |(i, _)| i);
            let rest = &entries[applied as usize..];
            let replayed = apply_rounds(&restarted, g, rest, applied + 1, &[rest.len()]);
            assert_eq!(
                *restarted.state.borrow(),
                want,
                "seed {seed}: a crash keeping {} of {} batches (sentinel {applied}) then \
                 replay gives another state",
                kept + 1,
                states.len()
            );
            assert_eq!(
                replayed,
                results[applied as usize..],
                "seed {seed}: replayed results differ"
            );
        }
    }

    /// `PHOENIX_SEED`, or a random seed (the failing runs print theirs).
    fn test_seed() -> u64 {
        std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random)
    }

    #[test]
    fn any_crash_prefix_replays_to_the_same_state() {
        let seed = test_seed();
        let runs: u64 = std::env::var("PHOENIX_APPLY_RUNS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2000);
        for s in seed..seed + runs {
            if let Err(e) = std::panic::catch_unwind(|| {
                run(s);
                run_sessions(s);
            }) {
                eprintln!("replay with PHOENIX_SEED={s} PHOENIX_APPLY_RUNS=1");
                std::panic::resume_unwind(e);
            }
        }
    }

    /// Finding: a compare-and-swap after a range deletion in the same round must read
    /// past the deletion without the round writing anything before its one batch.
    #[test]
    fn cas_after_range_delete_reads_through_the_round() {
        let engine = Recorder::default();
        let g = 3;
        let put = |k: &str, v: &str| put_cmd(k, v, 0, None);
        let del_range = delete_range_cmd(b"a", b"z");
        let cas = proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::Cas(proto::CasCommand {
                key: b"k".to_vec().into(),
                expect_exists: false,
                new_value: b"fresh".to_vec().into(),
                ..Default::default()
            })),
        }
        .encode_to_vec();
        apply_rounds(&engine, g, &[put("k", "old")], 1, &[1]);
        let results = apply_rounds(&engine, g, &[del_range, cas], 2, &[2]);
        assert_eq!(
            results[1],
            ApplyResult::Cas {
                succeeded: true,
                current: None
            }
        );
        assert_eq!(engine.after_batch.borrow().len(), 2, "one batch per round");
        assert_eq!(
            engine.get(&keys::data_key(g, b"k")).unwrap(),
            Some(b"fresh".to_vec())
        );
    }

    /// A range delete of [`start`, `end`), no session.
    fn delete_range_cmd(start: &[u8], end: &[u8]) -> Vec<u8> {
        proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::DeleteRange(proto::KeyRange {
                start: start.to_vec().into(),
                end: end.to_vec().into(),
            })),
        }
        .encode_to_vec()
    }

    fn incr_cmd(key: &str, by: i64, session: Option<(u64, u64)>) -> Vec<u8> {
        proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: session.map(|(client_id, seq)| proto::ClientSession {
                client_id,
                seq,
                acked_below: 1,
                time_ms: 1,
            }),
            cmd: Some(proto::kv_command::Cmd::Incr(proto::IncrCommand {
                key: key.as_bytes().to_vec().into(),
                by,
            })),
        }
        .encode_to_vec()
    }

    /// An increment reads through the round (a put and a range delete before it in the
    /// same round), leaves a failed key as it was, and a resend in its session is
    /// answered with its first result, in a later round or after a restart (a fresh
    /// cache), never applied twice.
    #[test]
    fn increments_apply_once_and_read_through_the_round() {
        let engine = Recorder::default();
        let g = 5;
        let put = |k: &str, v: &str| put_cmd(k, v, 0, None);
        let del_range = delete_range_cmd(b"a", b"z");
        let value = |k: &str| engine.get(&keys::data_key(g, k.as_bytes())).unwrap();
        let results = apply_rounds(
            &engine,
            g,
            &[
                put("n", "41"),
                incr_cmd("n", 1, Some((7, 1))),
                put("s", "text"),
                incr_cmd("s", 1, Some((7, 2))),
                put("m", "9223372036854775807"),
                incr_cmd("m", 1, Some((7, 3))),
                incr_cmd("fresh", -3, None),
            ],
            1,
            &[7],
        );
        assert_eq!(results[1], ApplyResult::Incr(Ok(42)));
        assert_eq!(
            results[3],
            ApplyResult::Incr(Err(proto::IncrFailure::NotAnInteger))
        );
        assert_eq!(
            results[5],
            ApplyResult::Incr(Err(proto::IncrFailure::Overflow))
        );
        assert_eq!(results[6], ApplyResult::Incr(Ok(-3)));
        assert_eq!(engine.after_batch.borrow().len(), 1, "one batch per round");
        assert_eq!(value("n"), Some(b"42".to_vec()));
        assert_eq!(value("s"), Some(b"text".to_vec()));
        assert_eq!(value("m"), Some(b"9223372036854775807".to_vec()));
        assert_eq!(value("fresh"), Some(b"-3".to_vec()));
        // Resends (a fresh cache: the records are read back from the engine), then a
        // range delete and a new increment in one round: it starts from nothing.
        let results = apply_rounds(
            &engine,
            g,
            &[
                incr_cmd("n", 1, Some((7, 1))),
                incr_cmd("s", 1, Some((7, 2))),
                put("s", "5"),
                incr_cmd("s", 1, Some((7, 2))),
                incr_cmd("m", 1, Some((7, 3))),
                del_range,
                incr_cmd("n", 10, Some((7, 4))),
            ],
            8,
            &[2, 3, 2],
        );
        assert_eq!(results[0], ApplyResult::Incr(Ok(42)));
        assert_eq!(
            results[1],
            ApplyResult::Incr(Err(proto::IncrFailure::NotAnInteger))
        );
        // (Its first outcome, although the key holds an integer now.)
        assert_eq!(
            results[3],
            ApplyResult::Incr(Err(proto::IncrFailure::NotAnInteger))
        );
        assert_eq!(
            results[4],
            ApplyResult::Incr(Err(proto::IncrFailure::Overflow))
        );
        assert_eq!(results[6], ApplyResult::Incr(Ok(10)));
        assert_eq!(value("n"), Some(b"10".to_vec()));
        // (The range delete took the rest.)
        assert_eq!(value("s"), None);
    }

    /// Increment results round-trip through the session record (tag 3), and a record
    /// with an unknown failure code is corruption, not a guess.
    #[test]
    fn increment_results_in_the_session_record() {
        let mut rec = Session::default();
        rec.record(1, ApplyResult::Incr(Ok(i64::MIN)));
        rec.record(2, ApplyResult::Incr(Err(proto::IncrFailure::Overflow)));
        rec.record(3, ApplyResult::Incr(Err(proto::IncrFailure::NotAnInteger)));
        rec.record(4, ApplyResult::Incr(Ok(7)));
        let v = rec.encode();
        let back = Session::decode(&v).unwrap();
        assert_eq!(back, rec);
        assert_eq!(back.result(1, 1), Some(ApplyResult::Incr(Ok(i64::MIN))));
        assert_eq!(
            back.result(1, 2),
            Some(ApplyResult::Incr(Err(proto::IncrFailure::Overflow)))
        );
        // The failure byte of the last result (tag, failure, 8 value bytes at the end).
        let mut bad = v.clone();
        let at = bad.len() - 9;
        assert_eq!(bad[at - 1], 3);
        bad[at] = 9;
        assert!(Session::decode(&bad)
            .unwrap_err()
            .contains("increment failure 9"));
    }

    /// A round whose batch fails to write leaves the session cache without its records:
    /// the next round (same cache) reads the engine's, so the failed write is applied
    /// when it comes again, and an older one is still answered from its record.
    #[test]
    fn a_failed_round_leaves_no_session_record_in_the_cache() {
        let engine = Recorder::default();
        let g = 4;
        let put = |seq: u64, v: &str| session_put(9, seq, 1, b"k", v.as_bytes());
        let mut cache = SessionCache::default();
        let mut round = |index: u64, data: &[u8]| {
            let mut a = Applier::new(g, &engine, &mut cache);
            a.entry(index, 1);
            let r = a.kv(index, data).unwrap();
            a.finish(&engine).map(|_| r)
        };
        round(1, &put(1, "one")).unwrap();
        engine.fail_next.set(true);
        assert!(round(2, &put(2, "two")).is_err());
        assert_eq!(
            engine.get(&keys::data_key(g, b"k")).unwrap(),
            Some(b"one".to_vec())
        );
        // Replayed after the failure (as a restart would): applied now.
        assert_eq!(round(2, &put(2, "two")).unwrap(), ApplyResult::Done);
        assert_eq!(
            engine.get(&keys::data_key(g, b"k")).unwrap(),
            Some(b"two".to_vec())
        );
        // A resend of the first write is answered from the record, not applied again.
        assert_eq!(round(3, &put(1, "one")).unwrap(), ApplyResult::Done);
        assert_eq!(
            engine.get(&keys::data_key(g, b"k")).unwrap(),
            Some(b"two".to_vec())
        );
        assert_eq!(cache.len(), 1);
    }

    /// Sessions expire by log time: an idle record loses its results (a late resend gets
    /// `SessionExpired` and is not applied again), then goes; the outcome is the same
    /// whatever the apply rounds.
    #[test]
    fn idle_sessions_expire_by_log_time() {
        let g = 6;
        let put = |client: u64, seq: u64, time_ms: u64, v: &str| {
            session_put(client, seq, time_ms, b"k", v.as_bytes())
        };
        let t0 = 1_000_000_000;
        let ttl = SESSION_IDLE_EXPIRY_MS;
        let t1 = t0 + ttl + SESSION_SWEEP_INTERVAL_MS + 1;
        let t2 = t1 + 2 * ttl + SESSION_SWEEP_INTERVAL_MS + 1;
        let entries = vec![
            put(1, 1, t0, "one"),
            // An hour later: client 1's record loses its result.
            put(2, 1, t1, "two"),
            // Client 1's write 1 again, too late: refused, not applied over "two".
            put(1, 1, t1, "one"),
            put(1, 2, t1, "three"),
            // Two more hours: both records go.
            put(3, 1, t2, "four"),
            // Client 1 again, with a new write: a fresh record (not the deleted one).
            put(1, 3, t2, "five"),
        ];
        let mut outcomes = Vec::new();
        for rounds in [vec![6], vec![1, 1, 1, 1, 1, 1], vec![2, 3, 1]] {
            let engine = Recorder::default();
            let results = apply_rounds(&engine, g, &entries, 1, &rounds);
            assert_eq!(results[0], ApplyResult::Done);
            assert_eq!(
                results[2],
                ApplyResult::SessionExpired {
                    client_id: 1,
                    seq: 1
                },
                "rounds {rounds:?}"
            );
            assert_eq!(results[3], ApplyResult::Done);
            assert_eq!(results[5], ApplyResult::Done);
            let st = engine.state.borrow().clone();
            assert_eq!(st.get(&keys::data_key(g, b"k")), Some(&b"five".to_vec()));
            assert_eq!(st.get(&keys::session_key(g, 2)), None, "client 2 idle 2 h");
            assert!(st.contains_key(&keys::session_key(g, 3)));
            // Client 1's record was deleted, then started afresh with write 3 alone
            // (the old one had low water 2 and writes 2 applied).
            let rec = Session::decode(&st[&keys::session_key(g, 1)]).unwrap();
            assert_eq!(
                (rec.low_water, rec.applied.clone()),
                (1, BTreeMap::from([(3, 4)])),
                "rounds {rounds:?}: {rec:?}"
            );
            outcomes.push(st);
        }
        assert!(
            outcomes.windows(2).all(|w| w[0] == w[1]),
            "the same state whatever the rounds"
        );
        // Before the second sweep, client 1's compacted record refuses seq 1 and keeps
        // its low-water mark.
        let engine = Recorder::default();
        apply_rounds(&engine, g, &entries[..2], 1, &[2]);
        let rec = Session::decode(&engine.get(&keys::session_key(g, 1)).unwrap().unwrap()).unwrap();
        assert_eq!((rec.low_water, rec.holds_writes()), (2, false), "{rec:?}");
    }

    /// Finding (fault run, 16 writers on one client session, a node killed): a write
    /// held up while the client's other writers got more than `SESSION_RESULTS_MAX`
    /// writes applied came back `SessionExpired` (the cap dropped the oldest results and
    /// raised the low-water mark past the write that had not arrived). A write not yet
    /// applied is never refused: applied when it comes, once.
    #[test]
    fn a_write_held_up_behind_many_others_is_applied_once() {
        let g = 8;
        // Write 1 has no answer yet: nothing is acknowledged.
        let put = |seq: u64, v: &str| {
            session_put(5, seq, 1_000, format!("k{seq}").as_bytes(), v.as_bytes())
        };
        let n = 3 * SESSION_RESULTS_MAX as u64;
        let mut entries: Vec<Vec<u8>> = (2..=n).map(|seq| put(seq, "later")).collect();
        entries.push(put(1, "first"));
        // Another client overwrites two keys; then resends of the held-up write and of a
        // later one come: answered, not applied again over the other client's values.
        for k in [1, n] {
            entries.push(
                proto::KvCommand {
                    now_ms: 0,
                    epoch: 0,
                    session: None,
                    cmd: Some(proto::kv_command::Cmd::Batch(proto::BatchMutations {
                        mutations: vec![proto::Mutation {
                            expire_at_ms: 0,
                            keep_ttl: false,
                            ttl_ms: 0,
                            op: proto::MutationOp::Put as i32,
                            key: format!("k{k}").into_bytes().into(),
                            value: b"other".to_vec().into(),
                        }],
                    })),
                }
                .encode_to_vec(),
            );
        }
        entries.push(put(1, "first"));
        entries.push(put(n, "later"));
        let engine = Recorder::default();
        let results = apply_rounds(&engine, g, &entries, 1, &[entries.len()]);
        assert!(
            results.iter().all(|r| *r == ApplyResult::Done),
            "{:?}",
            results.iter().find(|r| **r != ApplyResult::Done)
        );
        for k in [1, n] {
            assert_eq!(
                engine
                    .get(&keys::data_key(g, format!("k{k}").as_bytes()))
                    .unwrap(),
                Some(b"other".to_vec()),
                "a resend of write {k} was applied again"
            );
        }
        // The record stays small: the applied writes are runs of sequences.
        let rec = engine.get(&keys::session_key(g, 5)).unwrap().unwrap();
        assert!(rec.len() < 100, "session record of {} bytes", rec.len());
    }

    /// A session record against a model (a map of every kept result): random writes
    /// applied in any order, low-water raises and the cap; encode/decode round trips.
    #[test]
    fn session_record_matches_a_model() {
        let seed: u64 = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        for s in seed..seed + 200 {
            let mut rng = ChaCha8Rng::seed_from_u64(s);
            let mut rec = Session::default();
            let mut model: BTreeMap<u64, ApplyResult> = BTreeMap::new();
            let mut low = 0u64;
            for _ in 0..rng.gen_range(1..400) {
                let seq = low + rng.gen_range(0..64);
                if rng.gen_bool(0.1) {
                    rec.forget_below(seq);
                    low = low.max(seq);
                    model = model.split_off(&low);
                } else if rec.result(0, seq).is_none() {
                    let r = if rng.gen_bool(0.8) {
                        ApplyResult::Done
                    } else {
                        ApplyResult::Refused(format!("r{seq}"))
                    };
                    rec.record(seq, r.clone());
                    model.insert(seq, r);
                }
                for q in low.saturating_sub(2)..low + 66 {
                    let want = if q < low {
                        Some(ApplyResult::SessionExpired {
                            client_id: 0,
                            seq: q,
                        })
                    } else {
                        model.get(&q).cloned()
                    };
                    assert_eq!(rec.result(0, q), want, "seed {s}: sequence {q}");
                }
                assert!(
                    rec.applied
                        .iter()
                        .zip(rec.applied.iter().skip(1))
                        .all(|(a, b)| *a.1 < *b.0),
                    "seed {s}: runs overlap or touch: {:?}",
                    rec.applied
                );
                assert_eq!(Session::decode(&rec.encode()), Ok(rec.clone()), "seed {s}");
            }
        }
    }

    /// Records written by format 1 (every result listed) are read.
    #[test]
    fn session_record_format_1_is_read() {
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&3u64.to_be_bytes()); // low water
        v1.extend_from_slice(&77u64.to_be_bytes()); // last_ms
        v1.extend_from_slice(&3u32.to_be_bytes());
        for seq in [3u64, 4] {
            v1.extend_from_slice(&seq.to_be_bytes());
            v1.push(0); // done
        }
        v1.extend_from_slice(&6u64.to_be_bytes());
        v1.extend_from_slice(&[1, 1, 1]); // cas: succeeded, found
        v1.extend_from_slice(&2u32.to_be_bytes());
        v1.extend_from_slice(b"ab");
        let rec = Session::decode(&v1).unwrap();
        assert_eq!((rec.low_water, rec.last_ms), (3, 77));
        assert_eq!(rec.result(0, 3), Some(ApplyResult::Done));
        assert_eq!(rec.result(0, 4), Some(ApplyResult::Done));
        assert_eq!(rec.result(0, 5), None);
        assert_eq!(
            rec.result(0, 6),
            Some(ApplyResult::Cas {
                succeeded: true,
                current: Some(b"ab".to_vec())
            })
        );
        assert_eq!(rec.encode()[0], SESSION_FORMAT);
        assert!(Session::decode(&[9u8]).unwrap_err().contains("format 9"));
    }

    /// Compare-and-swap results past the cap are forgotten (a resend gets
    /// `SessionExpired`) without refusing a write that has not arrived yet; a sequence
    /// number no run can hold is refused, not a panic.
    #[test]
    fn cas_results_past_the_cap_are_forgotten_not_the_writes_held_up() {
        let g = 9;
        let cas = |seq: u64| {
            proto::KvCommand {
                now_ms: 0,
                epoch: 0,
                session: Some(proto::ClientSession {
                    client_id: 5,
                    seq,
                    acked_below: 1,
                    time_ms: 1_000,
                }),
                cmd: Some(proto::kv_command::Cmd::Cas(proto::CasCommand {
                    key: format!("c{seq}").into_bytes().into(),
                    expect_exists: false,
                    new_value: b"v".to_vec().into(),
                    ..Default::default()
                })),
            }
            .encode_to_vec()
        };
        let n = 2 * SESSION_RESULTS_MAX as u64;
        let mut entries: Vec<Vec<u8>> = (2..=n).map(cas).collect();
        entries.push(cas(1)); // held up, arrives last
        entries.push(cas(2)); // resend of the oldest: its result was dropped
        entries.push(cas(n)); // resend of a recent one: answered from the record
        entries.push(cas(u64::MAX));
        let engine = Recorder::default();
        let results = apply_rounds(&engine, g, &entries, 1, &[entries.len()]);
        let ok = ApplyResult::Cas {
            succeeded: true,
            current: None,
        };
        assert_eq!(results[n as usize - 1], ok, "the held-up write is applied");
        assert_eq!(
            results[n as usize],
            ApplyResult::SessionExpired {
                client_id: 5,
                seq: 2
            }
        );
        assert_eq!(results[n as usize + 1], ok);
        assert!(
            matches!(&results[n as usize + 2], ApplyResult::Refused(why) if why.contains("out of range")),
            "{:?}",
            results[n as usize + 2]
        );
        let rec = Session::decode(&engine.get(&keys::session_key(g, 5)).unwrap().unwrap()).unwrap();
        assert!(rec.results.len() <= SESSION_RESULTS_MAX);
    }

    /// Decoding never panics: random bytes and mutations of valid records are either a
    /// record or an error.
    #[test]
    fn session_decode_survives_garbage() {
        let seed: u64 = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut valid = Session::default();
        for seq in [3u64, 4, 9, 10, 11] {
            valid.record(seq, ApplyResult::Done);
        }
        valid.record(
            12,
            ApplyResult::Cas {
                succeeded: false,
                current: Some(b"x".to_vec()),
            },
        );
        let base = valid.encode();
        assert_eq!(Session::decode(&base), Ok(valid));
        for i in 0..20_000 {
            let bytes: Vec<u8> = if i % 2 == 0 {
                (0..rng.gen_range(0..80)).map(|_| rng.gen()).collect()
            } else {
                let mut b = base.clone();
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(0..b.len());
                    b[at] = rng.gen();
                }
                b.truncate(rng.gen_range(0..=b.len()));
                b
            };
            if let Ok(rec) = Session::decode(&bytes) {
                // Whatever decodes is a record that works.
                let _ = rec.result(1, 11);
                let _ = rec.encode();
            }
        }
    }

    fn put_cmd(k: &str, v: &str, epoch: u64, session: Option<proto::ClientSession>) -> Vec<u8> {
        proto::KvCommand {
            now_ms: 0,
            epoch,
            session,
            cmd: Some(proto::kv_command::Cmd::Batch(proto::BatchMutations {
                mutations: vec![proto::Mutation {
                    expire_at_ms: 0,
                    keep_ttl: false,
                    ttl_ms: 0,
                    op: proto::MutationOp::Put as i32,
                    key: k.as_bytes().to_vec().into(),
                    value: v.as_bytes().to_vec().into(),
                }],
            })),
        }
        .encode_to_vec()
    }

    /// A merge: the source freezes at its prepare (epoch one up, every later write
    /// refused, a split too), the target takes its keys, client sessions and range in one
    /// round (a resend of a write the source applied gets its first answer from the
    /// target), the source's record says merged, and a rollback thaws a frozen group.
    #[test]
    fn a_merge_freezes_the_source_and_moves_it_into_the_target() {
        let engine = Recorder::default();
        let (t, src) = (3, 4);
        let mut cache = SessionCache::new(Arc::default());
        let session = |seq| proto::ClientSession {
            client_id: 77,
            seq,
            acked_below: 1,
            time_ms: 1,
        };
        let cas = |k: &str| {
            proto::KvCommand {
                now_ms: 0,
                epoch: 1,
                session: Some(session(2)),
                cmd: Some(proto::kv_command::Cmd::Cas(proto::CasCommand {
                    expire_at_ms: 0,
                    keep_ttl: false,
                    key: k.as_bytes().to_vec().into(),
                    expect_exists: true,
                    expected: b"old".to_vec().into(),
                    delete: false,
                    new_value: b"swapped".to_vec().into(),
                })),
            }
            .encode_to_vec()
        };
        // The source [m, ∞): two keys, one of them swapped in a session.
        {
            let mut a = Applier::new(src, &engine, &mut cache);
            a.set_range(b"m", b"", 1);
            a.entry(1, 1);
            a.kv(1, &put_cmd("n", "old", 1, Some(session(1)))).unwrap();
            a.entry(2, 1);
            a.kv(2, &put_cmd("q", "old", 1, None)).unwrap();
            a.entry(3, 1);
            let r = a.kv(3, &cas("n")).unwrap();
            assert!(matches!(
                r,
                ApplyResult::Cas {
                    succeeded: true,
                    ..
                }
            ));
            a.finish(&engine).unwrap();
        }
        let mut src_cache = SessionCache::new(Arc::default());
        let mut a = Applier::new(src, &engine, &mut src_cache);
        a.set_range(b"m", b"", 1);
        let prep = proto::PrepareMergeCommand {
            target: t,
            epoch: 1,
        };
        a.entry(4, 1);
        assert!(a
            .prepare_merge(
                4,
                &proto::PrepareMergeCommand {
                    target: t,
                    epoch: 0
                }
            )
            .is_err());
        assert_eq!(a.prepare_merge(4, &prep), Ok(2));
        // Frozen: writes at any epoch are refused, a second prepare and a split too.
        a.entry(5, 1);
        assert_eq!(
            a.kv(5, &put_cmd("n", "late", 2, None)).unwrap(),
            ApplyResult::StaleEpoch { request_epoch: 2 }
        );
        assert!(a
            .prepare_merge(
                5,
                &proto::PrepareMergeCommand {
                    target: t,
                    epoch: 2
                }
            )
            .is_err());
        let conf = phoenix_raft::ConfState::with_voters([1, 2, 3]);
        let sp = proto::SplitCommand {
            split_key: b"p".to_vec().into(),
            new_group_id: 9,
            epoch: 2,
        };
        assert!(a.split(5, &sp, &conf, false).unwrap().is_err());
        a.finish(&engine).unwrap();
        // The target [∅, m) takes it in.
        let commit = proto::CommitMergeCommand {
            source: src,
            source_epoch: 2,
            prepare_index: 4,
            source_start: b"m".to_vec().into(),
            source_end: Vec::new().into(),
            target_epoch: 1,
        };
        let mut a = Applier::new(t, &engine, &mut cache);
        a.set_range(b"", b"m", 1);
        let commit_entry = proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::CommitMerge(commit.clone())),
        }
        .encode_to_vec();
        // Frozen at 4 and applied to 5 here: no wait. Frozen at another index: wait.
        assert_eq!(a.merge_waits_for(&commit_entry).unwrap(), None);
        let other = proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::CommitMerge(
                proto::CommitMergeCommand {
                    prepare_index: 9,
                    ..commit.clone()
                },
            )),
        }
        .encode_to_vec();
        assert_eq!(a.merge_waits_for(&other).unwrap(), Some(src));
        assert_eq!(
            a.merge_waits_for(&put_cmd("a", "v", 1, None)).unwrap(),
            None
        );
        a.entry(7, 1);
        a.kv(7, &put_cmd("a", "mine", 1, None)).unwrap();
        a.entry(8, 1);
        let stale = proto::CommitMergeCommand {
            target_epoch: 2,
            ..commit.clone()
        };
        assert!(a.commit_merge(8, &stale).unwrap().is_err());
        let not_frozen_here = proto::CommitMergeCommand {
            prepare_index: 3,
            ..commit.clone()
        };
        assert!(
            a.commit_merge(8, &not_frozen_here).is_err(),
            "a source not frozen for it"
        );
        let done = a.commit_merge(8, &commit).unwrap().unwrap();
        assert_eq!(
            (done.start.as_slice(), done.end.as_slice(), done.epoch),
            (&b""[..], &b""[..], 3)
        );
        // In the same round: the source's keys are the target's, at its new epoch.
        a.entry(9, 1);
        assert_eq!(
            a.kv(9, &put_cmd("r", "v", 3, None)).unwrap(),
            ApplyResult::Done
        );
        // A resend of the source's compare-and-swap gets its first answer.
        a.entry(10, 1);
        let resent = proto::KvCommand {
            epoch: 3,
            ..proto::KvCommand::decode(cas("n").as_slice()).unwrap()
        };
        match a.kv(10, &resent.encode_to_vec()).unwrap() {
            ApplyResult::Cas {
                succeeded: true,
                current,
            } => {
                assert_eq!(current.as_deref(), Some(&b"old"[..]))
            }
            other => panic!("resend after the merge: {other:?}"),
        }
        assert_eq!(a.finish(&engine).unwrap(), Some((10, 1)));
        // A second copy of the commit (proposed again in a new term, say) does not wait
        // for the source (gone into this group): it is refused at the new epoch.
        let mut a = Applier::new(t, &engine, &mut cache);
        a.set_range(b"", b"", 3);
        let again = proto::KvCommand {
            now_ms: 0,
            epoch: 0,
            session: None,
            cmd: Some(proto::kv_command::Cmd::CommitMerge(commit.clone())),
        }
        .encode_to_vec();
        assert_eq!(a.merge_waits_for(&again).unwrap(), None);
        a.entry(11, 1);
        match a.kv(11, &again).unwrap() {
            ApplyResult::CommitMerge(m) => assert!(a.commit_merge(11, &m).unwrap().is_err()),
            other => panic!("{other:?}"),
        }
        drop(a);
        let get = |g, k: &str| engine.get(&keys::data_key(g, k.as_bytes())).unwrap();
        assert_eq!(get(t, "n").as_deref(), Some(&b"swapped"[..]));
        assert_eq!(get(t, "q").as_deref(), Some(&b"old"[..]));
        assert_eq!(get(t, "a").as_deref(), Some(&b"mine"[..]));
        assert_eq!(get(t, "r").as_deref(), Some(&b"v"[..]));
        let rec = |g| {
            proto::GroupRange::decode(engine.get(&keys::range_key(g)).unwrap().unwrap().as_slice())
                .unwrap()
        };
        assert_eq!(
            (rec(src).merged_into, rec(src).format),
            (t, keys::RANGE_FORMAT_MERGE)
        );
        let tr = rec(t);
        assert_eq!(
            (
                tr.start_key.as_ref(),
                tr.end_key.as_ref(),
                tr.epoch,
                tr.split_index
            ),
            (&b""[..], &b""[..], 3, 8)
        );
        // A rollback thaws a frozen group (epoch on again), and fences one whose prepare
        // has not come yet.
        let mut c2 = SessionCache::new(Arc::default());
        let mut a = Applier::new(11, &engine, &mut c2);
        a.set_range(b"", b"", 5);
        a.entry(1, 1);
        a.prepare_merge(
            1,
            &proto::PrepareMergeCommand {
                target: 12,
                epoch: 5,
            },
        )
        .unwrap();
        let rb = proto::RollbackMergeCommand {
            target: 12,
            epoch: 5,
        };
        assert_eq!(a.rollback_merge(&rb), Ok(7));
        a.entry(2, 1);
        assert_eq!(
            a.kv(2, &put_cmd("k", "v", 7, None)).unwrap(),
            ApplyResult::Done
        );
        let mut b = Applier::new(13, &engine, &mut c2);
        b.set_range(b"", b"", 5);
        assert_eq!(b.rollback_merge(&rb), Ok(6));
        b.entry(1, 1);
        assert!(b
            .prepare_merge(
                1,
                &proto::PrepareMergeCommand {
                    target: 12,
                    epoch: 5
                }
            )
            .is_err());
    }

    /// Two records of one client merged: a sequence applied in either is applied, with
    /// its result; the higher low-water mark stands.
    #[test]
    fn session_records_merge_by_sequence() {
        let mut a = Session::default();
        a.record(3, ApplyResult::Done);
        a.record(4, ApplyResult::Refused("no".into()));
        let mut b = Session::default();
        b.record(1, ApplyResult::Done);
        b.record(
            5,
            ApplyResult::Cas {
                succeeded: false,
                current: None,
            },
        );
        b.forget_below(2);
        a.merge_from(&b);
        assert_eq!(a.low_water, 2);
        assert_eq!(
            a.result(9, 1),
            Some(ApplyResult::SessionExpired {
                client_id: 9,
                seq: 1
            })
        );
        assert_eq!(a.result(9, 2), None);
        assert_eq!(a.result(9, 3), Some(ApplyResult::Done));
        assert_eq!(a.result(9, 4), Some(ApplyResult::Refused("no".into())));
        assert_eq!(
            a.result(9, 5),
            Some(ApplyResult::Cas {
                succeeded: false,
                current: None
            })
        );
        assert_eq!(a.result(9, 6), None);
        // The record taken in has runs below this one's low-water mark (a chaos run
        // found the merged record then broke the format's invariant): they go.
        let mut high = Session::default();
        high.record(48, ApplyResult::Done);
        high.forget_below(48);
        let mut low = Session::default();
        low.record(30, ApplyResult::Refused("old".into()));
        low.record(50, ApplyResult::Done);
        high.merge_from(&low);
        assert_eq!(high.low_water, 48);
        assert_eq!(
            high.result(9, 30),
            Some(ApplyResult::SessionExpired {
                client_id: 9,
                seq: 30
            })
        );
        assert_eq!(high.result(9, 50), Some(ApplyResult::Done));
        assert!(high.results.is_empty(), "{high:?}");
        Session::decode(&high.encode()).unwrap();
    }

    /// A split in the middle of a round moves the upper keys as the round's earlier
    /// entries left them (writes and range deletions not yet in the engine), copies the
    /// client sessions, records both ranges at the next epoch, and refuses what follows
    /// it in the round at the old epoch or outside the narrowed range — all in the
    /// round's one batch with its sentinel.
    /// Key expiry as a model: each key's value and expiry record (kept until a write, a
    /// delete or a sweep removes it), and the command's time deciding what is live.
    #[derive(Default)]
    struct ExpiryModel {
        keys: BTreeMap<Vec<u8>, (Vec<u8>, Option<u64>)>,
    }

    impl ExpiryModel {
        fn live(&self, k: &[u8], now: u64) -> Option<(Vec<u8>, Option<u64>)> {
            let (v, at) = self.keys.get(k)?;
            let past = now != 0 && at.is_some_and(|a| a < now);
            (!past).then(|| (v.clone(), *at))
        }

        fn put(&mut self, k: &[u8], v: &[u8], at: u64, keep: bool, now: u64) {
            let kept = if at != 0 {
                Some(at)
            } else if keep {
                // A passed expiry is not kept: the key was absent.
                match self.keys.get(k) {
                    Some((_, Some(a))) if !(now != 0 && *a < now) => Some(*a),
                    _ => None,
                }
            } else {
                None
            };
            self.keys.insert(k.to_vec(), (v.to_vec(), kept));
        }

        fn apply(&mut self, cmd: &proto::KvCommand) -> ApplyResult {
            use proto::kv_command::Cmd;
            let now = cmd.now_ms;
            match cmd.cmd.clone() {
                Some(Cmd::Batch(b)) => {
                    for m in b.mutations {
                        if m.op == proto::MutationOp::Delete as i32 {
                            self.keys.remove(m.key.as_ref());
                        } else {
                            self.put(&m.key, &m.value, m.expire_at_ms, m.keep_ttl, now);
                        }
                    }
                    ApplyResult::Done
                }
                Some(Cmd::DeleteRange(r)) => {
                    self.keys.retain(|k, _| {
                        !(k.as_slice() >= r.start.as_ref()
                            && (r.end.is_empty() || k.as_slice() < r.end.as_ref()))
                    });
                    ApplyResult::Done
                }
                Some(Cmd::Cas(c)) => {
                    let current = self.live(&c.key, now).map(|(v, _)| v);
                    let holds = match (&current, c.expect_exists) {
                        (Some(v), true) => v.as_slice() == c.expected.as_ref(),
                        (None, false) => true,
                        _ => false,
                    };
                    if holds {
                        if c.delete {
                            self.keys.remove(c.key.as_ref());
                        } else {
                            self.put(&c.key, &c.new_value, c.expire_at_ms, c.keep_ttl, now);
                        }
                    }
                    ApplyResult::Cas {
                        succeeded: holds,
                        current,
                    }
                }
                Some(Cmd::Incr(c)) => {
                    let current = self.live(&c.key, now).map(|(v, _)| v);
                    let r = phoenix_proto::counter::incremented(current.as_deref(), c.by);
                    if let Ok(n) = r {
                        self.put(&c.key, n.to_string().as_bytes(), 0, true, now);
                    }
                    ApplyResult::Incr(r)
                }
                Some(Cmd::Expire(c)) => {
                    let Some((_, at)) = self.live(&c.key, now) else {
                        return ApplyResult::Expire(false);
                    };
                    let k = c.key.to_vec();
                    if c.expire_at_ms == 0 {
                        if let Some(e) = self.keys.get_mut(&k) {
                            e.1 = None;
                        }
                        return ApplyResult::Expire(at.is_some());
                    }
                    let new = c.expire_at_ms;
                    let holds = match c.condition {
                        0 => true,
                        1 => at.is_none(),
                        2 => at.is_some(),
                        3 => at.is_some_and(|a| new > a),
                        4 => at.is_none_or(|a| new < a),
                        other => {
                            return ApplyResult::Refused(format!(
                                "unknown expiry condition {other}"
                            ))
                        }
                    };
                    if !holds {
                        return ApplyResult::Expire(false);
                    }
                    if now != 0 && new <= now {
                        self.keys.remove(&k);
                    } else if let Some(e) = self.keys.get_mut(&k) {
                        e.1 = Some(new);
                    }
                    ApplyResult::Expire(true)
                }
                Some(Cmd::SweepExpired(c)) => {
                    let up_to = if now == 0 {
                        c.up_to_ms
                    } else {
                        c.up_to_ms.min(now)
                    };
                    for k in &c.keys {
                        if self
                            .keys
                            .get(k.as_ref())
                            .is_some_and(|(_, at)| at.is_some_and(|a| a < up_to))
                        {
                            self.keys.remove(k.as_ref());
                        }
                    }
                    ApplyResult::Done
                }
                _ => unreachable!("not generated"),
            }
        }

        /// The engine records this model stands for (data and expiry namespaces).
        fn records(&self, g: u64) -> Model {
            let mut out = Model::new();
            for (k, (v, at)) in &self.keys {
                out.insert(keys::data_key(g, k), v.clone());
                if let Some(a) = at {
                    out.insert(keys::expiry_key(g, k), a.to_be_bytes().to_vec());
                }
            }
            out
        }
    }

    fn run_expiry(seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let g = 4;
        let n = rng.gen_range(1..60);
        let entries: Vec<Vec<u8>> = (0..n).map(|_| random_command(&mut rng)).collect();
        let rounds = random_rounds(&mut rng, n);
        let engine = Recorder::default();
        let results = apply_rounds(&engine, g, &entries, 1, &rounds);
        let mut model = ExpiryModel::default();
        for (i, e) in entries.iter().enumerate() {
            let cmd = proto::KvCommand::decode(e.as_slice()).unwrap();
            let want = model.apply(&cmd);
            assert_eq!(
                results[i],
                want,
                "seed {seed}: entry {} ({cmd:?}) gave another result than the model",
                i + 1
            );
        }
        let records: Model = engine
            .state
            .borrow()
            .iter()
            .filter(|(k, _)| k.get(8) != Some(&keys::NS_SYS))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(
            records,
            model.records(g),
            "seed {seed}: the data and expiry records differ from the model's"
        );
    }

    /// Puts, deletes, range deletes, compare-and-swaps, increments, expiry changes and
    /// sweeps with expiries around the commands' times, applied in random rounds, give the
    /// results and the records of a model (an expiry record only ever with its key).
    #[test]
    fn expiry_matches_a_model() {
        let seed = test_seed();
        for s in seed..seed + 1000 {
            if let Err(e) = std::panic::catch_unwind(|| run_expiry(s)) {
                eprintln!("replay with PHOENIX_SEED={s}");
                std::panic::resume_unwind(e);
            }
        }
    }

    /// A split moves the upper keys' expiries with them (as the round left them); the
    /// parent keeps its lower keys' expiries.
    #[test]
    fn expiries_move_with_splits() {
        let engine = Recorder::default();
        let (g, c) = (3, 9);
        let mut cache = SessionCache::new(Arc::default());
        let cmd = |cmd: proto::kv_command::Cmd, epoch: u64| {
            proto::KvCommand {
                now_ms: 1_000,
                epoch,
                session: None,
                cmd: Some(cmd),
            }
            .encode_to_vec()
        };
        let put = |k: &str, at: u64| {
            cmd(
                proto::kv_command::Cmd::Batch(proto::BatchMutations {
                    mutations: vec![proto::Mutation {
                        op: proto::MutationOp::Put as i32,
                        key: k.as_bytes().to_vec().into(),
                        value: b"v".to_vec().into(),
                        expire_at_ms: at,
                        ..proto::Mutation::default()
                    }],
                }),
                1,
            )
        };
        {
            let mut a = Applier::new(g, &engine, &mut cache);
            a.set_range(b"", b"", 1);
            for (i, (k, at)) in [("a", 5_000), ("b", 0), ("p", 6_000), ("q", 7_000)]
                .iter()
                .enumerate()
            {
                a.entry(i as u64 + 1, 1);
                a.kv(i as u64 + 1, &put(k, *at)).unwrap();
            }
            a.finish(&engine).unwrap();
        }
        let mut a = Applier::new(g, &engine, &mut cache);
        a.set_range(b"", b"", 1);
        // In the same round as the split: "q" loses its expiry, "r" gets one.
        a.entry(5, 1);
        a.kv(5, &put("q", 0)).unwrap();
        a.entry(6, 1);
        a.kv(6, &put("r", 8_000)).unwrap();
        a.entry(7, 1);
        let sp = proto::SplitCommand {
            split_key: b"n".to_vec().into(),
            new_group_id: c,
            epoch: 1,
        };
        let conf = phoenix_raft::ConfState::with_voters([1, 2, 3]);
        a.split(7, &sp, &conf, false).unwrap().unwrap();
        a.finish(&engine).unwrap();
        let expiry = |g: u64, k: &str| {
            engine
                .get(&keys::expiry_key(g, k.as_bytes()))
                .unwrap()
                .and_then(|v| keys::decode_expiry(&v))
        };
        assert_eq!(expiry(g, "a"), Some(5_000));
        assert_eq!(expiry(g, "b"), None);
        for k in ["p", "q", "r"] {
            assert_eq!(expiry(g, k), None, "{k} left group {g}");
        }
        assert_eq!(expiry(c, "p"), Some(6_000));
        assert_eq!(expiry(c, "q"), None);
        assert_eq!(expiry(c, "r"), Some(8_000));
        assert_eq!(expiry(c, "a"), None);
        // The child applies with them: "p" expires at its time.
        let mut child_cache = SessionCache::new(Arc::default());
        let mut a = Applier::new(c, &engine, &mut child_cache);
        a.set_range(b"n", b"", 2);
        a.entry(keys::SPLIT_INIT_INDEX + 1, 1);
        let late = proto::KvCommand {
            now_ms: 5_500,
            epoch: 2,
            session: None,
            cmd: Some(proto::kv_command::Cmd::Incr(proto::IncrCommand {
                key: b"p".to_vec().into(),
                by: 1,
            })),
        }
        .encode_to_vec();
        assert_eq!(
            a.kv(keys::SPLIT_INIT_INDEX + 1, &late).unwrap(),
            ApplyResult::Incr(Err(proto::IncrFailure::NotAnInteger)),
            "\"v\" is not a number: the key is still there before its expiry"
        );
        a.finish(&engine).unwrap();
        let mut a = Applier::new(c, &engine, &mut child_cache);
        a.set_range(b"n", b"", 2);
        a.entry(keys::SPLIT_INIT_INDEX + 2, 1);
        let later = proto::KvCommand {
            now_ms: 6_001,
            ..proto::KvCommand::decode(late.as_slice()).unwrap()
        }
        .encode_to_vec();
        assert_eq!(
            a.kv(keys::SPLIT_INIT_INDEX + 2, &later).unwrap(),
            ApplyResult::Incr(Ok(1)),
            "expired after 6000: the increment starts from nothing"
        );
        a.finish(&engine).unwrap();
        assert_eq!(expiry(c, "p"), None, "a passed expiry is not kept");
    }

    #[test]
    fn a_split_moves_the_upper_keys_as_the_round_left_them() {
        let engine = Recorder::default();
        let (g, c) = (3, 9);
        let mut cache = SessionCache::new(Arc::default());
        {
            let mut a = Applier::new(g, &engine, &mut cache);
            a.set_range(b"", b"", 1);
            for (i, k) in ["a", "m", "n", "q", "x"].iter().enumerate() {
                a.entry(i as u64 + 1, 1);
                assert_eq!(
                    a.kv(i as u64 + 1, &put_cmd(k, "old", 1, None)).unwrap(),
                    ApplyResult::Done
                );
            }
            a.finish(&engine).unwrap();
        }
        let session = |seq| proto::ClientSession {
            client_id: 77,
            seq,
            acked_below: 1,
            time_ms: 1,
        };
        let mut a = Applier::new(g, &engine, &mut cache);
        a.set_range(b"", b"", 1);
        let del = proto::KvCommand {
            now_ms: 0,
            epoch: 1,
            session: None,
            cmd: Some(proto::kv_command::Cmd::DeleteRange(proto::KeyRange {
                start: b"p".to_vec().into(),
                end: b"r".to_vec().into(),
            })),
        }
        .encode_to_vec();
        a.entry(10, 2);
        a.kv(10, &del).unwrap();
        a.entry(11, 2);
        a.kv(11, &put_cmd("y", "new", 1, Some(session(1)))).unwrap();
        a.entry(12, 2);
        a.kv(12, &put_cmd("x", "newer", 1, None)).unwrap();
        let sp = proto::SplitCommand {
            split_key: b"n".to_vec().into(),
            new_group_id: c,
            epoch: 1,
        };
        a.entry(13, 2);
        let conf = phoenix_raft::ConfState::with_voters([1, 2, 3]);
        // Not at another epoch, nor at a key outside the range.
        let stale = proto::SplitCommand {
            epoch: 0,
            ..sp.clone()
        };
        assert!(a.split(13, &stale, &conf, false).unwrap().is_err());
        let at_start = proto::SplitCommand {
            split_key: Vec::new().into(),
            ..sp.clone()
        };
        assert!(a.split(13, &at_start, &conf, false).unwrap().is_err());
        let done = a.split(13, &sp, &conf, false).unwrap().unwrap();
        assert_eq!(
            (done.start.as_slice(), done.end.as_slice(), done.epoch),
            (&b"n"[..], &b""[..], 2)
        );
        // After it: the old epoch, or a key now in the new group, is refused; the left
        // part at the new epoch is applied.
        a.entry(14, 2);
        assert_eq!(
            a.kv(14, &put_cmd("b", "v", 1, None)).unwrap(),
            ApplyResult::StaleEpoch { request_epoch: 1 }
        );
        a.entry(15, 2);
        assert_eq!(
            a.kv(15, &put_cmd("z", "v", 0, None)).unwrap(),
            ApplyResult::StaleEpoch { request_epoch: 0 }
        );
        a.entry(16, 2);
        assert_eq!(
            a.kv(16, &put_cmd("b", "v", 2, None)).unwrap(),
            ApplyResult::Done
        );
        assert_eq!(a.finish(&engine).unwrap(), Some((16, 2)));
        assert_eq!(engine.after_batch.borrow().len(), 2, "one batch per round");
        let get = |group, k: &str| engine.get(&keys::data_key(group, k.as_bytes())).unwrap();
        let parent: Vec<_> = ["a", "b", "m", "n", "q", "x", "y"]
            .iter()
            .map(|k| get(g, k))
            .collect();
        assert_eq!(
            parent,
            [
                Some(b"old".to_vec()),
                Some(b"v".to_vec()),
                Some(b"old".to_vec()),
                None,
                None,
                None,
                None
            ]
        );
        let child: Vec<_> = ["a", "m", "n", "q", "x", "y", "z"]
            .iter()
            .map(|k| get(c, k))
            .collect();
        assert_eq!(
            child,
            [
                None,
                None,
                Some(b"old".to_vec()),
                None,
                Some(b"newer".to_vec()),
                Some(b"new".to_vec()),
                None
            ]
        );
        assert_eq!(
            engine.get(&keys::applied_key(c)).unwrap(),
            Some(keys::encode_applied(keys::SPLIT_INIT_INDEX, keys::SPLIT_INIT_TERM).to_vec())
        );
        assert_eq!(
            engine.get(&keys::conf_key(c)).unwrap(),
            Some(keys::encode_conf(&conf))
        );
        // Its membership version is recorded: a replica of it created earlier from a newer
        // route must not skip the changes it has not applied.
        assert_eq!(
            engine.get(&keys::conf_version_key(c)).unwrap(),
            Some(keys::SPLIT_INIT_INDEX.to_be_bytes().to_vec())
        );
        // The client's session went with it: its write of sequence 1 is known there.
        let rec = engine
            .get(&keys::session_key(c, 77))
            .unwrap()
            .expect("session copied");
        assert!(Session::decode(&rec).unwrap().is_applied(1));
        let range = |group| {
            proto::GroupRange::decode(
                engine
                    .get(&keys::range_key(group))
                    .unwrap()
                    .unwrap()
                    .as_slice(),
            )
            .unwrap()
        };
        let (lr, rr) = (range(g), range(c));
        assert_eq!(
            (
                lr.start_key.as_ref(),
                lr.end_key.as_ref(),
                lr.epoch,
                lr.split_index
            ),
            (&b""[..], &b"n"[..], 2, 13)
        );
        assert_eq!(
            (
                rr.start_key.as_ref(),
                rr.end_key.as_ref(),
                rr.epoch,
                rr.split_index
            ),
            (&b"n"[..], &b""[..], 2, 0)
        );
    }

    /// A split whose new group has a state here already (its replica got a snapshot
    /// first) only narrows this group: the newer state is not overwritten.
    #[test]
    fn a_split_leaves_a_new_group_that_has_a_state_alone() {
        let engine = Recorder::default();
        let (g, c) = (3, 9);
        engine
            .state
            .borrow_mut()
            .insert(keys::data_key(c, b"x"), b"from a snapshot".to_vec());
        let mut cache = SessionCache::new(Arc::default());
        let mut a = Applier::new(g, &engine, &mut cache);
        a.set_range(b"", b"", 4);
        a.entry(1, 1);
        a.kv(1, &put_cmd("x", "parent's", 4, None)).unwrap();
        a.entry(2, 1);
        let sp = proto::SplitCommand {
            split_key: b"n".to_vec().into(),
            new_group_id: c,
            epoch: 4,
        };
        let conf = phoenix_raft::ConfState::with_voters([1]);
        a.split(2, &sp, &conf, true).unwrap().unwrap();
        a.finish(&engine).unwrap();
        assert_eq!(engine.get(&keys::data_key(g, b"x")).unwrap(), None);
        assert_eq!(
            engine.get(&keys::data_key(c, b"x")).unwrap(),
            Some(b"from a snapshot".to_vec())
        );
        assert_eq!(engine.get(&keys::applied_key(c)).unwrap(), None);
    }
}
