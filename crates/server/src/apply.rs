//! The apply stage of one group: turns committed `KvCommand` entries into engine writes
//! plus the group's applied-index sentinel (seed 000: the log is the WAL, so the
//! sentinel must name exactly the entries whose writes the engine holds).
//!
//! [`Applier`] collects one round's entries into ONE write batch; compare-and-swap reads
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
//! (ParallelRaft). At most [`SESSION_RESULTS_MAX`] results per client. Sessions are not
//! expired yet: a sweep by the proposers' clocks could forget a session whose resend is
//! still coming (a skewed new leader, a client with a long timeout) and apply it again;
//! expiry needs the group to refuse an unknown session that has history (and the client
//! to start a new one), which is not built.

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
    /// The state machine refused the command (meta commands).
    Refused(String),
    /// A resent write whose first result is forgotten: it may or may not have applied.
    SessionExpired {
        /// The client.
        client_id: u64,
        /// The write's sequence number.
        seq: u64,
    },
}

/// Results kept per client session; a client with more writes unanswered loses the
/// oldest (a resend of it gets `SessionExpired`).
pub const SESSION_RESULTS_MAX: usize = 1024;
/// Version of the session record format.
const SESSION_FORMAT: u8 = 1;

/// One client's session in one group (system key `sess/ ‖ client_id`).
///
/// ```text
/// record := version: u8 (1) ‖ low_water: u64 BE ‖ last_ms: u64 BE ‖ count: u32 BE ‖ (seq: u64 BE ‖ result)*
/// result := 0 (done) | 1 ‖ succeeded: u8 ‖ found: u8 ‖ len: u32 BE ‖ current (cas)
///         | 2 ‖ len: u32 BE ‖ utf-8 message (refused)
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    /// Every sequence below it is answered and forgotten.
    pub low_water: u64,
    /// The newest proposer clock seen (ms since the Unix epoch).
    pub last_ms: u64,
    /// Results of the writes at or above `low_water`, by sequence.
    pub results: BTreeMap<u64, ApplyResult>,
}

impl Session {
    /// Encodes the record.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(21 + self.results.len() * 10);
        out.push(SESSION_FORMAT);
        out.extend_from_slice(&self.low_water.to_be_bytes());
        out.extend_from_slice(&self.last_ms.to_be_bytes());
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
                // Never stored (not a result of applying), kept as done if it were.
                ApplyResult::Done | ApplyResult::SessionExpired { .. } => out.push(0),
            }
        }
        out
    }

    /// Decodes a record; the error says what is malformed.
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
        if version != SESSION_FORMAT {
            return Err(format!(
                "session record format {version}, this build reads {SESSION_FORMAT}"
            ));
        }
        let low_water = u64_of(&mut v)?;
        let last_ms = u64_of(&mut v)?;
        let n = u32_of(&mut v)?;
        let mut results = BTreeMap::new();
        for _ in 0..n {
            let seq = u64_of(&mut v)?;
            let r = match take(&mut v, 1)?[0] {
                0 => ApplyResult::Done,
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
                t => return Err(format!("result tag {t}")),
            };
            results.insert(seq, r);
        }
        if !v.is_empty() {
            return Err(format!("{} trailing bytes", v.len()));
        }
        Ok(Session {
            low_water,
            last_ms,
            results,
        })
    }
}

/// Reads of the applied state (the engine).
pub trait StateReader {
    /// The value of engine key `key`.
    fn get(&self, key: &[u8]) -> crate::Result<Option<Vec<u8>>>;
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
    bytes: Arc<AtomicUsize>,
}

impl SessionCache {
    /// An empty cache counting its memory in the node-wide `bytes`.
    pub fn new(bytes: Arc<AtomicUsize>) -> SessionCache {
        SessionCache {
            records: HashMap::new(),
            bytes,
        }
    }

