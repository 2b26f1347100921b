//! [`MemFs`]: an in-memory [`FileSystem`] for tests that can crash and fail on command.
//!
//! The model it implements is documented on [`MemFs`] itself, so that it shows in the
//! crate's API docs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::util::{check_direct_append, write_atomic_via};
use crate::{Error, FileLock, FileSystem, IoOp, ReadableFile, Result, WritableFile, WriteOptions};

/// A class of operations, for fault injection and operation counts (see [`MemFs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// Data writes: `append`, `preallocate`.
    Write,
    /// Syncs: `sync_data`, `sync_all`, `sync_dir`.
    Sync,
    /// Reads and queries: `open`, `read_at`, `read_exact_at`, `list`, `exists`, `file_size`.
    Read,
    /// Name changes: `create`, `reopen`, `rename`, `delete`, directory creation.
    Meta,
    /// Every mutating operation (`Write`, `Sync` and `Meta`).
    Any,
}

impl FaultKind {
    fn index(self) -> usize {
        match self {
            FaultKind::Write => 0,
            FaultKind::Sync => 1,
            FaultKind::Read => 2,
            FaultKind::Meta => 3,
            FaultKind::Any => 4,
        }
    }
}

/// A pending injected fault.
#[derive(Clone, Debug)]
struct Fault {
    kind: FaultKind,
    /// The value of `counts[kind]` at which the fault fires.
    target: u64,
    error: io::ErrorKind,
    sticky: bool,
    message: &'static str,
}

/// An inode's bytes. Invariant: `durable` is what a crash now would leave, and outside
/// `dirty` (and below `durable.len()`), `cur` equals `durable` unless `truncated`.
#[derive(Debug, Default)]
struct FileData {
    cur: Vec<u8>,
    durable: Vec<u8>,
    /// Hull `[lo, hi)` of the byte ranges written since the last sync.
    dirty: Option<(usize, usize)>,
    /// Whether `create` truncated the file since the last sync.
    truncated: bool,
}

impl FileData {
    fn mark_dirty(&mut self, lo: usize, hi: usize) {
        self.dirty = Some(match self.dirty {
            None => (lo, hi),
            Some((a, b)) => (a.min(lo), b.max(hi)),
        });
    }

    /// Writes `data` at `pos`; a gap past the end reads as zeros (a POSIX hole).
    fn write_at(&mut self, pos: usize, data: &[u8]) {
        let end = pos + data.len();
        let lo = pos.min(self.cur.len());
        if self.cur.len() < end {
            self.cur.resize(end, 0);
        }
        self.cur[pos..end].copy_from_slice(data);
        self.mark_dirty(lo, end);
    }

    fn truncate(&mut self) {
        self.cur.clear();
        self.truncated = true;
        self.mark_dirty(0, 0);
    }

    fn extend_zeros(&mut self, len: usize) {
        let old = self.cur.len();
        if len > old {
            self.cur.resize(len, 0);
            self.mark_dirty(old, len);
        }
    }

    /// Makes the current bytes durable, copying only the dirty range.
    fn sync(&mut self) {
        let n = self.cur.len();
        self.durable.resize(n, 0);
        if let Some((lo, hi)) = self.dirty.take() {
            let hi = hi.min(n);
            if lo < hi {
                self.durable[lo..hi].copy_from_slice(&self.cur[lo..hi]);
            }
        }
        self.truncated = false;
        debug_assert_eq!(self.durable.len(), self.cur.len());
    }

    /// Reverts to the durable bytes; with `torn`, first lets a random prefix of the
    /// unsynced written range reach the "disk".
    fn crash(&mut self, torn: Option<&mut SplitMix64>) {
        if let (Some(rng), false, Some((lo, hi))) = (torn, self.truncated, self.dirty) {
            let hi = hi.min(self.cur.len());
            if lo < hi {
                let keep = rng.below((hi - lo) as u64 + 1) as usize;
                let end = lo + keep;
                if keep > 0 {
                    if self.durable.len() < end {
                        self.durable.resize(end, 0);
                    }
                    self.durable[lo..end].copy_from_slice(&self.cur[lo..end]);
                }
            }
        }
        self.cur.clone_from(&self.durable);
        self.dirty = None;
        self.truncated = false;
    }
}

type FileRef = Arc<Mutex<FileData>>;
type DirId = u64;

