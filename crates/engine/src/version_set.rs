//! The version set: the current [`Version`], the manifest that makes it durable, and
//! the counters (next file number, last sequence, log number) that go with it.
//!
//! Manifest byte grammar (a log of version edits):
//!
//! ```text
//! manifest := record*
//! record   := len:u32le crc:u32le payload[len]      -- crc = crc32c(len bytes ‖ payload)
//! payload  := version_edit (see version_edit.rs)
//! ```
//!
//! Each open writes a fresh manifest whose first record is a snapshot of the whole
//! version, syncs it, then points CURRENT at it with `write_atomic` (after a crash
//! either the old or the new manifest is current, never a mix), then deletes the old
//! one. Every later edit is appended and synced before the version it describes is
//! installed, so a flush or compaction is visible only once durable.
//!
//! Recovery replays the records; a record cut short at the end of the file (a torn
//! append that was never acknowledged) is dropped with a warning; a checksum mismatch
//! anywhere before the end, or an edit that does not decode or apply, is corruption
//! named by file and offset.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use phoenix_storage::WritableFile;

use crate::error::{Error, Result};
use crate::key::SequenceNumber;
use crate::table_store::{SharedTableStore, StoredFile};
use crate::version::Version;
use crate::version_edit::VersionEdit;

const RECORD_HEADER: usize = 8;
/// A manifest grown past this is replaced by a fresh one holding a snapshot.
pub const MANIFEST_ROLL_BYTES: u64 = 64 << 20;

/// On a store that uploads the whole manifest at each edit
/// ([`crate::TableStore::rewrites_manifest_whole`]), the manifest rolls once it holds
/// twice its first record (the live state) or this much, whichever is more: each edit
/// then uploads a few times the live state, not every edit since the last roll.
pub const WHOLE_MANIFEST_ROLL_FLOOR: u64 = 64 << 10;
/// Manifest numbers an open tries past ones already taken (see `VersionSet::open`).
const OPEN_MANIFEST_TRIES: u32 = 64;

/// Frames one manifest record.
pub fn encode_record(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_le_bytes();
    let mut crc = crc32c::crc32c(&len);
    crc = crc32c::crc32c_append(crc, payload);
    let mut out = Vec::with_capacity(RECORD_HEADER + payload.len());
    out.extend_from_slice(&len);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Splits manifest bytes into edits. Returns the edits with their offsets and whether
/// a torn tail was dropped.
pub fn decode_manifest(file: &Path, data: &[u8]) -> Result<(Vec<(u64, VersionEdit)>, bool)> {
    let mut pos = 0usize;
    let mut edits = Vec::new();
    while pos < data.len() {
        let rest = data.len() - pos;
        if rest < RECORD_HEADER {
            return Ok((edits, true));
        }
        let mut b4 = [0u8; 4];
        b4.copy_from_slice(&data[pos..pos + 4]);
        let len = u32::from_le_bytes(b4) as usize;
        b4.copy_from_slice(&data[pos + 4..pos + 8]);
        let crc = u32::from_le_bytes(b4);
        let end = pos + RECORD_HEADER + len;
        if end > data.len() {
            return Ok((edits, true));
        }
        let payload = &data[pos + RECORD_HEADER..end];
        let actual = crc32c::crc32c_append(crc32c::crc32c(&data[pos..pos + 4]), payload);
        if actual != crc {
            if end == data.len() {
                return Ok((edits, true));
            }
            return Err(Error::corruption(
                file,
                pos as u64,
                format!(
                    "manifest record checksum mismatch (stored {crc:#x}, computed {actual:#x})"
                ),
            ));
        }
        let edit = VersionEdit::decode(payload).map_err(|(at, what)| {
            Error::corruption(
                file,
                (pos + RECORD_HEADER + at) as u64,
                format!("version edit: {what}"),
            )
        })?;
        edits.push((pos as u64, edit));
        pos = end;
    }
    Ok((edits, false))
}

/// The current version and its manifest.
pub struct VersionSet {
    store: SharedTableStore,
    num_levels: usize,
    current: Arc<Version>,
    manifest: Option<Box<dyn WritableFile>>,
    manifest_number: u64,
    next_file_number: u64,
    /// Largest sequence number made durable in a table (or present at open).
    last_sequence: SequenceNumber,
    log_number: u64,
    live: Vec<Weak<Version>>,
    /// Files removed from the current version, deleted once no live version holds them.
    /// Tables removed by edits, with when: deleted once no version holds them and
    /// `deletion_delay` has passed.
    /// (With when by the wall clock, for readers' leases.)
    pending_deletes: Vec<(u64, std::time::Instant, u64)>,
    deletion_delay: std::time::Duration,
    /// Whether deletions also wait for readers' leases ([`crate::reader_lease`]).
    reader_leases: bool,
    /// What the leases read last said.
    reader_floor: Option<crate::reader_lease::Floor>,
    /// When the leases should be read again: a due table waits on them. Only a read of
    /// the leases moves it (other takes must not push it back, or a busy engine would
    /// never read them).
    lease_recheck: Option<std::time::Instant>,
    /// When the background should next look at `pending_deletes` (with a delay).
    next_due: Option<std::time::Instant>,
    /// Files kept whatever the versions hold (an export's tables, until copied), with
    /// how many hold each.
    pinned: std::collections::HashMap<u64, usize>,
    /// A manifest write failed (why): the in-memory and on-disk states may differ, so
    /// no further edits are accepted.
    broken: Option<String>,
    /// A manifest write failed on a store that was unavailable (why): the manifest in
    /// use may hold the failed record or not, so it is never written again; the next
    /// edit first starts a fresh manifest from the in-memory state (which lacks the
    /// failed edit) and points the store at it ([`VersionSet::renew`]). Either manifest
    /// recovers a consistent state: the failed edit's tables are on the store, and what
    /// it replaced is deleted only by a later edit.
    stale: Option<String>,
    /// The object whose conditional write found another writer's, when that is why the
    /// set is broken (the store was taken over: `Error::is_fenced`).
    fenced: Option<PathBuf>,
    /// Manifest size that triggers a roll ([`MANIFEST_ROLL_BYTES`]; tests lower it).
    roll_bytes: u64,
    /// Size of the current manifest's first record (the state it started from).
    base_bytes: u64,
    /// A [`ManifestWrite`] is out (between [`VersionSet::begin`] and
    /// [`VersionSet::finish`]); the manifest handle is with it.
    writing: bool,
}

impl std::fmt::Debug for VersionSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionSet")
            .field("manifest_number", &self.manifest_number)
            .field("next_file_number", &self.next_file_number)
            .field("last_sequence", &self.last_sequence)
            .finish()
    }
}

