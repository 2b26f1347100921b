//! Certificates for the TLS tests, made afresh in each run
//! (`phoenix_proto::dev_certs`) and written as PEM files: a CA, nodes' and clients'
//! certificates it signs. Shared with the Redis front end's tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use phoenix_proto::dev_certs::{DevCa, PemPair};

/// A CA and the files of what it signed, in a directory.
pub struct Ca {
    ca: DevCa,
    dir: PathBuf,
    /// The CA's certificate file.
    pub cert: PathBuf,
}

/// A certificate and its key, as PEM files.
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    /// A new CA named `name`, its files in `dir`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let ca = DevCa::new(name).unwrap();
        let cert = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert, ca.cert_pem()).unwrap();
        Ca {
            ca,
            dir: dir.to_path_buf(),
            cert,
        }
    }

    /// A node's certificate for `hosts`, written as `<file>.pem` and `<file>-key.pem`.
    pub fn node(&self, file: &str, hosts: &[&str]) -> Pair {
        self.write(file, self.ca.node(file, hosts).unwrap())
    }

    /// A client's certificate, written as `<file>.pem` and `<file>-key.pem`.
    pub fn client(&self, file: &str) -> Pair {
        self.write(file, self.ca.client(file).unwrap())
    }

    fn write(&self, file: &str, pem: PemPair) -> Pair {
        let pair = Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
        };
        pem.write(&pair.cert, &pair.key).unwrap();
        pair
    }
}