#[derive(Clone, Debug)]
enum Node {
    File(FileRef),
    Dir(DirId),
}

#[derive(Debug, Default)]
struct DirData {
    cur: BTreeMap<String, Node>,
    durable: BTreeMap<String, Node>,
}

const ROOT: DirId = 0;

#[derive(Debug)]
struct State {
    epoch: u64,
    dirs: HashMap<DirId, DirData>,
    next_dir: DirId,
    counts: [u64; 5],
    faults: Vec<Fault>,
    locks: HashMap<Vec<String>, u64>,
    next_lock: u64,
}

/// Builds an `io::Error` with a fixed message.
fn ioe(kind: io::ErrorKind, msg: &str) -> io::Error {
    io::Error::new(kind, msg.to_string())
}

fn stale(op: IoOp, path: &Path) -> Error {
    Error::io(
        op,
        path,
        ioe(
            io::ErrorKind::Other,
            "stale handle: opened before a simulated crash of the in-memory file system",
        ),
    )
}

/// The names of `path` below the root.
fn components(path: &Path, op: IoOp) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(s) => match s.to_str() {
                Some(s) => out.push(s.to_string()),
                None => {
                    return Err(Error::io(
                        op,
                        path,
                        ioe(io::ErrorKind::InvalidInput, "path is not UTF-8"),
                    ))
                }
            },
            Component::ParentDir | Component::Prefix(_) => {
                return Err(Error::io(
                    op,
                    path,
                    ioe(
                        io::ErrorKind::InvalidInput,
                        "'..' and prefixes are not supported",
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// Splits the names of `path` into parent names and the last name.
fn split_last(path: &Path, op: IoOp) -> Result<(Vec<String>, String)> {
    let mut comps = components(path, op)?;
    match comps.pop() {
        Some(name) => Ok((comps, name)),
        None => Err(Error::io(
            op,
            path,
            ioe(io::ErrorKind::IsADirectory, "the root directory"),
        )),
    }
}

impl State {
    fn new() -> Self {
        let mut dirs = HashMap::new();
        dirs.insert(ROOT, DirData::default());
        State {
            epoch: 0,
            dirs,
            next_dir: ROOT + 1,
            counts: [0; 5],
            faults: Vec::new(),
            locks: HashMap::new(),
            next_lock: 0,
        }
    }

    /// Counts an operation of class `kind` and fails it if a fault says so.
    fn tick(&mut self, kind: FaultKind, op: IoOp, path: &Path) -> Result<()> {
        debug_assert!(kind != FaultKind::Any, "an operation has a concrete class");
        let mutating = kind != FaultKind::Read;
        self.counts[kind.index()] += 1;
        if mutating {
            self.counts[FaultKind::Any.index()] += 1;
        }
        let counts = self.counts;
        let mut fired = None;
        for f in &self.faults {
            let applies = f.kind == kind || (f.kind == FaultKind::Any && mutating);
            let c = counts[f.kind.index()];
            if applies && (c == f.target || (f.sticky && c > f.target)) {
                fired = Some((f.error, f.message));
                break;
            }
        }
        // Spent one-shot faults are dropped.
        self.faults
            .retain(|f| f.sticky || counts[f.kind.index()] < f.target);
        match fired {
            Some((kind, message)) => Err(Error::io(op, path, ioe(kind, message))),
            None => Ok(()),
        }
    }

    fn dir(&self, id: DirId) -> &DirData {
        // Every DirId reachable from a node is in the table (crash keeps what it reaches).
        match self.dirs.get(&id) {
            Some(d) => d,
            None => unreachable_dir(id),
        }
    }

    fn dir_mut(&mut self, id: DirId) -> &mut DirData {
        match self.dirs.get_mut(&id) {
            Some(d) => d,
            None => unreachable_dir(id),
        }
    }

    /// The directory at `names` (all must be directories).
    fn walk_dir(&self, names: &[String]) -> io::Result<DirId> {
        let mut id = ROOT;
        for name in names {
            match self.dir(id).cur.get(name) {
                Some(Node::Dir(child)) => id = *child,
                Some(Node::File(_)) => {
                    return Err(ioe(
                        io::ErrorKind::NotADirectory,
                        "a path component is a file",
                    ))
                }
                None => {
                    return Err(ioe(
                        io::ErrorKind::NotFound,
                        "no such file or directory (a parent is missing)",
                    ))
                }
            }
        }
        Ok(id)
    }

    /// The node at `names`; `Ok(None)` if only the last name is missing.
    fn lookup(&self, names: &[String]) -> io::Result<Option<Node>> {
        match names.split_last() {
            None => Ok(Some(Node::Dir(ROOT))),
            Some((last, parent)) => {
                let pid = self.walk_dir(parent)?;
                Ok(self.dir(pid).cur.get(last).cloned())
            }
        }
    }

    fn lookup_file(&self, path: &Path, op: IoOp) -> Result<FileRef> {
        let names = components(path, op)?;
        match self.lookup(&names) {
            Ok(Some(Node::File(f))) => Ok(f),
            Ok(Some(Node::Dir(_))) => Err(Error::io(
                op,
                path,
                ioe(io::ErrorKind::IsADirectory, "is a directory"),
            )),
            Ok(None) => Err(Error::io(
                op,
                path,
                ioe(io::ErrorKind::NotFound, "no such file"),
            )),
            Err(e) => Err(Error::io(op, path, e)),
        }
    }

    fn lookup_dir(&self, path: &Path, op: IoOp) -> Result<DirId> {
        let names = components(path, op)?;
        match self.lookup(&names) {
            Ok(Some(Node::Dir(id))) => Ok(id),
            Ok(Some(Node::File(_))) => Err(Error::io(
                op,
                path,
                ioe(io::ErrorKind::NotADirectory, "not a directory"),
            )),
            Ok(None) => Err(Error::io(
                op,
                path,
                ioe(io::ErrorKind::NotFound, "no such directory"),
            )),
            Err(e) => Err(Error::io(op, path, e)),
        }
    }

    /// The parent directory of `path` and the last name.
    fn parent_of(&self, path: &Path, op: IoOp) -> Result<(DirId, String)> {
        let (parent, name) = split_last(path, op)?;
        let pid = self.walk_dir(&parent).map_err(|e| Error::io(op, path, e))?;
        Ok((pid, name))
    }

    fn new_dir(&mut self) -> DirId {
        let id = self.next_dir;
        self.next_dir += 1;
        self.dirs.insert(id, DirData::default());
        id
    }

    /// Reverts everything to its durable state (see [`MemFs`]).
    fn crash(&mut self, mut torn: Option<&mut SplitMix64>) {
        self.epoch += 1;
        self.faults.clear();
        self.locks.clear();
        let mut old = std::mem::take(&mut self.dirs);
        let mut kept: HashMap<DirId, DirData> = HashMap::new();
        let mut seen_files: HashSet<*const Mutex<FileData>> = HashSet::new();
        // Depth-first over sorted entries: a fixed order, so torn crashes replay exactly.
        let mut stack = vec![ROOT];
        while let Some(id) = stack.pop() {
            if kept.contains_key(&id) {
                continue;
            }
            let Some(mut d) = old.remove(&id) else {
                continue;
            };
            d.cur.clone_from(&d.durable);
            for node in d.durable.values().rev() {
                match node {
                    Node::File(f) => {
                        if seen_files.insert(Arc::as_ptr(f)) {
                            f.lock().crash(torn.as_deref_mut());
                        }
                    }
                    Node::Dir(child) => stack.push(*child),
                }
            }
            kept.insert(id, d);
        }
        kept.entry(ROOT).or_default();
        self.dirs = kept;
    }

    /// Sum of the current sizes of the files below `id`.
    fn bytes_below(&self, id: DirId) -> u64 {
        let mut total = 0u64;
        let mut seen = HashSet::new();
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            for node in self.dir(id).cur.values() {
                match node {
                    Node::File(f) => total += f.lock().cur.len() as u64,
                    Node::Dir(child) => stack.push(*child),
                }
            }
        }
        total
    }
}

#[cold]
fn unreachable_dir(id: DirId) -> ! {
    panic!("MemFs invariant broken: directory {id} is referenced but not in the table")
}

/// A small deterministic generator (SplitMix64) for torn crashes: stable across versions
/// of any crate, so a seed replays forever.
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough value in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        self.next() % n
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

/// An in-memory file system that can crash and fail on command.
///
/// Cloning gives another handle on the same file system, so a test can keep one while the
/// code under test holds an `Arc<dyn FileSystem>`.
///
/// # The model
///
/// - **Tree.** Directories hold entries `name -> node`; a node is a directory or a file
///   *inode*. Handles hold the inode, not the name, so an open file survives a rename or
///   delete of its name, as on POSIX. The root always exists and is always durable.
/// - **Files.** Every inode has *current* bytes (what reads see) and *durable* bytes (what
///   survives a crash). `sync_data` and `sync_all` make the current bytes durable (both:
///   the model does not tell data from size). `preallocate` extends with zeros and then
///   syncs the whole file, exactly like `fallocate` + `fsync` in `LocalFs`. `create` on an
///   existing file truncates the same inode; the truncation too is durable only once the
///   file is synced. A sync copies only the range written since the last sync (the hull of
///   the writes), so syncing a long log costs the size of the new records.
/// - **Directories.** Every directory has *current* entries and *durable* entries.
///   `sync_dir(d)` makes `d`'s current entry set durable (names -> inodes). A created,
///   renamed or deleted name is durable only after `sync_dir` of its parent: a file
///   created and synced whose directory was never synced is lost by a crash.
///   `create_dir_all` syncs the parent of every directory it creates; `write_atomic` is
///   the same recipe as `LocalFs` (create `<path>.tmp`, append, `sync_all`, rename,
///   `sync_dir`), made of those individual operations, so a crash or a fault can hit it
///   between any two of them. Durability is per directory: a rename across two
///   directories of which only one was synced leaves, after a crash, the entry in both
///   or in neither (stricter file systems journal the pair together). Two names left on
///   one inode that way are two names: writes through one show through the other, and
///   renaming one over the other removes the source name.
///   Directories are synced only by name: `sync_dir` does not sync the files in them.
/// - **Crash.** [`MemFs::crash`] keeps exactly what is reachable from the root through
///   durable entries; every such directory's entries and every such file's bytes revert to
///   their durable state. The epoch is bumped: every handle opened before (writers,
///   readers) fails every later operation with an `Error::Io` saying it is stale. All
///   locks are released and all faults are cleared (the machine rebooted).
///   [`MemFs::crash_torn`] is the same, except that for every surviving file written since
///   its last sync (and not truncated since), a seeded-random prefix (0 to all bytes) of
///   the written range is kept: a torn write where some sectors made it (this covers
///   appends past the durable end and overwrites inside a preallocated region alike).
///   Files are visited in a fixed order, so a seed always tears the same way.
/// - **Faults.** Every operation belongs to one class ([`FaultKind`]), and every class
///   keeps a counter of the operations attempted so far, failed ones included, stale
///   handles' refused ones not ([`MemFs::op_count`]):
///   `Write` = `append`, `preallocate`; `Sync` = `sync_data`, `sync_all`, `sync_dir`;
///   `Meta` = `create`, `reopen`, `rename`, `delete`, each directory `create_dir_all`
///   makes; `Read` = `open`, `read_at`, `read_exact_at`, `list`, `exists`, `file_size`.
///   `Any` counts every operation of `Write`, `Sync` and `Meta` (the mutating ones).
///   `write_atomic` and `create_dir_all` count as the operations they are made of.
///   `lock` is never counted nor failed. [`MemFs::inject`] makes the nth operation of a
///   class from now fail (and, if sticky, every later one); a failed operation has no
///   effect at all. [`MemFs::freeze_after`] stops the world: after n more mutating
///   operations every mutating operation fails, which is how a crash test halts a run
///   "mid-flush" before calling `crash`.
/// - **Locks** are in memory: a second `lock` of a path fails with `Error::Locked` until
///   the guard is dropped or the file system crashes.
///
/// Paths: absolute and relative paths both start at the root; `.` is ignored and `..` is
/// refused, as are names that are not UTF-8. Error kinds follow POSIX (`NotFound`,
/// `NotADirectory`, `IsADirectory`, `DirectoryNotEmpty`).
///
/// Concurrency: one mutex guards the tree, the counters and the faults; each inode has
/// its own mutex, always taken after the tree's. Every operation is atomic with respect
/// to the others.
#[derive(Clone)]
pub struct MemFs {
    shared: Arc<Shared>,
}

impl fmt::Debug for MemFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("MemFs")
            .field("epoch", &st.epoch)
            .field("dirs", &st.dirs.len())
            .field("faults", &st.faults.len())
            .finish()
    }
}

impl Default for MemFs {
    fn default() -> Self {
        Self::new()
    }
}

impl MemFs {
    /// An empty file system holding only the (durable) root directory.
    pub fn new() -> Self {
        MemFs {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new()),
            }),
        }
    }

    /// Simulates a power loss: everything reverts to its durable state, handles opened
    /// before become stale, locks are released and faults cleared.
    pub fn crash(&self) {
        self.shared.state.lock().crash(None);
    }

    /// Like [`MemFs::crash`], but every file written since its last sync keeps a random
    /// prefix (chosen by `seed`) of its unsynced written range: a torn write.
    pub fn crash_torn(&self, seed: u64) {
        let mut rng = SplitMix64(seed);
        self.shared.state.lock().crash(Some(&mut rng));
    }

    /// Makes the `nth` (1-based, counted from this call) operation of class `kind` fail
    /// with an `io::Error` of kind `error`, and if `sticky` every later one too. A failed
    /// operation has no effect.
    ///
    /// # Panics
    /// If `nth` is 0.
    pub fn inject(&self, kind: FaultKind, nth: u64, error: io::ErrorKind, sticky: bool) {
        self.inject_with(kind, nth, error, sticky, "injected fault");
    }

    fn inject_with(
        &self,
        kind: FaultKind,
        nth: u64,
        error: io::ErrorKind,
        sticky: bool,
        message: &'static str,
    ) {
        assert!(nth >= 1, "MemFs::inject: nth is 1-based");
        let mut st = self.shared.state.lock();
        let target = st.counts[kind.index()] + nth;
        st.faults.push(Fault {
            kind,
            target,
            error,
            sticky,
            message,
        });
    }

    /// Removes every pending fault (a freeze included).
    pub fn clear_faults(&self) {
        self.shared.state.lock().faults.clear();
    }

    /// How many operations of class `kind` were attempted so far (failed ones included).
    pub fn op_count(&self, kind: FaultKind) -> u64 {
        self.shared.state.lock().counts[kind.index()]
    }

    /// After `n` more mutating operations succeed, every mutating operation fails with
    /// `ErrorKind::Other` ("frozen"), until [`MemFs::crash`] or [`MemFs::clear_faults`].
    pub fn freeze_after(&self, n: u64) {
        self.inject_with(FaultKind::Any, n + 1, io::ErrorKind::Other, true, "frozen");
    }

    /// Sum of the current sizes of all files under `dir`, recursively (0 if `dir` does not
    /// exist or is not a directory).
    pub fn total_file_bytes(&self, dir: &Path) -> u64 {
        let st = self.shared.state.lock();
        match st.lookup_dir(dir, IoOp::Stat) {
            Ok(id) => st.bytes_below(id),
            Err(_) => 0,
        }
    }

    /// The size `path` would have after a crash now, if its bytes were synced and its name
    /// is durable (`None` if a crash would lose the name). For assertions in tests.
    pub fn durable_size(&self, path: &Path) -> Option<u64> {
        self.with_durable_file(path, |f| f.durable.len() as u64)
    }

    /// The bytes `path` would hold after a (non-torn) crash now (`None` if a crash would
    /// lose the name). For assertions in tests.
    pub fn durable_contents(&self, path: &Path) -> Option<Vec<u8>> {
        self.with_durable_file(path, |f| f.durable.clone())
    }

    /// Runs `read` on the inode `path` names through durable entries only.
    fn with_durable_file<T>(&self, path: &Path, read: impl FnOnce(&FileData) -> T) -> Option<T> {
        let st = self.shared.state.lock();
        let names = components(path, IoOp::Stat).ok()?;
        let (last, parents) = names.split_last()?;
        let mut id = ROOT;
        for name in parents {
            match st.dir(id).durable.get(name) {
                Some(Node::Dir(child)) => id = *child,
                _ => return None,
            }
        }
        match st.dir(id).durable.get(last) {
            Some(Node::File(f)) => Some(read(&f.lock())),
            _ => None,
        }
    }

    fn writer(
        &self,
        st: &State,
        file: FileRef,
        path: &Path,
        pos: u64,
        opts: WriteOptions,
    ) -> MemWritable {
        MemWritable {
            shared: Arc::clone(&self.shared),
            file,
            path: path.to_path_buf(),
            pos,
            epoch: st.epoch,
            direct_io: opts.direct_io,
        }
    }
}