impl VersionSet {
    /// Recovers from the manifest the store's pointer names or, if there is none and
    /// `create` is set, starts empty. Then writes a fresh manifest (see the module docs).
    pub fn open(store: SharedTableStore, num_levels: usize, create: bool) -> Result<VersionSet> {
        let mut vs = VersionSet {
            store: Arc::clone(&store),
            num_levels,
            current: Arc::new(Version::empty(num_levels)),
            manifest: None,
            manifest_number: 0,
            next_file_number: 1,
            last_sequence: 0,
            log_number: 0,
            live: Vec::new(),
            pending_deletes: Vec::new(),
            deletion_delay: std::time::Duration::ZERO,
            reader_leases: false,
            reader_floor: None,
            lease_recheck: None,
            next_due: None,
            pinned: std::collections::HashMap::new(),
            broken: None,
            stale: None,
            fenced: None,
            roll_bytes: MANIFEST_ROLL_BYTES,
            base_bytes: 0,
            writing: false,
        };
        let mut old_manifest = None;
        if let Some(r) = replay(&store, num_levels)? {
            vs.log_number = r.log_number;
            vs.last_sequence = r.last_sequence;
            vs.current = Arc::new(r.version);
            vs.next_file_number = r
                .next_file_number
                .checked_add(store.file_number_gap())
                .ok_or_else(|| Error::corruption(&r.path, 0, "next_file_number overflows"))?;
            old_manifest = Some(r.number);
        } else if !create {
            return Err(Error::InvalidArgument(format!(
                "{} holds no database and create_if_missing is off",
                store.location().display()
            )));
        }
        // A store whose objects are created only if absent may hold a manifest of the
        // number chosen: one an open that failed part way uploaded before it could name
        // it in the pointer (it is a stray, removed at open). The next number is taken
        // then; between writers opening at once, the pointer's conditional replacement
        // decides.
        let mut tries = 0;
        let (number, file) = loop {
            let number = vs.take_file_number();
            let record = vs.snapshot_record(&vs.current);
            match upload_fresh(&store, number, &record) {
                Ok(file) => {
                    vs.base_bytes = record.len() as u64;
                    break (number, file);
                }
                Err(e) if e.is_fenced() && tries < OPEN_MANIFEST_TRIES => tries += 1,
                Err(e) => return Err(e),
            }
        };
        store.set_current_manifest(number)?;
        vs.manifest = Some(file);
        vs.manifest_number = number;
        if let Some(old) = old_manifest {
            if old != vs.manifest_number {
                // Best effort: an unreferenced manifest is removed on the next open too.
                if let Err(e) = store.remove(&StoredFile::Manifest(old)) {
                    tracing::warn!(error = %e, "could not delete the old manifest");
                }
            }
        }
        Ok(vs)
    }

    fn take_file_number(&mut self) -> u64 {
        let n = self.next_file_number;
        self.next_file_number += 1;
        n
    }

    /// The first record of a fresh manifest: a snapshot of `v` with the counters.
    fn snapshot_record(&self, v: &Version) -> Vec<u8> {
        let mut snap = VersionEdit {
            log_number: Some(self.log_number),
            next_file_number: Some(self.next_file_number),
            last_sequence: Some(self.last_sequence),
            ..Default::default()
        };
        for (level, files) in v.levels.iter().enumerate() {
            for f in files.iter() {
                snap.new_files.push((level, Arc::clone(f)));
            }
        }
        let mut payload = Vec::new();
        snap.encode(&mut payload);
        encode_record(&payload)
    }

    /// The current version.
    pub fn current(&self) -> Arc<Version> {
        Arc::clone(&self.current)
    }

    /// Hands out a new file number.
    pub fn new_file_number(&mut self) -> u64 {
        let n = self.next_file_number;
        self.next_file_number += 1;
        n
    }