    /// Forgets every record (they are read from the engine again when needed).
    pub fn clear(&mut self) {
        let held: usize = self.records.values().map(|(_, b)| *b).sum();
        self.bytes.fetch_sub(held, Ordering::Relaxed);
        self.records = HashMap::new();
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
        let mut rec = match self.sessions.remove(&s.client_id) {
            Some(r) => r,
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

    /// The body of [`Applier::kv_in_session`] on the client's record `rec`.
    fn session_step(
        &mut self,
        rec: &mut Session,
        cmd: Option<proto::kv_command::Cmd>,
        s: &proto::ClientSession,
    ) -> crate::Result<ApplyResult> {
        if s.seq < rec.low_water {
            return Ok(ApplyResult::SessionExpired {
                client_id: s.client_id,
                seq: s.seq,
            });
        }
        if let Some(r) = rec.results.get(&s.seq) {
            return Ok(r.clone());
        }
        let result = self.apply_cmd(cmd)?;
        rec.results.insert(s.seq, result.clone());
        // A client cannot have the answer of this very write yet.
        rec.low_water = rec.low_water.max(s.acked_below.min(s.seq));
        rec.results = rec.results.split_off(&rec.low_water);
        while rec.results.len() > SESSION_RESULTS_MAX {
            if let Some((oldest, _)) = rec.results.pop_first() {
                rec.low_water = oldest + 1;
            }
        }
        rec.last_ms = rec.last_ms.max(s.time_ms);
        Ok(result)
    }

    /// Applies one key-value command.
    fn apply_cmd(&mut self, cmd: Option<proto::kv_command::Cmd>) -> crate::Result<ApplyResult> {
        let g = self.g;
        Ok(match cmd {
            Some(proto::kv_command::Cmd::Batch(b)) => {
                for m in b.mutations {
                    let k = keys::data_key(g, &m.key);
                    if m.op == proto::MutationOp::Delete as i32 {
                        self.wb.delete(&k);
                        self.overlay.insert(k, None);
                    } else {
                        self.wb.put(&k, &m.value);
                        self.overlay.insert(k, Some(m.value.to_vec()));
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
                    self.wb.delete_range(&start, &end);
                    self.overlay.retain(|k, _| *k < start || *k >= end);
                    self.deleted.push((start, end));
                }
                ApplyResult::Done
            }
            Some(proto::kv_command::Cmd::Cas(c)) => {
                let k = keys::data_key(g, &c.key);
                let current = self.read(&k)?;
                let holds = match (&current, c.expect_exists) {
                    (Some(v), true) => v.as_slice() == c.expected.as_ref(),
                    (None, false) => true,
                    _ => false,
                };
                if holds {
                    if c.delete {
                        self.wb.delete(&k);
                        self.overlay.insert(k, None);
                    } else {
                        self.wb.put(&k, &c.new_value);
                        self.overlay.insert(k, Some(c.new_value.to_vec()));
                    }
                }
                ApplyResult::Cas {
                    succeeded: holds,
                    current,
                }
            }
            None => ApplyResult::Refused("empty command".into()),
        })
    }

    /// Writes the round: ONE batch holding every write of the entries taken and the
    /// sentinel of the last one. Returns that (index, term), or `None` if no entry was
    /// taken (nothing written).
    pub fn finish(mut self, writer: &dyn StateWriter) -> crate::Result<Option<(u64, u64)>> {
        let Some((index, term)) = self.last else {
            return Ok(None);
        };
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

    fn random_command(rng: &mut ChaCha8Rng) -> Vec<u8> {
        let key = |rng: &mut ChaCha8Rng| format!("k{}", rng.gen_range(0..6)).into_bytes();
        let cmd = match rng.gen_range(0..10) {
            0..=3 => proto::kv_command::Cmd::Batch(proto::BatchMutations {
                mutations: (0..rng.gen_range(1..3))
                    .map(|_| proto::Mutation {
                        op: if rng.gen_bool(0.2) {
                            proto::MutationOp::Delete as i32
                        } else {
                            proto::MutationOp::Put as i32
                        },
                        key: key(rng).into(),
                        value: format!("v{}", rng.gen_range(0..4)).into_bytes().into(),
                    })
                    .collect(),
            }),
            4..=5 => {
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
            _ => proto::kv_command::Cmd::Cas(proto::CasCommand {
                key: key(rng).into(),
                expect_exists: rng.gen_bool(0.7),
                expected: format!("v{}", rng.gen_range(0..4)).into_bytes().into(),
                new_value: format!("v{}", rng.gen_range(0..4)).into_bytes().into(),
                delete: rng.gen_bool(0.1),
            }),
        };
        proto::KvCommand {
            cmd: Some(cmd),
            session: None,
        }
        .encode_to_vec()
    }

    /// A workload of writes from 3 clients with sessions, some resent (the same entry
    /// data again, as a client's resend after an unknown outcome is), and clocks that
    /// advance. Returns the entries and, per entry, the index of the first
    /// copy if it is a resend.
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
            time_ms += rng.gen_range(0..60_000);
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

    fn run(seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let g = 7;
        let n = rng.gen_range(1..40);
        let entries: Vec<Vec<u8>> = if rng.gen_bool(0.5) {
            session_workload(&mut rng, n).0
        } else {
            (0..n).map(|_| random_command(&mut rng)).collect()
        };
        let mut rounds = Vec::new();
        let mut left = n;
        while left > 0 {
            let r = rng.gen_range(1..=left.min(8));
            rounds.push(r);
            left -= r;
        }
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

    #[test]
    fn any_crash_prefix_replays_to_the_same_state() {
        let seed: u64 = std::env::var("PHOENIX_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
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
        let put = |k: &str, v: &str| {
            proto::KvCommand {
                session: None,
                cmd: Some(proto::kv_command::Cmd::Batch(proto::BatchMutations {
                    mutations: vec![proto::Mutation {
                        op: proto::MutationOp::Put as i32,
                        key: k.as_bytes().to_vec().into(),
                        value: v.as_bytes().to_vec().into(),
                    }],
                })),
            }
            .encode_to_vec()
        };
        let del_range = proto::KvCommand {
            session: None,
            cmd: Some(proto::kv_command::Cmd::DeleteRange(proto::KeyRange {
                start: b"a".to_vec().into(),
                end: b"z".to_vec().into(),
            })),
        }
        .encode_to_vec();
        let cas = proto::KvCommand {
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

    /// A round whose batch fails to write leaves the session cache without its records:
    /// the next round (same cache) reads the engine's, so the failed write is applied
    /// when it comes again, and an older one is still answered from its record.
    #[test]
    fn a_failed_round_leaves_no_session_record_in_the_cache() {
        let engine = Recorder::default();
        let g = 4;
        let put = |seq: u64, v: &str| {
            proto::KvCommand {
                session: Some(proto::ClientSession {
                    client_id: 9,
                    seq,
                    acked_below: 1,
                    time_ms: 1,
                }),
                cmd: Some(proto::kv_command::Cmd::Batch(proto::BatchMutations {
                    mutations: vec![proto::Mutation {
                        op: proto::MutationOp::Put as i32,
                        key: b"k".to_vec().into(),
                        value: v.as_bytes().to_vec().into(),
                    }],
                })),
            }
            .encode_to_vec()
        };
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
}