impl FileSystem for MemFs {
    fn create(&self, path: &Path, opts: WriteOptions) -> Result<Box<dyn WritableFile>> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Meta, IoOp::Open, path)?;
        let (pid, name) = st.parent_of(path, IoOp::Open)?;
        let file = match st.dir(pid).cur.get(&name) {
            Some(Node::File(f)) => {
                f.lock().truncate();
                Arc::clone(f)
            }
            Some(Node::Dir(_)) => {
                return Err(Error::io(
                    IoOp::Open,
                    path,
                    ioe(io::ErrorKind::IsADirectory, "is a directory"),
                ))
            }
            None => {
                let f: FileRef = Arc::new(Mutex::new(FileData::default()));
                st.dir_mut(pid).cur.insert(name, Node::File(Arc::clone(&f)));
                f
            }
        };
        Ok(Box::new(self.writer(&st, file, path, 0, opts)))
    }

    fn reopen(
        &self,
        path: &Path,
        offset: u64,
        opts: WriteOptions,
    ) -> Result<Box<dyn WritableFile>> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Meta, IoOp::Open, path)?;
        let file = st.lookup_file(path, IoOp::Open)?;
        let size = file.lock().cur.len() as u64;
        if offset > size {
            return Err(Error::InvalidArgument {
                path: path.to_path_buf(),
                reason: format!("reopen at offset {offset} past the end of the file ({size})"),
            });
        }
        Ok(Box::new(self.writer(&st, file, path, offset, opts)))
    }

    fn open(&self, path: &Path) -> Result<Arc<dyn ReadableFile>> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Read, IoOp::Open, path)?;
        let file = st.lookup_file(path, IoOp::Open)?;
        Ok(Arc::new(MemReadable {
            shared: Arc::clone(&self.shared),
            file,
            path: path.to_path_buf(),
            epoch: st.epoch,
        }))
    }

    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Read, IoOp::List, dir)?;
        let id = st.lookup_dir(dir, IoOp::List)?;
        // BTreeMap keys are already sorted.
        Ok(st.dir(id).cur.keys().cloned().collect())
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Read, IoOp::Stat, path)?;
        let names = components(path, IoOp::Stat)?;
        match st.lookup(&names) {
            Ok(node) => Ok(node.is_some()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(Error::io(IoOp::Stat, path, e)),
        }
    }

    fn file_size(&self, path: &Path) -> Result<u64> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Read, IoOp::Stat, path)?;
        let file = st.lookup_file(path, IoOp::Stat)?;
        let len = file.lock().cur.len() as u64;
        Ok(len)
    }

    fn delete(&self, path: &Path) -> Result<()> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Meta, IoOp::Delete, path)?;
        let (pid, name) = st.parent_of(path, IoOp::Delete)?;
        match st.dir(pid).cur.get(&name) {
            Some(Node::File(_)) => {
                st.dir_mut(pid).cur.remove(&name);
                Ok(())
            }
            Some(Node::Dir(_)) => Err(Error::io(
                IoOp::Delete,
                path,
                ioe(io::ErrorKind::IsADirectory, "is a directory"),
            )),
            None => Err(Error::io(
                IoOp::Delete,
                path,
                ioe(io::ErrorKind::NotFound, "no such file"),
            )),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Meta, IoOp::Rename, from)?;
        let fail = |kind: io::ErrorKind, what: &str| {
            Error::io(
                IoOp::Rename,
                from,
                io::Error::new(kind, format!("to {}: {what}", to.display())),
            )
        };
        let from_names = components(from, IoOp::Rename)?;
        let to_names = components(to, IoOp::Rename)?;
        let (from_pid, from_name) = st.parent_of(from, IoOp::Rename)?;
        let (to_pid, to_name) = st
            .parent_of(to, IoOp::Rename)
            .map_err(|e| fail(e.io_kind().unwrap_or(io::ErrorKind::Other), "target parent"))?;
        let Some(src) = st.dir(from_pid).cur.get(&from_name).cloned() else {
            return Err(fail(io::ErrorKind::NotFound, "no such file or directory"));
        };
        if from_names == to_names {
            return Ok(());
        }
        let dst = st.dir(to_pid).cur.get(&to_name).cloned();
        match (&src, &dst) {
            (Node::Dir(_), _) if to_names.starts_with(&from_names) => {
                return Err(fail(
                    io::ErrorKind::InvalidInput,
                    "cannot move a directory into itself",
                ))
            }
            (Node::Dir(_), Some(Node::File(_))) => {
                return Err(fail(io::ErrorKind::NotADirectory, "target is a file"))
            }
            (Node::File(_), Some(Node::Dir(_))) => {
                return Err(fail(io::ErrorKind::IsADirectory, "target is a directory"))
            }
            (Node::Dir(_), Some(Node::Dir(d))) if !st.dir(*d).cur.is_empty() => {
                return Err(fail(
                    io::ErrorKind::DirectoryNotEmpty,
                    "target directory is not empty",
                ))
            }
            _ => {}
        }
        st.dir_mut(from_pid).cur.remove(&from_name);
        st.dir_mut(to_pid).cur.insert(to_name, src);
        Ok(())
    }

    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        let mut st = self.shared.state.lock();
        let names = components(dir, IoOp::CreateDir)?;
        let mut shown = if dir.has_root() {
            PathBuf::from("/")
        } else {
            PathBuf::new()
        };
        let mut id = ROOT;
        for name in &names {
            shown.push(name);
            match st.dir(id).cur.get(name) {
                Some(Node::Dir(child)) => {
                    id = *child;
                    continue;
                }
                Some(Node::File(_)) => {
                    return Err(Error::io(
                        IoOp::CreateDir,
                        &shown,
                        ioe(
                            io::ErrorKind::NotADirectory,
                            "exists and is not a directory",
                        ),
                    ))
                }
                None => {}
            }
            st.tick(FaultKind::Meta, IoOp::CreateDir, &shown)?;
            let child = st.new_dir();
            st.dir_mut(id).cur.insert(name.clone(), Node::Dir(child));
            // Sync the parent so the new entry is durable, as LocalFs does.
            let parent_shown = shown.parent().unwrap_or(Path::new("/")).to_path_buf();
            st.tick(FaultKind::Sync, IoOp::Sync, &parent_shown)?;
            let parent = st.dir_mut(id);
            parent.durable.clone_from(&parent.cur);
            id = child;
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        let mut st = self.shared.state.lock();
        st.tick(FaultKind::Sync, IoOp::Sync, dir)?;
        let id = st.lookup_dir(dir, IoOp::Sync)?;
        let d = st.dir_mut(id);
        d.durable.clone_from(&d.cur);
        Ok(())
    }

    fn write_atomic(&self, path: &Path, data: &[u8]) -> Result<()> {
        write_atomic_via(self, path, data)
    }

    /// Memory is not a disk: never short of space. (Tests of a full disk put a
    /// [`crate::FaultFs`] over it.)
    fn available_space(&self, _dir: &Path) -> Result<u64> {
        Ok(u64::MAX)
    }

    fn lock(&self, path: &Path) -> Result<Box<dyn FileLock>> {
        let mut st = self.shared.state.lock();
        let (pid, name) = st.parent_of(path, IoOp::Lock)?;
        match st.dir(pid).cur.get(&name) {
            Some(Node::File(_)) => {}
            Some(Node::Dir(_)) => {
                return Err(Error::io(
                    IoOp::Lock,
                    path,
                    ioe(io::ErrorKind::IsADirectory, "is a directory"),
                ))
            }
            None => {
                let f: FileRef = Arc::new(Mutex::new(FileData::default()));
                st.dir_mut(pid).cur.insert(name, Node::File(f));
            }
        }
        let key = components(path, IoOp::Lock)?;
        if st.locks.contains_key(&key) {
            return Err(Error::Locked {
                path: path.to_path_buf(),
            });
        }
        let id = st.next_lock;
        st.next_lock += 1;
        st.locks.insert(key.clone(), id);
        Ok(Box::new(MemLock {
            shared: Arc::clone(&self.shared),
            key,
            id,
        }))
    }
}

