//! Behaviour every `FileSystem` shares, run against both `MemFs` and `LocalFs` (on a
//! temporary directory). Crash behaviour, which only `MemFs` can show, is in `mem_crash.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use phoenix_storage::{Error, FileSystem, IoOp, LocalFs, MemFs, WriteOptions, DIRECT_IO_ALIGN};

const OPTS: WriteOptions = WriteOptions { direct_io: false };

/// Runs each listed behaviour once on a fresh `MemFs` and once on a fresh temp dir.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(
                #[test]
                fn $name() {
                    let fs = phoenix_storage::MemFs::new();
                    let root = std::path::PathBuf::from("/data");
                    phoenix_storage::FileSystem::create_dir_all(&fs, &root).unwrap();
                    super::$name(&fs, &root);
                }
            )*
        }
        mod local {
            $(
                #[test]
                fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    super::$name(&phoenix_storage::LocalFs::new(), dir.path());
                }
            )*
        }
    };
}

on_both!(
    create_append_read,
    read_past_end_is_unexpected_eof,
    reopen_overwrites_from_offset,
    reopen_past_end_is_invalid,
    create_truncates_existing,
    list_exists_delete,
    errors_name_op_and_path,
    rename_replaces_target,
    rename_missing_is_not_found,
    create_dir_all_nested_and_idempotent,
    create_in_missing_dir_fails,
    write_atomic_replaces_and_cleans_up,
    lock_is_exclusive_until_dropped,
    preallocate_extends_with_zeros,
    open_handle_survives_delete_and_rename,
    reader_sees_later_appends,
    direct_io_checks_alignment,
    direct_io_aligned_roundtrip,
    zero_length_operations,
    sync_dir_of_a_file_fails,
    rename_directories,
);

fn write_file(fs: &dyn FileSystem, path: &Path, data: &[u8]) {
    let mut f = fs.create(path, OPTS).unwrap();
    f.append(data).unwrap();
    f.sync_data().unwrap();
}

fn create_append_read(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("a.log");
    let mut f = fs.create(&p, OPTS).unwrap();
    assert_eq!(f.position(), 0);
    assert_eq!(f.path(), p.as_path());
    f.append(b"hello ").unwrap();
    f.append(b"world").unwrap();
    assert_eq!(f.position(), 11);
    f.sync_data().unwrap();
    f.sync_all().unwrap();
    drop(f);

    assert_eq!(fs.file_size(&p).unwrap(), 11);
    let r = fs.open(&p).unwrap();
    assert_eq!(r.size(), 11);
    assert_eq!(r.path(), p.as_path());
    let mut buf = [0u8; 5];
    r.read_exact_at(6, &mut buf).unwrap();
    assert_eq!(&buf, b"world");
    let mut big = [0u8; 32];
    assert_eq!(r.read_at(3, &mut big).unwrap(), 8);
    assert_eq!(&big[..8], b"lo world");
    assert_eq!(r.read_at(11, &mut big).unwrap(), 0);
    assert_eq!(r.read_at(100, &mut big).unwrap(), 0);
    assert_eq!(fs.read_all(&p).unwrap(), b"hello world");
}

fn read_past_end_is_unexpected_eof(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("short");
    write_file(fs, &p, b"abc");
    let r = fs.open(&p).unwrap();
    let mut buf = [0u8; 4];
    let err = r.read_exact_at(0, &mut buf).unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::UnexpectedEof), "{err}");
    let err = r.read_exact_at(u64::MAX - 1, &mut buf).unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::UnexpectedEof), "{err}");
    match err {
        Error::Io { op, path, .. } => {
            assert_eq!(op, IoOp::Read);
            assert_eq!(path, p);
        }
        other => panic!("unexpected {other:?}"),
    }
}

