//! `phoenix compactor`: a compaction worker for nodes whose tables are on an S3 server
//! (docs/engine.md, "Compactions on a worker").

use std::path::PathBuf;

use super::BoxError;

/// Runs compactions for nodes started with `--compactor`, until Ctrl-C or SIGTERM.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on, e.g. 127.0.0.1:7100.
    #[arg(long)]
    pub listen: String,
    /// The bucket prefix whose tables it compacts: s3://bucket/prefix?endpoint=http://host:port
    /// (the nodes' --sst-store must be under it). Credentials from AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY.
    #[arg(long)]
    pub sst_store: String,
    /// Compactions run at once (each takes a core while it runs); more wait their turn.
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// PEM certificate of the worker (with --tls-key and --tls-ca): it then speaks TLS
    /// only, and nodes reach it with their own certificates.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate of the CA that signed the nodes' certificates.
    #[arg(long, requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// The nodes' token file (`phoenix server --token-file`): only callers presenting
    /// its first token (or a CA-signed certificate) are served.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

/// Runs the worker.
pub fn run(args: Args) -> Result<(), BoxError> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    if args.jobs == 0 {
        return Err("--jobs must be at least 1".into());
    }
    let cfg = phoenix_server::compactor::WorkerConfig {
        sst_store: args.sst_store,
        jobs: args.jobs,
        security: phoenix_server::Security {
            tls: phoenix_proto::security::TlsFiles::from_flags(
                args.tls_ca.as_deref(),
                args.tls_cert.as_deref(),
                args.tls_key.as_deref(),
            )?,
            tokens: match &args.token_file {
                Some(f) => phoenix_proto::security::read_tokens(f)?,
                None => Vec::new(),
            },
        },
    };
    // The store's URL is checked before anything listens.
    phoenix_server::compactor::store_location(&cfg.sst_store)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("phoenix-compactor")
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| format!("listening on {}: {e}", args.listen))?;
        tracing::info!(listen = %args.listen, store = %cfg.sst_store.split('?').next().unwrap_or_default(), "compactor serving");
        phoenix_server::compactor::serve(cfg, listener, super::server::stop_signal())
            .await
            .map_err(BoxError::from)
    })
}