    /// Hands out `n` consecutive file numbers (the first; `None` if the counter would
    /// overflow). The next edit written records the counter past them.
    pub fn reserve_file_numbers(&mut self, n: u64) -> Option<u64> {
        let first = self.next_file_number;
        self.next_file_number = first.checked_add(n)?;
        Some(first)
    }

    /// Largest sequence number recorded in the manifest.
    pub fn last_sequence(&self) -> SequenceNumber {
        self.last_sequence
    }

    /// First WAL entry not yet in a table.
    pub fn log_number(&self) -> u64 {
        self.log_number
    }

    /// Whether a manifest write failed: the set refuses further edits.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// What broke the set ([`VersionSet::is_broken`]): the failed manifest write's error.
    pub fn broken_by(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Why edits (and the engine's writes) are refused once a manifest write failed: the
    /// store taken over by another writer (`Error::is_fenced`), or the failure itself.
    pub fn refusal(&self) -> Option<Error> {
        let why = self.broken.as_ref()?;
        Some(match &self.fenced {
            Some(path) => Error::Storage(phoenix_storage::Error::Fenced { path: path.clone() }),
            None => Error::Background(format!("an earlier manifest write failed: {why}")),
        })
    }

    /// Whether another writer took the store over (see [`VersionSet::refusal`]).
    pub fn is_fenced(&self) -> bool {
        self.fenced.is_some()
    }

    /// Takes in a failed manifest write: a store unavailable leaves the set stale
    /// (renewed at the next edit); any other failure breaks it.
    fn break_on(&mut self, e: &phoenix_storage::Error) {
        if e.is_retryable() {
            self.stale.get_or_insert_with(|| e.to_string());
            return;
        }
        self.broken.get_or_insert_with(|| e.to_string());
        if let phoenix_storage::Error::Fenced { path } = e {
            self.fenced = Some(path.clone());
        }
    }

    /// Takes in a failed fresh manifest (a roll's or a renewal's): see
    /// [`VersionSet::break_on`]; an error not of the storage breaks the set.
    fn fail_on(&mut self, e: &Error) {
        match e {
            Error::Storage(s) => self.break_on(s),
            other => {
                self.broken.get_or_insert_with(|| other.to_string());
            }
        }
    }

    /// Why the next edit must first start a fresh manifest (a manifest write failed on
    /// a store that was unavailable), if it must.
    pub fn stale_by(&self) -> Option<&str> {
        self.stale.as_deref()
    }

    /// The number of the manifest in use.
    pub fn manifest_number(&self) -> u64 {
        self.manifest_number
    }

    /// Makes `edit` durable in the manifest, then installs the version it produces:
    /// [`VersionSet::begin`], [`ManifestWrite::run`] and [`VersionSet::finish`] in a
    /// row (the engine runs the middle one without its state lock).
    pub fn log_and_apply(&mut self, edit: VersionEdit) -> Result<()> {
        let mut w = self.begin(edit)?;
        w.run();
        self.finish(w)
    }

    /// Whether a [`ManifestWrite`] is out: the next [`VersionSet::begin`] must wait for
    /// its [`VersionSet::finish`].
    pub fn is_writing(&self) -> bool {
        self.writing
    }

    /// Prepares the manifest write of `edit` (checked against the current version),
    /// which takes the manifest with it until [`VersionSet::finish`]: the record, and
    /// the fresh manifests around it — first one from the in-memory state if a
    /// manifest write failed on an unavailable store (the set is stale: that manifest
    /// may hold the failed record or not, so it is never written again; either one
    /// recovers a consistent state, as the failed edit's tables are on the store and
    /// what it replaced is deleted only by a later edit), and one after it if the
    /// manifest grows past the roll size. Nothing else may begin meanwhile.
    pub fn begin(&mut self, mut edit: VersionEdit) -> Result<ManifestWrite> {
        if let Some(e) = self.refusal() {
            return Err(e);
        }
        assert!(!self.writing, "a manifest write began while another is out");
        if edit.new_files.iter().any(|(l, _)| *l >= self.num_levels) {
            return Err(Error::InvalidArgument(
                "edit names a level beyond num_levels".into(),
            ));
        }
        let next = self
            .current
            .apply(&edit)
            .map_err(|what| Error::Background(format!("version edit does not apply: {what}")))?;
        if let Some(s) = edit.last_sequence {
            // Recovery takes each record's value: the manifest never goes backwards,
            // even for an edit computed before another one landed.
            edit.last_sequence = Some(s.max(self.last_sequence));
        }
        let renew = self.stale.clone().map(|why| {
            let number = self.take_file_number();
            Fresh {
                number,
                record: self.snapshot_record(&self.current),
                why,
            }
        });
        // Room for the record's own counter; the roll's number is taken first so the
        // record covers it.
        let at = match &renew {
            Some(f) => f.record.len() as u64,
            None => self.manifest.as_ref().map_or(0, |m| m.position()),
        };
        let roll_at = if self.store.rewrites_manifest_whole() {
            self.roll_bytes
                .min(WHOLE_MANIFEST_ROLL_FLOOR.max(2 * self.base_bytes))
        } else {
            self.roll_bytes
        };
        let roll_number = (renew.is_none() && at > roll_at).then(|| self.take_file_number());
        edit.next_file_number = Some(self.next_file_number);
        let mut payload = Vec::new();
        edit.encode(&mut payload);
        let record = encode_record(&payload);
        let roll = match roll_number {
            Some(number) => {
                // The snapshot holds the edit: its counters as after it.
                let (log, seq) = (self.log_number, self.last_sequence);
                if let Some(n) = edit.log_number {
                    self.log_number = n;
                }
                if let Some(s) = edit.last_sequence {
                    self.last_sequence = self.last_sequence.max(s);
                }
                let record = self.snapshot_record(&next);
                (self.log_number, self.last_sequence) = (log, seq);
                Some(Fresh {
                    number,
                    record,
                    why: String::new(),
                })
            }
            None => None,
        };
        self.writing = true;
        Ok(ManifestWrite {
            store: Arc::clone(&self.store),
            manifest: self.manifest.take(),
            number: self.manifest_number,
            renew,
            renewed: None,
            record,
            appended: None,
            roll,
            rolled: None,
            edit,
            next,
        })
    }

    /// Takes the manifest back from `w` ([`ManifestWrite::run`] done) and settles its
    /// outcome: the edit's version installed if its record is durable; a failure that
    /// leaves the manifest in doubt makes the set stale when the store was unavailable
    /// (renewed at the next edit) and breaks it otherwise. A roll that fails after the
    /// record was durable does not fail the edit.
    pub fn finish(&mut self, w: ManifestWrite) -> Result<()> {
        debug_assert!(self.writing, "finish without begin");
        self.writing = false;
        let ManifestWrite {
            manifest,
            number,
            renew,
            renewed,
            appended,
            roll,
            rolled,
            edit,
            next,
            ..
        } = w;
        self.manifest = manifest;
        self.manifest_number = number;
        if let Some(fresh) = renew {
            match renewed {
                Some(Ok(())) => {
                    self.base_bytes = fresh.record.len() as u64;
                    tracing::info!(manifest = number, after = %fresh.why, "started a fresh manifest after a failed write");
                    self.stale = None;
                }
                Some(Err(e)) => {
                    self.fail_on(&e);
                    return Err(e);
                }
                None => return Err(Error::Background("manifest renewal never ran".into())),
            }
        }
        match appended {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                self.break_on(&e);
                return Err(e.into());
            }
            None => return Err(Error::Background("manifest write never ran".into())),
        }
        if let Some(s) = edit.last_sequence {
            self.last_sequence = self.last_sequence.max(s);
        }
        if let Some(n) = edit.log_number {
            self.log_number = n;
        }
        // A table the edit also adds (a move down) is not obsolete. One queued before
        // and removed again (moved, then compacted) waits from now.
        let readded: std::collections::HashSet<u64> =
            edit.new_files.iter().map(|(_, f)| f.number).collect();
        for &(_, n) in &edit.deleted_files {
            if !readded.contains(&n) {
                self.queue_delete(n);
            }
        }
        let old = std::mem::replace(&mut self.current, Arc::new(next));
        self.live.retain(|w| w.strong_count() > 0);
        self.live.push(Arc::downgrade(&old));
        if let Some(fresh) = &roll {
            if let Some(Ok(())) = rolled {
                self.base_bytes = fresh.record.len() as u64;
            }
            if let Some(Err(e)) = rolled {
                // The edit is durable and installed whatever happened to the roll: the
                // old manifest is still complete and current, but the set refuses
                // further edits (or, the store unavailable, renews at the next one).
                tracing::warn!(error = %e, "could not roll the manifest");
                self.fail_on(&e);
            }
        }
        Ok(())
    }

    /// Keeps files `numbers` (each live in the current or a held version now) until
    /// [`VersionSet::unpin`], whatever the versions hold then.
    pub fn pin(&mut self, numbers: &[u64]) {
        for &n in numbers {
            *self.pinned.entry(n).or_insert(0) += 1;
        }
    }

    /// Lets files `numbers` go again (once per [`VersionSet::pin`]); the caller then
    /// deletes what no version holds ([`VersionSet::delete_obsolete_files`]).
    pub fn unpin(&mut self, numbers: &[u64]) {
        for n in numbers {
            if let Some(c) = self.pinned.get_mut(n) {
                *c -= 1;
                if *c == 0 {
                    self.pinned.remove(n);
                }
            }
        }
    }

    /// Deletes the files removed by earlier edits that no live version holds any more
    /// (and, with a deletion delay, that waited it out); returns their numbers (for the
    /// table cache to forget).
    pub fn delete_obsolete_files(&mut self) -> Vec<u64> {
        let deleted = self.take_deletable();
        for &n in &deleted {
            delete_table(&self.store, n);
        }
        deleted
    }

    /// Takes the tables [`VersionSet::delete_obsolete_files`] would delete off the
    /// queue, for the caller to delete (without the engine's lock: no version holds
    /// them and their numbers are never handed out again), and sets when to look next.
    pub fn take_deletable(&mut self) -> Vec<u64> {
        let mut deleted = Vec::new();
        self.next_due = None;
        if self.pending_deletes.is_empty() {
            return deleted;
        }
        self.live.retain(|w| w.strong_count() > 0);
        let mut held = std::collections::HashSet::new();
        held.extend(self.current.live_files());
        held.extend(self.pinned.keys().copied());
        for w in &self.live {
            if let Some(v) = w.upgrade() {
                held.extend(v.live_files());
            }
        }
        let now = std::time::Instant::now();
        let mut keep = Vec::new();
        let mut next: Option<std::time::Instant> = None;
        for (n, since, since_ms) in std::mem::take(&mut self.pending_deletes) {
            let due = since + self.deletion_delay;
            let look = if held.contains(&n) {
                // Released without an edit (an iterator dropped): looked at again
                // later, not at once (the background must not spin on it).
                now + self.deletion_delay.max(HELD_RECHECK)
            } else if due <= now
                && self.reader_leases
                && !self.reader_floor.is_some_and(|f| f.frees(since_ms, since))
            {
                // A reader's lease (or no lease read since) may still cover it: the
                // leases are read again a second from the first such wait.
                let at = *self.lease_recheck.get_or_insert(now + HELD_RECHECK);
                at.max(now + std::time::Duration::from_millis(1))
            } else if due > now {
                due
            } else {
                deleted.push(n);
                continue;
            };
            next = Some(next.map_or(look, |t| t.min(look)));
            keep.push((n, since, since_ms));
        }
        self.pending_deletes = keep;
        if !self.deletion_delay.is_zero() {
            self.next_due = next;
        }
        deleted
    }

    /// Whether some table files wait for old versions to be released.
    pub fn has_pending_deletes(&self) -> bool {
        !self.pending_deletes.is_empty()
    }

    /// Keeps tables an edit removed for `delay` before deleting them, so that readers
    /// following the manifest from elsewhere (`Secondary`) still find the tables of the
    /// version they read until they catch up.
    pub fn set_deletion_delay(&mut self, delay: std::time::Duration) {
        self.deletion_delay = delay;
    }

    /// With a deletion delay, whether deletions also wait for the readers' leases
    /// ([`crate::reader_lease`]): a table goes only once leases read after its removal
    /// show no live reader that may still read it.
    pub fn set_reader_leases(&mut self, on: bool) {
        self.reader_leases = on && !self.deletion_delay.is_zero();
    }

    /// When the caller should read the readers' leases (and hand them to
    /// [`VersionSet::set_reader_floor`], then take what is deletable): a due table
    /// waits on them.
    pub fn reader_leases_due(&self) -> Option<std::time::Instant> {
        self.lease_recheck
    }

    /// What the readers' leases said when read.
    pub fn set_reader_floor(&mut self, floor: crate::reader_lease::Floor) {
        self.reader_floor = Some(floor);
        self.lease_recheck = None;
    }

    /// The leases could not be read: read again a second from now.
    pub fn set_reader_floor_failed(&mut self) {
        self.lease_recheck = Some(std::time::Instant::now() + HELD_RECHECK);
    }

    /// Deletes table `number`, which no version holds, once the deletion delay has
    /// passed (a stray found at open); `false` if the number is still to be handed out
    /// (the stray of a write that never reached the manifest): the caller deletes it
    /// now, before a new table takes the number.
    pub fn defer_delete(&mut self, number: u64) -> bool {
        if number >= self.next_file_number {
            return false;
        }
        self.queue_delete(number);
        true
    }

    /// Queues table `number` for deletion from now.
    fn queue_delete(&mut self, number: u64) {
        let now = std::time::Instant::now();
        self.pending_deletes.retain(|&(n, _, _)| n != number);
        self.pending_deletes
            .push((number, now, crate::reader_lease::now_ms()));
        if !self.deletion_delay.is_zero() {
            let due = now + self.deletion_delay;
            self.next_due = Some(self.next_due.map_or(due, |t| t.min(due)));
        }
    }

    /// When the background should next take the tables whose deletion delay ran out
    /// ([`VersionSet::take_deletable`]); `None`: no delay, or nothing waits. Always
    /// later than the last take.
    pub fn next_deletion_due(&self) -> Option<std::time::Instant> {
        self.next_due
    }
}

/// How soon a table waiting on a version that holds it is looked at again.
const HELD_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Deletes table `n` (gone already is fine; a failure is said and left: the table is a
/// stray the next open removes).
pub(crate) fn delete_table(store: &SharedTableStore, n: u64) {
    if let Err(e) = store.delete_table(n) {
        if !e.is_not_found() {
            let file = store.table_location(n);
            tracing::warn!(file = %file.display(), error = %e, "could not delete an obsolete table");
        }
    }
}

/// The tree a store's current manifest describes ([`replay`]).
pub(crate) struct Replayed {
    /// The manifest's number.
    pub number: u64,
    /// Where it is, for messages.
    pub path: std::path::PathBuf,
    /// Its bytes' length: a manifest that grew holds more edits.
    pub len: usize,
    pub version: Version,
    pub log_number: u64,
    pub next_file_number: u64,
    pub last_sequence: SequenceNumber,
}

/// Reads the manifest the store's pointer names and applies its edits (a torn last
/// record is dropped, and said); `None` when the store holds no database. Writes
/// nothing: a read-only follower replays the primary's manifest with it.
pub(crate) fn replay(store: &SharedTableStore, num_levels: usize) -> Result<Option<Replayed>> {
    let Some((number, path, data)) = store.read_current_manifest()? else {
        return Ok(None);
    };
    let (edits, torn) = decode_manifest(&path, &data)?;
    if torn {
        tracing::warn!(manifest = %path.display(), "dropping a torn record at the end of the manifest");
    }
    if edits.is_empty() {
        return Err(Error::corruption(
            &path,
            0,
            "manifest holds no complete record",
        ));
    }
    let (mut log_number, mut next_file_number, mut last_sequence) = (0, 1, 0);
    let mut v = Version::empty(num_levels);
    for (offset, e) in &edits {
        if e.new_files.iter().any(|(l, _)| *l >= num_levels)
            || e.deleted_files.iter().any(|(l, _)| *l >= num_levels)
        {
            return Err(Error::corruption(
                &path,
                *offset,
                format!("edit names a level beyond num_levels = {num_levels}"),
            ));
        }
        v = v.apply(e).map_err(|what| {
            Error::corruption(&path, *offset, format!("edit does not apply: {what}"))
        })?;
        if let Some(n) = e.log_number {
            log_number = n;
        }
        if let Some(n) = e.next_file_number {
            next_file_number = n;
        }
        if let Some(s) = e.last_sequence {
            last_sequence = s;
        }
    }
    let max_file = v.live_files().max().unwrap_or(0);
    if max_file >= next_file_number {
        return Err(Error::corruption(
            &path,
            0,
            format!("file {max_file} is not below next_file_number {next_file_number}"),
        ));
    }
    Ok(Some(Replayed {
        number,
        path,
        len: data.len(),
        version: v,
        log_number,
        next_file_number,
        last_sequence,
    }))
}

/// A fresh manifest to start: its number and first record (a snapshot), and why.
struct Fresh {
    number: u64,
    record: Vec<u8>,
    why: String,
}

/// Uploads manifest `number` holding `record`, synced (not yet current).
fn upload_fresh(
    store: &SharedTableStore,
    number: u64,
    record: &[u8],
) -> Result<Box<dyn WritableFile>> {
    let mut file = store.create_manifest(number)?;
    file.append(record)?;
    file.sync_all()?;
    Ok(file)
}

/// A manifest write out of the version set ([`VersionSet::begin`]): the manifest's
/// I/O, run without the engine's state lock so that writers, readers of the engine's
/// figures and `close` do not wait on a store that is slow to answer; handed back with
/// [`VersionSet::finish`].
pub struct ManifestWrite {
    store: SharedTableStore,
    /// The manifest in use, and its number (a fresh one's once started).
    manifest: Option<Box<dyn WritableFile>>,
    number: u64,
    renew: Option<Fresh>,
    renewed: Option<Result<()>>,
    record: Vec<u8>,
    appended: Option<phoenix_storage::Result<()>>,
    roll: Option<Fresh>,
    rolled: Option<Result<()>>,
    edit: VersionEdit,
    next: Version,
}

impl ManifestWrite {
    /// The I/O: a fresh manifest named in the pointer first if the set was stale (the
    /// one that failed removed, best effort: a stray is removed at the next open), the
    /// record appended and synced, then a roll if due (the old manifest removed once
    /// the pointer names the new one). Stops at the first failure; outcomes are for
    /// [`VersionSet::finish`].
    pub fn run(&mut self) {
        if let Some(f) = self.renew.take() {
            let started = self.start(f.number, &f.record);
            let failed = started.is_err();
            self.renewed = Some(started);
            self.renew = Some(f);
            if failed {
                return;
            }
        }
        let appended = match self.manifest.as_mut() {
            Some(m) => m.append(&self.record).and_then(|_| m.sync_data()),
            None => Err(phoenix_storage::Error::io(
                phoenix_storage::IoOp::Write,
                self.store.location(),
                std::io::Error::other("manifest is not open"),
            )),
        };
        let ok = appended.is_ok();
        self.appended = Some(appended);
        if let (true, Some(f)) = (ok, self.roll.take()) {
            self.rolled = Some(self.start(f.number, &f.record));
            self.roll = Some(f);
        }
    }

    /// Starts manifest `number` with `record`, names it in the pointer and removes the
    /// one it replaces (best effort).
    fn start(&mut self, number: u64, record: &[u8]) -> Result<()> {
        let file = upload_fresh(&self.store, number, record)?;
        self.store.set_current_manifest(number)?;
        let old = std::mem::replace(&mut self.number, number);
        self.manifest = Some(file);
        if let Err(e) = self.store.remove(&StoredFile::Manifest(old)) {
            tracing::warn!(error = %e, manifest = old, "could not delete the replaced manifest");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filename;
    use crate::key::{internal_key, ValueKind};
    use crate::table_store::FsTableStore;
    use crate::version_edit::FileMeta;
    use phoenix_storage::{MemFs, SharedFs};

    fn store(fs: &SharedFs, dir: &Path) -> SharedTableStore {
        Arc::new(FsTableStore::new(Arc::clone(fs), dir))
    }

    fn meta(number: u64) -> Arc<FileMeta> {
        Arc::new(FileMeta {
            number,
            size: 10,
            smallest: internal_key(b"a", 1, ValueKind::Put),
            largest: internal_key(b"b", 1, ValueKind::Put),
            smallest_seq: 1,
            largest_seq: 1,
            min_group: 0,
            max_group: 0,
            num_entries: 1,
            num_range_deletions: 0,
        })
    }

    #[test]
    fn recovers_after_reopen_and_crash() {
        let mem = Arc::new(MemFs::new());
        let fs: SharedFs = mem.clone();
        let dir = Path::new("/db");
        fs.create_dir_all(dir).unwrap();
        {
            let mut vs = VersionSet::open(store(&fs, dir), 4, true).unwrap();
            let n = vs.new_file_number();
            let mut e = VersionEdit {
                last_sequence: Some(10),
                ..Default::default()
            };
            e.new_files.push((0, meta(n)));
            vs.log_and_apply(e).unwrap();
        }
        mem.crash();
        let vs = VersionSet::open(store(&fs, dir), 4, false).unwrap();
        assert_eq!(vs.current().files(0).len(), 1);
        assert_eq!(vs.last_sequence(), 10);
        let names = fs.list(dir).unwrap();
        let manifests = names.iter().filter(|n| n.starts_with("MANIFEST-")).count();
        assert_eq!(manifests, 1, "{names:?}");
    }

    /// On a store that uploads the whole manifest at each edit, the manifest rolls once
    /// it is twice its first record (or past a floor): an edit uploads about the live
    /// state, not the history of every edit since the last roll.
    #[test]
    fn a_manifest_uploaded_whole_stays_near_the_live_state() {
        let bucket: Arc<dyn object_store::ObjectStore> =
            Arc::new(object_store::memory::InMemory::new());
        let open = |create| {
            let store: SharedTableStore =
                Arc::new(crate::ObjectTableStore::new(Arc::clone(&bucket), "p").unwrap());
            VersionSet::open(store, 4, create).unwrap()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // (Read on the bucket: the store's own read is an open's, which takes it over.)
        let current_size = || {
            rt.block_on(async {
                use object_store::path::Path as Object;
                let named = bucket.get(&Object::from("p/CURRENT")).await.unwrap();
                let named = named.bytes().await.unwrap();
                let name = String::from_utf8_lossy(&named).trim().to_string();
                let meta = bucket.head(&Object::from(format!("p/{name}"))).await;
                meta.unwrap().size
            })
        };
        let mut vs = open(true);
        let mut largest = 0;
        let mut prev = None;
        for seq in 1..3000 {
            // One live file at a time: the state stays small, the history grows.
            let n = vs.new_file_number();
            let mut e = VersionEdit {
                last_sequence: Some(seq),
                ..Default::default()
            };
            e.new_files.push((1, meta(n)));
            if let Some(p) = prev.replace(n) {
                e.deleted_files.push((1, p));
            }
            vs.log_and_apply(e).unwrap();
            largest = largest.max(current_size());
        }
        assert!(
            largest <= WHOLE_MANIFEST_ROLL_FLOOR + 512,
            "the manifest grew to {largest} bytes"
        );
        drop(vs);
        let vs = open(false);
        assert_eq!(vs.current().files(1).len(), 1);
        assert_eq!(vs.current().files(1)[0].number, prev.unwrap());
        assert_eq!(vs.last_sequence(), 2999);
    }

    #[test]
    fn manifest_rolls_and_recovers() {
        let mem = Arc::new(MemFs::new());
        let fs: SharedFs = mem.clone();
        let dir = Path::new("/db");
        fs.create_dir_all(dir).unwrap();
        let first;
        {
            let mut vs = VersionSet::open(store(&fs, dir), 4, true).unwrap();
            vs.roll_bytes = 200;
            first = vs.manifest_number();
            for seq in 1..20 {
                let n = vs.new_file_number();
                let mut e = VersionEdit {
                    last_sequence: Some(seq),
                    ..Default::default()
                };
                e.new_files.push((0, meta(n)));
                vs.log_and_apply(e).unwrap();
            }
            assert_ne!(vs.manifest_number(), first, "manifest never rolled");
        }
        mem.crash();
        let vs = VersionSet::open(store(&fs, dir), 4, false).unwrap();
        assert_eq!(vs.current().files(0).len(), 19);
        assert_eq!(vs.last_sequence(), 19);
        // A replaced manifest whose deletion was not yet durable may reappear after the
        // crash (Db::open removes it); CURRENT names the newest.
        let current = fs.read_all(&filename::current_path(dir)).unwrap();
        assert_eq!(
            current,
            format!("{}\n", filename::manifest_name(vs.manifest_number())).into_bytes()
        );
        assert!(vs.manifest_number() > first);
    }

    #[test]
    fn torn_tail_is_dropped_but_mid_file_damage_is_corruption() {
        let e = VersionEdit {
            last_sequence: Some(5),
            ..Default::default()
        };
        let mut p = Vec::new();
        e.encode(&mut p);
        let rec = encode_record(&p);
        let mut data = rec.clone();
        data.extend_from_slice(&rec);
        let (edits, torn) = decode_manifest(Path::new("M"), &data[..data.len() - 1]).unwrap();
        assert_eq!((edits.len(), torn), (1, true));
        let mut bad = data.clone();
        bad[RECORD_HEADER] ^= 1;
        let err = decode_manifest(Path::new("M"), &bad).unwrap_err();
        assert!(err.to_string().contains("M at offset 0"), "{err}");
        let (edits, torn) = decode_manifest(Path::new("M"), &data).unwrap();
        assert_eq!((edits.len(), torn), (2, false));
    }
}

/// Entry points for the manifest fuzz targets (`fuzz/fuzz_targets/manifest_*.rs`): no
/// input may panic, and every error is a corruption naming the file and an offset
/// inside the input.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz {
    use std::path::Path;

    use super::decode_manifest;
    use crate::error::Error;
    use crate::version::Version;
    use crate::version_edit::VersionEdit;

    const FILE: &str = "/fuzz/MANIFEST-000001";

    fn check_error(e: &Error, len: usize) {
        match e {
            Error::Corruption { file, offset, .. } => {
                assert_eq!(file, Path::new(FILE), "error names another file");
                assert!(*offset <= len as u64, "offset {offset} beyond {len} bytes");
            }
            other => panic!("manifest decoding gave a non-corruption error: {other}"),
        }
    }

    /// Decodes `data` as a whole manifest and replays its edits onto a version.
    pub fn fuzz_manifest(data: &[u8]) {
        match decode_manifest(Path::new(FILE), data) {
            Ok((edits, _torn)) => {
                let mut v = Version::empty(crate::options::LEVELS_MAX);
                for (_, e) in &edits {
                    match v.apply(e) {
                        Ok(next) => v = next,
                        Err(_) => break,
                    }
                }
            }
            Err(e) => check_error(&e, data.len()),
        }
    }

    /// Decodes `data` as one version edit; a successful decode re-encodes identically.
    pub fn fuzz_version_edit(data: &[u8]) {
        match VersionEdit::decode(data) {
            Ok(e) => {
                let mut again = Vec::new();
                e.encode(&mut again);
                let back = VersionEdit::decode(&again);
                assert!(
                    back.as_ref().is_ok_and(|b| *b == e),
                    "edit does not round-trip"
                );
            }
            Err((at, _)) => assert!(at <= data.len(), "error offset {at} beyond input"),
        }
    }

    /// Decodes `data` as a write batch (a WAL record's payload).
    pub fn fuzz_write_batch(data: &[u8]) {
        match crate::write_batch::WriteBatch::decode(data, Path::new(FILE), 0) {
            Ok(b) => {
                let n = b.iter().count();
                assert_eq!(n as u64, u64::from(b.count()));
            }
            Err(e) => check_error(&e, data.len()),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::key::{internal_key, ValueKind};
        use crate::version_edit::FileMeta;
        use crate::version_set::encode_record;
        use rand::{Rng, SeedableRng};
        use std::sync::Arc;

        fn valid_manifest() -> Vec<u8> {
            let mut out = Vec::new();
            for n in 1..4u64 {
                let mut e = VersionEdit {
                    last_sequence: Some(n * 10),
                    next_file_number: Some(n + 10),
                    ..Default::default()
                };
                e.new_files.push((
                    n as usize,
                    Arc::new(FileMeta {
                        number: n,
                        size: 100 * n,
                        smallest: internal_key(format!("a{n}").as_bytes(), n, ValueKind::Put),
                        largest: internal_key(format!("b{n}").as_bytes(), n, ValueKind::Put),
                        smallest_seq: n,
                        largest_seq: n,
                        min_group: 0,
                        max_group: 0,
                        num_entries: 1,
                        num_range_deletions: 0,
                    }),
                ));
                let mut p = Vec::new();
                e.encode(&mut p);
                out.extend_from_slice(&encode_record(&p));
            }
            out
        }

        /// Seeded mutations of a valid manifest, edit and batch; `PHOENIX_SEED` replays.
        #[test]
        fn decoders_survive_mutations() {
            let seed = std::env::var("PHOENIX_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(7u64);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let manifest = valid_manifest();
            let mut edit = Vec::new();
            let (edits, _) = decode_manifest(Path::new(FILE), &manifest).unwrap();
            edits[0].1.encode(&mut edit);
            let mut wb = crate::write_batch::WriteBatch::new();
            wb.put(b"k", b"v");
            wb.delete_range(b"a", b"b");
            wb.set_sequence(9);
            let batch = wb.data().to_vec();
            for i in 0..3000 {
                for (base, f) in [
                    (&manifest, fuzz_manifest as fn(&[u8])),
                    (&edit, fuzz_version_edit),
                    (&batch, fuzz_write_batch),
                ] {
                    let mut d = base.clone();
                    for _ in 0..rng.gen_range(1..4) {
                        let at = rng.gen_range(0..d.len());
                        d[at] ^= 1 << rng.gen_range(0..8);
                    }
                    if i % 5 == 0 {
                        d.truncate(rng.gen_range(0..d.len()));
                    }
                    f(&d);
                }
            }
            // Every single-byte flip of a record body before the last record is caught.
            for at in 8..manifest.len() / 3 {
                let mut d = manifest.clone();
                d[at] ^= 0x40;
                let r = decode_manifest(Path::new(FILE), &d);
                assert!(r.is_err(), "flip at {at} went unnoticed");
            }
        }
    }
}
