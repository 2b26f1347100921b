//! TLS for a local cluster (`phoenix playground --tls`): a CA, one certificate for the
//! nodes (127.0.0.1 and localhost), one for clients, the nodes' token and a client
//! token, made on the first run under `<data-dir>/tls/` and reused after. The CA's key is
//! not kept: nothing more can be signed for this cluster, and no file here lets anyone
//! mint certificates.

use std::path::{Path, PathBuf};

use phoenix_proto::dev_certs::{write_private, DevCa};
use phoenix_proto::security::Credentials;

use super::BoxError;

/// The files of a local cluster's TLS.
#[derive(Debug, Clone)]
pub struct LocalTls {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The nodes' certificate and key.
    pub node_cert: PathBuf,
    /// See `node_cert`.
    pub node_key: PathBuf,
    /// A client certificate and key (lets a client in without the token).
    pub client_cert: PathBuf,
    /// See `client_cert`.
    pub client_key: PathBuf,
    /// The nodes' token file: their own token first, then the client's.
    pub node_tokens: PathBuf,
    /// The client's token file.
    pub token_file: PathBuf,
}

impl LocalTls {
    /// The files under `<dir>/tls`, made if they are not all there.
    pub fn load_or_create(dir: &Path) -> Result<LocalTls, BoxError> {
        let d = dir.join("tls");
        let t = LocalTls::paths(&d);
        if t.files().iter().all(|f| f.exists()) {
            return Ok(t);
        }
        // The set is made whole in a scratch directory, then renamed into place: a crash
        // leaves either no set or a whole one, never files of two generations.
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |e: std::io::Error| format!("write {p}: {e}")
        };
        let scratch = dir.join("tls.tmp");
        LocalTls::write_set(&scratch)?;
        if d.exists() {
            std::fs::remove_dir_all(&d).map_err(io(&d))?;
        }
        std::fs::rename(&scratch, &d).map_err(io(&d))?;
        std::fs::File::open(dir)
            .and_then(|f| f.sync_all())
            .map_err(io(dir))?;
        Ok(t)
    }

    /// The files of a set under `d`.
    fn paths(d: &Path) -> LocalTls {
        LocalTls {
            ca: d.join("ca.pem"),
            node_cert: d.join("node.pem"),
            node_key: d.join("node-key.pem"),
            client_cert: d.join("client.pem"),
            client_key: d.join("client-key.pem"),
            node_tokens: d.join("node-tokens"),
            token_file: d.join("client-token"),
        }
    }

    fn files(&self) -> [&PathBuf; 7] {
        [
            &self.ca,
            &self.node_cert,
            &self.node_key,
            &self.client_cert,
            &self.client_key,
            &self.node_tokens,
            &self.token_file,
        ]
    }

    /// Makes a whole set under `d` (emptied first), its files and directory synced.
    fn write_set(d: &Path) -> Result<(), BoxError> {
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |e: std::io::Error| format!("write {p}: {e}")
        };
        if d.exists() {
            std::fs::remove_dir_all(d).map_err(io(d))?;
        }
        let t = LocalTls::paths(d);
        std::fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
        let ca = DevCa::new("PhoenixKV playground")?;
        let node = ca.node("node", &["127.0.0.1", "localhost"])?;
        let client = ca.client("client")?;
        let (node_token, client_token) = (token(), token());
        write_private(&t.ca, ca.cert_pem().as_bytes()).map_err(io(&t.ca))?;
        node.write(&t.node_cert, &t.node_key)
            .map_err(io(&t.node_cert))?;
        client
            .write(&t.client_cert, &t.client_key)
            .map_err(io(&t.client_cert))?;
        write_private(
            &t.node_tokens,
            format!("# The nodes' own token first, then the client's (docs/security.md).\n{node_token}\n{client_token}\n")
                .as_bytes(),
        )
        .map_err(io(&t.node_tokens))?;
        write_private(
            &t.token_file,
            format!("# The playground's client token.\n{client_token}\n").as_bytes(),
        )
        .map_err(io(&t.token_file))?;
        std::fs::File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(io(d))
            .map_err(BoxError::from)
    }

    /// The flags that make a node serve with these files.
    pub fn server_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (flag, path) in [
            ("--tls-cert", &self.node_cert),
            ("--tls-key", &self.node_key),
            ("--tls-ca", &self.ca),
            ("--token-file", &self.node_tokens),
        ] {
            v.push(flag.to_string());
            v.push(path.display().to_string());
        }
        v
    }

    /// What a client presents: the CA and the client token.
    pub fn credentials(&self) -> Result<Credentials, BoxError> {
        Ok(Credentials::from_files(
            Some(&self.ca),
            None,
            None,
            Some(&self.token_file),
        )?)
    }
}

/// 32 random hex digits.
fn token() -> String {
    use rand::Rng as _;
    let mut rng = rand::thread_rng();
    (0..32)
        .map(|_| char::from(b"0123456789abcdef"[rng.gen_range(0..16)]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a crash can leave — a set with files missing, a scratch directory half
    /// written — is replaced by one whole set made at once; a whole set is reused.
    #[test]
    fn a_partial_set_is_replaced_whole_and_a_whole_one_reused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("tls")).unwrap();
        std::fs::write(dir.path().join("tls/ca.pem"), "left from another run").unwrap();
        std::fs::create_dir_all(dir.path().join("tls.tmp")).unwrap();
        std::fs::write(dir.path().join("tls.tmp/node.pem"), "half written").unwrap();
        let t = LocalTls::load_or_create(dir.path()).unwrap();
        assert!(t.files().iter().all(|f| f.exists()));
        assert!(!dir.path().join("tls.tmp").exists());
        let ca = std::fs::read(&t.ca).unwrap();
        assert_ne!(ca, b"left from another run");
        phoenix_proto::security::TlsFiles::read(&t.ca, Some((&t.node_cert, &t.node_key))).unwrap();
        t.credentials().unwrap();
        let again = LocalTls::load_or_create(dir.path()).unwrap();
        assert_eq!(std::fs::read(&again.ca).unwrap(), ca, "reused");
    }
}
