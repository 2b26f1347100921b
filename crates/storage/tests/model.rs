//! Random operation sequences checked against a plain model of the durability rules.
//!
//! The model keeps whole copies (current and durable bytes per inode, current and durable
//! entries per directory) and no cleverness, so it is easy to trust. `MemFs` runs with
//! crashes and injected faults; `LocalFs` runs the same sequences without them.
//!
//! Replay one case: `PHOENIX_SEED=<seed> cargo test -p phoenix-storage --test model`.
//! More cases: `PHOENIX_STORAGE_CASES=<n>` (default 400 for MemFs, 8 for LocalFs);
//! longer runs: `PHOENIX_STORAGE_OPS=<n>` (default 300).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use phoenix_storage::{
    FaultKind, FileSystem, LocalFs, MemFs, ReadableFile, WritableFile, WriteOptions,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const OPTS: WriteOptions = WriteOptions { direct_io: false };
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const DIRS: [&str; 2] = ["", "sub"];

#[derive(Clone, Debug, Default)]
struct Inode {
    cur: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Clone, Debug, Default)]
struct Dir {
    cur: BTreeMap<String, usize>,
    durable: BTreeMap<String, usize>,
}

#[derive(Debug, Default)]
struct Model {
    inodes: Vec<Inode>,
    dirs: [Dir; 2],
}

impl Model {
    fn crash(&mut self) {
        for d in &mut self.dirs {
            d.cur = d.durable.clone();
            for &ino in d.durable.values() {
                let f = &mut self.inodes[ino];
                f.cur = f.durable.clone();
            }
        }
    }

    fn sync(&mut self, ino: usize) {
        let f = &mut self.inodes[ino];
        f.durable = f.cur.clone();
    }

    fn write(&mut self, ino: usize, pos: usize, data: &[u8]) {
        let f = &mut self.inodes[ino].cur;
        if f.len() < pos + data.len() {
            f.resize(pos + data.len(), 0);
        }
        f[pos..pos + data.len()].copy_from_slice(data);
    }

    /// `create`: truncate the existing inode or make a new one.
    fn create(&mut self, dir: usize, name: &str) -> usize {
        match self.dirs[dir].cur.get(name) {
            Some(&ino) => {
                self.inodes[ino].cur.clear();
                ino
            }
            None => {
                self.inodes.push(Inode::default());
                let ino = self.inodes.len() - 1;
                self.dirs[dir].cur.insert(name.to_string(), ino);
                ino
            }
        }
    }

    fn rename(&mut self, from: (usize, &str), to: (usize, &str)) -> bool {
        let Some(ino) = self.dirs[from.0].cur.remove(from.1) else {
            return false;
        };
        self.dirs[to.0].cur.insert(to.1.to_string(), ino);
        true
    }
}

struct Handle {
    w: Box<dyn WritableFile>,
    ino: usize,
}

struct Reader {
    r: Arc<dyn ReadableFile>,
    ino: usize,
}

struct Run<'a> {
    fs: &'a dyn FileSystem,
    /// Present when the file system can crash and fail (MemFs).
    mem: Option<&'a MemFs>,
    root: PathBuf,
    model: Model,
    handles: Vec<Handle>,
    readers: Vec<Reader>,
    rng: ChaCha8Rng,
    log: Vec<String>,
    /// Files a torn crash left with some unsynced bytes (so the test shows tearing).
    torn_files: u64,
}