/// A writer on an inode of a [`MemFs`].
struct MemWritable {
    shared: Arc<Shared>,
    file: FileRef,
    path: PathBuf,
    pos: u64,
    epoch: u64,
    direct_io: bool,
}

impl fmt::Debug for MemWritable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemWritable")
            .field("path", &self.path)
            .field("pos", &self.pos)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl MemWritable {
    /// Checks the handle is live and counts the operation.
    fn begin(&self, kind: FaultKind, op: IoOp) -> Result<parking_lot::MutexGuard<'_, State>> {
        let mut st = self.shared.state.lock();
        if st.epoch != self.epoch {
            return Err(stale(op, &self.path));
        }
        st.tick(kind, op, &self.path)?;
        Ok(st)
    }
}

impl WritableFile for MemWritable {
    fn append(&mut self, data: &[u8]) -> Result<()> {
        if self.direct_io {
            check_direct_append(&self.path, data, self.pos)?;
        }
        let len = data.len() as u64;
        let end = self
            .pos
            .checked_add(len)
            .and_then(|e| usize::try_from(e).ok())
            .ok_or_else(|| Error::InvalidArgument {
                path: self.path.clone(),
                reason: format!("append of {len} bytes at {} exceeds memory", self.pos),
            })?;
        let st = self.begin(FaultKind::Write, IoOp::Write)?;
        self.file.lock().write_at(end - data.len(), data);
        // The tree lock is held across the write so that a crash sees all of it or none.
        drop(st);
        self.pos = end as u64;
        Ok(())
    }