fn reopen_overwrites_from_offset(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("seg");
    write_file(fs, &p, b"0123456789");
    let mut f = fs.reopen(&p, 4, OPTS).unwrap();
    assert_eq!(f.position(), 4);
    f.append(b"ab").unwrap();
    assert_eq!(f.position(), 6);
    f.sync_data().unwrap();
    drop(f);
    // Bytes past the write position stay.
    assert_eq!(fs.read_all(&p).unwrap(), b"0123ab6789");

    // Writing past the old end grows the file.
    let mut f = fs.reopen(&p, 8, OPTS).unwrap();
    f.append(b"XYZ").unwrap();
    drop(f);
    assert_eq!(fs.read_all(&p).unwrap(), b"0123ab67XYZ");

    // Reopen exactly at the end appends.
    let mut f = fs.reopen(&p, 11, OPTS).unwrap();
    f.append(b"!").unwrap();
    drop(f);
    assert_eq!(fs.read_all(&p).unwrap(), b"0123ab67XYZ!");
}

fn reopen_past_end_is_invalid(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("seg");
    write_file(fs, &p, b"0123");
    let err = fs.reopen(&p, 5, OPTS).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let err = fs.reopen(&root.join("missing"), 0, OPTS).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

fn create_truncates_existing(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("f");
    write_file(fs, &p, b"long old content");
    let mut f = fs.create(&p, OPTS).unwrap();
    assert_eq!(fs.file_size(&p).unwrap(), 0);
    f.append(b"new").unwrap();
    drop(f);
    assert_eq!(fs.read_all(&p).unwrap(), b"new");
}

fn list_exists_delete(fs: &dyn FileSystem, root: &Path) {
    assert!(fs.list(root).unwrap().is_empty());
    for name in ["b", "a", "c10", "c2"] {
        write_file(fs, &root.join(name), name.as_bytes());
    }
    fs.create_dir_all(&root.join("sub")).unwrap();
    assert_eq!(fs.list(root).unwrap(), ["a", "b", "c10", "c2", "sub"]);
    assert!(fs.exists(&root.join("a")).unwrap());
    assert!(fs.exists(&root.join("sub")).unwrap());
    assert!(!fs.exists(&root.join("zz")).unwrap());
    assert!(!fs.exists(&root.join("zz/yy")).unwrap());
    assert!(!fs.exists(&root.join("a/yy")).unwrap());

    fs.delete(&root.join("b")).unwrap();
    assert!(!fs.exists(&root.join("b")).unwrap());
    assert_eq!(fs.list(root).unwrap(), ["a", "c10", "c2", "sub"]);
    assert!(fs.delete(&root.join("b")).unwrap_err().is_not_found());
    assert!(
        fs.delete(&root.join("sub")).is_err(),
        "delete removes files only"
    );
    assert!(fs.list(&root.join("nope")).unwrap_err().is_not_found());
    assert!(
        fs.list(&root.join("a")).is_err(),
        "a file is not a directory"
    );
    assert!(fs.file_size(&root.join("nope")).unwrap_err().is_not_found());
    assert!(fs.open(&root.join("nope")).unwrap_err().is_not_found());
}

fn errors_name_op_and_path(fs: &dyn FileSystem, root: &Path) {
    let missing = root.join("missing");
    let cases: Vec<(IoOp, Error)> = vec![
        (IoOp::Open, fs.open(&missing).unwrap_err()),
        (IoOp::Delete, fs.delete(&missing).unwrap_err()),
        (
            IoOp::Rename,
            fs.rename(&missing, &root.join("x")).unwrap_err(),
        ),
        (IoOp::List, fs.list(&missing).unwrap_err()),
        (IoOp::Stat, fs.file_size(&missing).unwrap_err()),
        (IoOp::Sync, fs.sync_dir(&missing).unwrap_err()),
        (IoOp::Open, fs.create(&missing.join("f"), OPTS).unwrap_err()),
    ];
    for (want_op, err) in cases {
        assert!(err.is_not_found(), "{err}");
        match &err {
            Error::Io { op, path, .. } => {
                assert_eq!(*op, want_op, "{err}");
                assert!(path.starts_with(&missing), "{err}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains("missing"), "message names the path: {text}");
    }
}

fn rename_replaces_target(fs: &dyn FileSystem, root: &Path) {
    let (a, b) = (root.join("a"), root.join("b"));
    write_file(fs, &a, b"new");
    write_file(fs, &b, b"old");
    fs.rename(&a, &b).unwrap();
    fs.sync_dir(root).unwrap();
    assert!(!fs.exists(&a).unwrap());
    assert_eq!(fs.read_all(&b).unwrap(), b"new");
    // Into a subdirectory.
    fs.create_dir_all(&root.join("d")).unwrap();
    fs.rename(&b, &root.join("d/c")).unwrap();
    assert_eq!(fs.read_all(&root.join("d/c")).unwrap(), b"new");
    assert_eq!(fs.list(root).unwrap(), ["d"]);
    // Renaming onto itself changes nothing.
    fs.rename(&root.join("d/c"), &root.join("d/c")).unwrap();
    assert_eq!(fs.read_all(&root.join("d/c")).unwrap(), b"new");
}

fn rename_missing_is_not_found(fs: &dyn FileSystem, root: &Path) {
    write_file(fs, &root.join("a"), b"x");
    let err = fs.rename(&root.join("nope"), &root.join("a")).unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = fs
        .rename(&root.join("a"), &root.join("nodir/a"))
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(fs.read_all(&root.join("a")).unwrap(), b"x");
}

fn create_dir_all_nested_and_idempotent(fs: &dyn FileSystem, root: &Path) {
    let d = root.join("x/y/z");
    fs.create_dir_all(&d).unwrap();
    fs.create_dir_all(&d).unwrap();
    fs.create_dir_all(&root.join("x")).unwrap();
    assert!(fs.exists(&d).unwrap());
    assert_eq!(fs.list(&root.join("x")).unwrap(), ["y"]);
    write_file(fs, &d.join("f"), b"1");
    assert_eq!(fs.list(&d).unwrap(), ["f"]);
    // A file in the way.
    let err = fs.create_dir_all(&d.join("f/g")).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
}

fn create_in_missing_dir_fails(fs: &dyn FileSystem, root: &Path) {
    let err = fs.create(&root.join("no/such/f"), OPTS).unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(fs.list(root).unwrap().is_empty());
}

fn write_atomic_replaces_and_cleans_up(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("CURRENT");
    fs.write_atomic(&p, b"one").unwrap();
    assert_eq!(fs.read_all(&p).unwrap(), b"one");
    fs.write_atomic(&p, b"second value").unwrap();
    assert_eq!(fs.read_all(&p).unwrap(), b"second value");
    fs.write_atomic(&p, b"").unwrap();
    assert_eq!(fs.read_all(&p).unwrap(), b"");
    assert_eq!(
        fs.list(root).unwrap(),
        ["CURRENT"],
        "no temporary left behind"
    );
    assert!(fs.write_atomic(&root.join("no/CURRENT"), b"x").is_err());
}

fn lock_is_exclusive_until_dropped(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("LOCK");
    let guard = fs.lock(&p).unwrap();
    assert!(fs.exists(&p).unwrap(), "lock creates the file");
    let err = fs.lock(&p).unwrap_err();
    assert!(
        matches!(err, Error::Locked { ref path } if path == &p),
        "{err}"
    );
    // Another lock file is independent.
    let other = fs.lock(&root.join("LOCK2")).unwrap();
    drop(guard);
    let again = fs.lock(&p).unwrap();
    drop(again);
    drop(other);
    assert!(fs.lock(&root.join("no/LOCK")).is_err());
}

fn preallocate_extends_with_zeros(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("seg");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.append(b"head").unwrap();
    f.preallocate(64 * 1024).unwrap();
    assert_eq!(f.position(), 4, "preallocate does not move the position");
    assert_eq!(fs.file_size(&p).unwrap(), 64 * 1024);
    f.append(b"more").unwrap();
    f.sync_data().unwrap();
    // Preallocating less than the size does not shrink.
    f.preallocate(10).unwrap();
    assert_eq!(fs.file_size(&p).unwrap(), 64 * 1024);
    drop(f);
    let data = fs.read_all(&p).unwrap();
    assert_eq!(&data[..8], b"headmore");
    assert!(data[8..].iter().all(|&b| b == 0));
}

fn open_handle_survives_delete_and_rename(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("f");
    write_file(fs, &p, b"content");
    let r = fs.open(&p).unwrap();
    let mut w = fs.reopen(&p, 7, OPTS).unwrap();
    fs.rename(&p, &root.join("g")).unwrap();
    w.append(b"+").unwrap();
    assert_eq!(fs.read_all(&root.join("g")).unwrap(), b"content+");
    fs.delete(&root.join("g")).unwrap();
    let mut buf = [0u8; 8];
    r.read_exact_at(0, &mut buf).unwrap();
    assert_eq!(&buf, b"content+");
    w.append(b"!").unwrap();
    assert_eq!(r.size(), 9);
    assert!(fs.list(root).unwrap().is_empty());
}

fn reader_sees_later_appends(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("log");
    let mut w = fs.create(&p, OPTS).unwrap();
    let r = fs.open(&p).unwrap();
    assert_eq!(r.size(), 0);
    w.append(b"abc").unwrap();
    assert_eq!(r.size(), 3);
    let mut buf = [0u8; 3];
    r.read_exact_at(0, &mut buf).unwrap();
    assert_eq!(&buf, b"abc");
}

/// A buffer of `len` bytes whose start is aligned for direct I/O.
fn aligned_buf(len: usize, fill: u8) -> (Vec<u8>, usize) {
    let mut v = vec![fill; len + DIRECT_IO_ALIGN];
    let start = v.as_ptr().align_offset(DIRECT_IO_ALIGN);
    v.truncate(start + len);
    (v, start)
}

fn direct_io_checks_alignment(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("direct");
    let opts = WriteOptions { direct_io: true };
    let mut f = fs.create(&p, opts).unwrap();
    let (buf, start) = aligned_buf(2 * DIRECT_IO_ALIGN, 7);
    let aligned = &buf[start..];
    // Unaligned length.
    let err = f.append(&aligned[..100]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Unaligned address.
    let err = f.append(&aligned[1..=DIRECT_IO_ALIGN]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert_eq!(f.position(), 0, "a refused append does not move");
    assert_eq!(
        fs.file_size(&p).unwrap(),
        0,
        "a refused append writes nothing"
    );
    // Unaligned offset.
    drop(f);
    let plain = root.join("plain");
    write_file(fs, &plain, &[1u8; 100]);
    let mut f = fs.reopen(&plain, 100, opts).unwrap();
    let err = f.append(&aligned[..DIRECT_IO_ALIGN]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}

fn direct_io_aligned_roundtrip(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("direct");
    let opts = WriteOptions { direct_io: true };
    let mut f = fs.create(&p, opts).unwrap();
    f.preallocate(4 * DIRECT_IO_ALIGN as u64).unwrap();
    let (buf, start) = aligned_buf(2 * DIRECT_IO_ALIGN, 0xAB);
    f.append(&buf[start..]).unwrap();
    f.sync_data().unwrap();
    assert_eq!(f.position(), 2 * DIRECT_IO_ALIGN as u64);
    drop(f);
    let data = fs.read_all(&p).unwrap();
    assert_eq!(data.len(), 4 * DIRECT_IO_ALIGN);
    assert!(data[..2 * DIRECT_IO_ALIGN].iter().all(|&b| b == 0xAB));
    assert!(data[2 * DIRECT_IO_ALIGN..].iter().all(|&b| b == 0));
}

fn zero_length_operations(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("empty");
    let mut f = fs.create(&p, OPTS).unwrap();
    f.append(b"").unwrap();
    f.sync_data().unwrap();
    f.preallocate(0).unwrap();
    drop(f);
    assert_eq!(fs.file_size(&p).unwrap(), 0);
    assert_eq!(fs.read_all(&p).unwrap(), b"");
    let r = fs.open(&p).unwrap();
    r.read_exact_at(0, &mut []).unwrap();
    assert_eq!(r.read_at(0, &mut [0u8; 4]).unwrap(), 0);
}

#[test]
fn local_lock_is_exclusive_across_handles() {
    // Two `LocalFs` values share the process-wide lock table.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("LOCK");
    let g = LocalFs::new().lock(&p).unwrap();
    assert!(matches!(
        LocalFs::new().lock(&p).unwrap_err(),
        Error::Locked { .. }
    ));
    // The same file through another spelling of its path.
    let alias: PathBuf = dir.path().join(".").join("LOCK");
    assert!(matches!(
        LocalFs::new().lock(&alias).unwrap_err(),
        Error::Locked { .. }
    ));
    drop(g);
    LocalFs::new().lock(&alias).unwrap();
}

#[test]
fn mem_handles_share_one_file_system() {
    let fs = MemFs::new();
    let clone = fs.clone();
    let shared: phoenix_storage::SharedFs = std::sync::Arc::new(fs.clone());
    shared.create_dir_all(Path::new("/d")).unwrap();
    shared.write_atomic(Path::new("/d/f"), b"x").unwrap();
    assert_eq!(clone.read_all(Path::new("/d/f")).unwrap(), b"x");
    assert_eq!(clone.total_file_bytes(Path::new("/")), 1);
}

fn sync_dir_of_a_file_fails(fs: &dyn FileSystem, root: &Path) {
    let p = root.join("f");
    write_file(fs, &p, b"x");
    let err = fs.sync_dir(&p).unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::NotADirectory), "{err}");
    fs.sync_dir(root).unwrap();
}

fn rename_directories(fs: &dyn FileSystem, root: &Path) {
    fs.create_dir_all(&root.join("a/inner")).unwrap();
    write_file(fs, &root.join("a/inner/f"), b"1");
    fs.rename(&root.join("a"), &root.join("b")).unwrap();
    assert_eq!(fs.read_all(&root.join("b/inner/f")).unwrap(), b"1");
    assert!(!fs.exists(&root.join("a")).unwrap());
    // Not into itself, not over a non-empty directory, not over a file.
    assert!(fs.rename(&root.join("b"), &root.join("b/inner/x")).is_err());
    fs.create_dir_all(&root.join("c/d")).unwrap();
    let err = fs.rename(&root.join("b"), &root.join("c")).unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::DirectoryNotEmpty), "{err}");
    write_file(fs, &root.join("file"), b"2");
    let err = fs.rename(&root.join("b"), &root.join("file")).unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::NotADirectory), "{err}");
    let err = fs.rename(&root.join("file"), &root.join("c")).unwrap_err();
    assert_eq!(err.io_kind(), Some(ErrorKind::IsADirectory), "{err}");
    // Over an empty directory is fine.
    fs.rename(&root.join("b"), &root.join("c/d")).unwrap();
    assert_eq!(fs.read_all(&root.join("c/d/inner/f")).unwrap(), b"1");
    assert_eq!(fs.list(root).unwrap(), ["c", "file"]);
}

#[test]
fn local_lock_takes_a_real_flock() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("LOCK");
    let g = LocalFs::new().lock(&p).unwrap();
    // Another open file description on the same file (as another process would have).
    let other = std::fs::File::open(&p).unwrap();
    assert!(matches!(
        other.try_lock(),
        Err(std::fs::TryLockError::WouldBlock)
    ));
    drop(g);
    other.try_lock().unwrap();
    // Held elsewhere: LocalFs reports Locked.
    assert!(matches!(
        LocalFs::new().lock(&p).unwrap_err(),
        Error::Locked { .. }
    ));
}

#[test]
fn local_direct_io_refusal_is_explained() {
    // tmpfs refused O_DIRECT before Linux 6.6; where it still does, the error must say so.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let p = dir.path().join("direct");
    match LocalFs::new().create(&p, WriteOptions { direct_io: true }) {
        Ok(_) => {} // This kernel's tmpfs supports O_DIRECT.
        Err(err) => {
            assert!(err.to_string().contains("O_DIRECT"), "{err}");
            assert!(matches!(err, Error::Io { op: IoOp::Open, .. }), "{err}");
        }
    }
}