impl Run<'_> {
    fn dir_path(&self, dir: usize) -> PathBuf {
        self.root.join(DIRS[dir])
    }

    fn path(&self, dir: usize, name: &str) -> PathBuf {
        self.dir_path(dir).join(name)
    }

    fn pick_name(&mut self) -> (usize, &'static str) {
        (
            self.rng.gen_range(0..DIRS.len()),
            NAMES[self.rng.gen_range(0..NAMES.len())],
        )
    }

    fn data(&mut self) -> Vec<u8> {
        let n = self.rng.gen_range(0..48);
        (0..n).map(|_| self.rng.gen()).collect()
    }

    /// With some probability (MemFs only), makes the next operation of `kind` fail.
    fn maybe_fault(&mut self, kind: FaultKind) -> bool {
        match self.mem {
            Some(mem) if self.rng.gen_bool(0.08) => {
                mem.inject(kind, 1, ErrorKind::Other, false);
                self.log.push(format!("  inject {kind:?}"));
                true
            }
            _ => false,
        }
    }

    fn step(&mut self) {
        let choice = self.rng.gen_range(0..100);
        match choice {
            0..=11 => {
                let (d, n) = self.pick_name();
                let p = self.path(d, n);
                self.log.push(format!("create {}", p.display()));
                let fault = self.maybe_fault(FaultKind::Meta);
                let res = self.fs.create(&p, OPTS);
                if fault {
                    assert!(res.is_err(), "faulted create succeeded");
                    return;
                }
                // A directory name never collides with a file name here.
                let w = res.unwrap();
                let ino = self.model.create(d, n);
                self.handles.push(Handle { w, ino });
            }
            12..=16 => {
                let (d, n) = self.pick_name();
                let p = self.path(d, n);
                let Some(&ino) = self.model.dirs[d].cur.get(n) else {
                    assert!(self.fs.reopen(&p, 0, OPTS).unwrap_err().is_not_found());
                    return;
                };
                let size = self.model.inodes[ino].cur.len();
                let off = self.rng.gen_range(0..=size);
                self.log.push(format!("reopen {} at {off}", p.display()));
                let w = self.fs.reopen(&p, off as u64, OPTS).unwrap();
                self.handles.push(Handle { w, ino });
            }
            17..=44 => {
                if self.handles.is_empty() {
                    return;
                }
                let i = self.rng.gen_range(0..self.handles.len());
                let data = self.data();
                self.log
                    .push(format!("append {} bytes via handle {i}", data.len()));
                let fault = self.maybe_fault(FaultKind::Write);
                let h = &mut self.handles[i];
                let pos = h.w.position();
                let res = h.w.append(&data);
                if fault {
                    assert!(res.is_err());
                    assert_eq!(h.w.position(), pos);
                    return;
                }
                res.unwrap();
                let ino = h.ino;
                self.model.write(ino, pos as usize, &data);
            }
            45..=56 => {
                if self.handles.is_empty() {
                    return;
                }
                let i = self.rng.gen_range(0..self.handles.len());
                let all = self.rng.gen_bool(0.5);
                self.log.push(format!("sync (all={all}) handle {i}"));
                let fault = self.maybe_fault(FaultKind::Sync);
                let h = &mut self.handles[i];
                let res = if all { h.w.sync_all() } else { h.w.sync_data() };
                if fault {
                    assert!(res.is_err());
                    return;
                }
                res.unwrap();
                let ino = h.ino;
                self.model.sync(ino);
            }
            57..=60 => {
                if self.handles.is_empty() {
                    return;
                }
                let i = self.rng.gen_range(0..self.handles.len());
                let len = self.rng.gen_range(0..256usize);
                self.log.push(format!("preallocate {len} via handle {i}"));
                let fault = self.maybe_fault(FaultKind::Write);
                let h = &mut self.handles[i];
                let res = h.w.preallocate(len as u64);
                if fault {
                    assert!(res.is_err());
                    return;
                }
                res.unwrap();
                let ino = h.ino;
                let f = &mut self.model.inodes[ino];
                if f.cur.len() < len {
                    f.cur.resize(len, 0);
                }
                self.model.sync(ino);
            }
            61..=70 => {
                let d = self.rng.gen_range(0..DIRS.len());
                let p = self.dir_path(d);
                self.log.push(format!("sync_dir {}", p.display()));
                let fault = self.maybe_fault(FaultKind::Sync);
                let res = self.fs.sync_dir(&p);
                if fault {
                    assert!(res.is_err());
                    return;
                }
                res.unwrap();
                let dir = &mut self.model.dirs[d];
                dir.durable = dir.cur.clone();
            }
            71..=77 => {
                let (fd, fname) = self.pick_name();
                let (td, tname) = self.pick_name();
                let (from, to) = (self.path(fd, fname), self.path(td, tname));
                self.log
                    .push(format!("rename {} -> {}", from.display(), to.display()));
                let fault = self.maybe_fault(FaultKind::Meta);
                let res = self.fs.rename(&from, &to);
                if fault {
                    assert!(res.is_err());
                    return;
                }
                if self.model.rename((fd, fname), (td, tname)) {
                    res.unwrap();
                } else {
                    assert!(res.unwrap_err().is_not_found());
                }
            }
            78..=82 => {
                let (d, n) = self.pick_name();
                let p = self.path(d, n);
                self.log.push(format!("delete {}", p.display()));
                let fault = self.maybe_fault(FaultKind::Meta);
                let res = self.fs.delete(&p);
                if fault {
                    assert!(res.is_err());
                    return;
                }
                if self.model.dirs[d].cur.remove(n).is_some() {
                    res.unwrap();
                } else {
                    assert!(res.unwrap_err().is_not_found());
                }
            }
            83..=86 => {
                let (d, n) = self.pick_name();
                let p = self.path(d, n);
                let data = self.data();
                self.log.push(format!(
                    "write_atomic {} ({} bytes)",
                    p.display(),
                    data.len()
                ));
                self.fs.write_atomic(&p, &data).unwrap();
                let tmp = format!("{n}.tmp");
                let ino = self.model.create(d, &tmp);
                self.model.write(ino, 0, &data);
                self.model.sync(ino);
                self.model.rename((d, &tmp), (d, n));
                let dir = &mut self.model.dirs[d];
                dir.durable = dir.cur.clone();
                // The temporary's name is gone; its handle is not ours to keep.
            }
            87..=91 => {
                let (d, n) = self.pick_name();
                let p = self.path(d, n);
                self.log.push(format!("open {}", p.display()));
                match self.model.dirs[d].cur.get(n) {
                    Some(&ino) => {
                        let r = self.fs.open(&p).unwrap();
                        self.readers.push(Reader { r, ino });
                    }
                    None => assert!(self.fs.open(&p).unwrap_err().is_not_found()),
                }
            }
            92..=94 => {
                // Forget some handles, as code under test closes files.
                if !self.handles.is_empty() {
                    let i = self.rng.gen_range(0..self.handles.len());
                    self.handles.swap_remove(i);
                }
                if !self.readers.is_empty() {
                    let i = self.rng.gen_range(0..self.readers.len());
                    self.readers.swap_remove(i);
                }
            }
            _ => {
                let Some(mem) = self.mem else {
                    return;
                };
                let torn = self.rng.gen_bool(0.5).then(|| self.rng.gen::<u64>());
                self.log.push(format!("crash (torn seed {torn:?})"));
                // What each surviving inode held before, for judging torn content.
                let mut before = BTreeMap::new();
                for d in &self.model.dirs {
                    for &ino in d.durable.values() {
                        let f = &self.model.inodes[ino];
                        before.insert(ino, (f.durable.clone(), f.cur.clone()));
                    }
                }
                match torn {
                    Some(seed) => mem.crash_torn(seed),
                    None => mem.crash(),
                }
                self.model.crash();
                if torn.is_some() {
                    self.adopt_torn(&before);
                }
                for h in &mut self.handles {
                    let err = h.w.append(b"x").unwrap_err();
                    assert!(err.to_string().contains("stale"), "{err}");
                }
                for r in &self.readers {
                    assert!(r.r.read_at(0, &mut [0u8; 1]).is_err());
                }
                self.handles.clear();
                self.readers.clear();
            }
        }
    }

    /// After a torn crash every surviving file holds its durable bytes with some of its
    /// unsynced bytes on top: never shorter than durable, never longer than it was, and
    /// every byte is either the durable or the current one. The model then adopts it.
    fn adopt_torn(&mut self, before: &BTreeMap<usize, (Vec<u8>, Vec<u8>)>) {
        for d in 0..DIRS.len() {
            let entries: Vec<(String, usize)> = self.model.dirs[d]
                .cur
                .iter()
                .map(|(n, &i)| (n.clone(), i))
                .collect();
            for (name, ino) in entries {
                let got = self.fs.read_all(&self.path(d, &name)).unwrap();
                let (dur, cur) = &before[&ino];
                assert!(
                    got.len() >= dur.len() && got.len() <= dur.len().max(cur.len()),
                    "torn {name}: {} bytes, durable {}, current {}",
                    got.len(),
                    dur.len(),
                    cur.len()
                );
                for (i, b) in got.iter().enumerate() {
                    assert!(
                        dur.get(i) == Some(b) || cur.get(i) == Some(b),
                        "torn {name}: byte {i} is neither durable nor current"
                    );
                }
                if got != *dur {
                    self.torn_files += 1;
                }
                let f = &mut self.model.inodes[ino];
                f.cur = got.clone();
                f.durable = got;
            }
        }
    }

    /// Compares every visible name, every file's bytes, every open reader and (MemFs)
    /// every durable size with the model.
    fn check(&self) {
        for d in 0..DIRS.len() {
            let dir = &self.model.dirs[d];
            let mut want: Vec<String> = dir.cur.keys().cloned().collect();
            if d == 0 {
                want.push("sub".to_string());
                want.sort();
            }
            assert_eq!(
                self.fs.list(&self.dir_path(d)).unwrap(),
                want,
                "listing {d}"
            );
            for (name, &ino) in &dir.cur {
                let p = self.path(d, name);
                assert_eq!(
                    self.fs.read_all(&p).unwrap(),
                    self.model.inodes[ino].cur,
                    "content of {}",
                    p.display()
                );
            }
            if let Some(mem) = self.mem {
                for name in NAMES {
                    let p = self.path(d, name);
                    let want = dir
                        .durable
                        .get(name)
                        .map(|&ino| self.model.inodes[ino].durable.len() as u64);
                    assert_eq!(
                        mem.durable_size(&p),
                        want,
                        "durable size of {}",
                        p.display()
                    );
                    let want = dir
                        .durable
                        .get(name)
                        .map(|&ino| &self.model.inodes[ino].durable);
                    assert_eq!(
                        mem.durable_contents(&p).as_ref(),
                        want,
                        "durable bytes of {}",
                        p.display()
                    );
                }
            }
        }
        for (i, r) in self.readers.iter().enumerate() {
            let want = &self.model.inodes[r.ino].cur;
            assert_eq!(r.r.size(), want.len() as u64, "reader {i} size");
            let mut buf = vec![0u8; want.len()];
            r.r.read_exact_at(0, &mut buf).unwrap();
            assert_eq!(&buf, want, "reader {i} content");
        }
    }
}