    fn sync_data(&mut self) -> Result<()> {
        let _st = self.begin(FaultKind::Sync, IoOp::Sync)?;
        self.file.lock().sync();
        Ok(())
    }

    fn sync_all(&mut self) -> Result<()> {
        let _st = self.begin(FaultKind::Sync, IoOp::Sync)?;
        self.file.lock().sync();
        Ok(())
    }

    fn preallocate(&mut self, len: u64) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| Error::InvalidArgument {
            path: self.path.clone(),
            reason: format!("preallocate length {len} exceeds memory"),
        })?;
        let _st = self.begin(FaultKind::Write, IoOp::Preallocate)?;
        let mut f = self.file.lock();
        f.extend_zeros(n);
        // fallocate + fsync: the whole file, not only the new size, becomes durable.
        f.sync();
        Ok(())
    }

    fn position(&self) -> u64 {
        self.pos
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// A reader on an inode of a [`MemFs`].
struct MemReadable {
    shared: Arc<Shared>,
    file: FileRef,
    path: PathBuf,
    epoch: u64,
}

impl fmt::Debug for MemReadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemReadable")
            .field("path", &self.path)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl MemReadable {
    fn begin(&self) -> Result<parking_lot::MutexGuard<'_, State>> {
        let mut st = self.shared.state.lock();
        if st.epoch != self.epoch {
            return Err(stale(IoOp::Read, &self.path));
        }
        st.tick(FaultKind::Read, IoOp::Read, &self.path)?;
        Ok(st)
    }
}

