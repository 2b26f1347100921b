//! Names of the files in a database directory.
//!
//! ```text
//! LOCK             held while the database is open
//! CURRENT          "MANIFEST-<number:06>\n", replaced atomically
//! MANIFEST-<n:06>  version edits, see version_set.rs
//! <n:06>.sst       tables, see table/
//! wal/             the write-ahead log store (WalMode::Log)
//! *.tmp            temporaries of write_atomic (removed on open)
//! ```

use std::path::{Path, PathBuf};

/// The kind of a file found in the database directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// The lock file.
    Lock,
    /// The CURRENT pointer.
    Current,
    /// A manifest with its number.
    Manifest(u64),
    /// A table with its number.
    Table(u64),
    /// A temporary file.
    Temp,
}

/// `<dir>/LOCK`.
pub fn lock_path(dir: &Path) -> PathBuf {
    dir.join("LOCK")
}

/// `<dir>/CURRENT`.
pub fn current_path(dir: &Path) -> PathBuf {
    dir.join("CURRENT")
}

/// Name of manifest `number`.
pub fn manifest_name(number: u64) -> String {
    format!("MANIFEST-{number:06}")
}

/// `<dir>/MANIFEST-<number>`.
pub fn manifest_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(manifest_name(number))
}

/// `<dir>/<number>.sst`.
pub fn table_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(crate::table::table_file_name(number))
}

/// `<dir>/wal`.
pub fn wal_dir(dir: &Path) -> PathBuf {
    dir.join("wal")
}

/// Classifies a directory entry name; `None` for names the engine does not own.
pub fn parse(name: &str) -> Option<FileKind> {
    match name {
        "LOCK" => return Some(FileKind::Lock),
        "CURRENT" => return Some(FileKind::Current),
        _ => {}
    }
    if let Some(n) = name.strip_prefix("MANIFEST-") {
        return parse_number(n).map(FileKind::Manifest);
    }
    if let Some(n) = name.strip_suffix(".sst") {
        return parse_number(n).map(FileKind::Table);
    }
    if name.ends_with(".tmp") {
        return Some(FileKind::Temp);
    }
    None
}

fn parse_number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(parse(&manifest_name(7)), Some(FileKind::Manifest(7)));
        assert_eq!(parse("000012.sst"), Some(FileKind::Table(12)));
        assert_eq!(parse("CURRENT"), Some(FileKind::Current));
        assert_eq!(parse("x.sst"), None);
        assert_eq!(parse("MANIFEST-"), None);
        assert_eq!(parse("CURRENT.tmp"), Some(FileKind::Temp));
    }
}