/// Runs one case; returns how many files torn crashes left partly written.
fn run_case(fs: &dyn FileSystem, mem: Option<&MemFs>, root: &Path, seed: u64, ops: usize) -> u64 {
    fs.create_dir_all(&root.join("sub")).unwrap();
    let mut run = Run {
        fs,
        mem,
        root: root.to_path_buf(),
        model: Model::default(),
        handles: Vec::new(),
        readers: Vec::new(),
        rng: ChaCha8Rng::seed_from_u64(seed),
        log: Vec::new(),
        torn_files: 0,
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..ops {
            run.step();
            run.check();
        }
    }));
    if let Err(panic) = result {
        let tail: Vec<&String> = run.log.iter().rev().take(40).rev().collect();
        eprintln!(
            "model test failed: replay with PHOENIX_SEED={seed} ({}); last ops:\n{}",
            if mem.is_some() { "MemFs" } else { "LocalFs" },
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::panic::resume_unwind(panic);
    }
    run.torn_files
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

/// The seeds to run: `PHOENIX_SEED` alone, or `PHOENIX_STORAGE_CASES` seeds from a base.
fn seeds(default_cases: u64, base: u64) -> Vec<u64> {
    match std::env::var("PHOENIX_SEED") {
        Ok(v) => vec![v.parse().expect("PHOENIX_SEED is a u64")],
        Err(_) => {
            let cases = env_u64("PHOENIX_STORAGE_CASES", default_cases);
            (0..cases).map(|i| base + i).collect()
        }
    }
}

#[test]
fn memfs_matches_model_with_crashes_and_faults() {
    let ops = env_u64("PHOENIX_STORAGE_OPS", 300) as usize;
    let seeds = seeds(400, 0);
    let mut torn_files = 0;
    for &seed in &seeds {
        let fs = MemFs::new();
        torn_files += run_case(&fs, Some(&fs), Path::new("/db"), seed, ops);
    }
    if seeds.len() >= 20 && ops >= 100 {
        assert!(torn_files > 0, "no torn crash ever kept unsynced bytes");
    }
}

#[test]
fn localfs_matches_model() {
    let ops = env_u64("PHOENIX_STORAGE_OPS", 300) as usize;
    for seed in seeds(8, 1_000_000) {
        let dir = tempfile::tempdir().unwrap();
        let torn = run_case(&LocalFs::new(), None, dir.path(), seed, ops);
        assert_eq!(torn, 0);
    }
}