impl ReadableFile for MemReadable {
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let _st = self.begin()?;
        let f = self.file.lock();
        let size = f.cur.len() as u64;
        let end = offset.checked_add(buf.len() as u64);
        match end {
            Some(end) if end <= size => {
                // In range: `offset < end <= size`, which fits usize.
                let (lo, hi) = (offset as usize, end as usize);
                buf.copy_from_slice(&f.cur[lo..hi]);
                Ok(())
            }
            _ => Err(Error::io(
                IoOp::Read,
                &self.path,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{} bytes at offset {offset}: past the end of the file ({size})",
                        buf.len()
                    ),
                ),
            )),
        }
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let _st = self.begin()?;
        let f = self.file.lock();
        let size = f.cur.len() as u64;
        if offset >= size {
            return Ok(0);
        }
        let n = (size - offset).min(buf.len() as u64) as usize;
        let lo = offset as usize;
        buf[..n].copy_from_slice(&f.cur[lo..lo + n]);
        Ok(n)
    }

    fn size(&self) -> u64 {
        self.file.lock().cur.len() as u64
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// An in-memory lock; released on drop unless a crash released it already.
struct MemLock {
    shared: Arc<Shared>,
    key: Vec<String>,
    id: u64,
}

impl fmt::Debug for MemLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemLock").field("key", &self.key).finish()
    }
}

impl FileLock for MemLock {}

impl Drop for MemLock {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock();
        // After a crash someone else may hold the same path: release only our own lock.
        if st.locks.get(&self.key) == Some(&self.id) {
            st.locks.remove(&self.key);
        }
    }
}
