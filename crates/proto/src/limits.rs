//! Size limits of the protocol. Servers enforce them (configurable upward or downward
//! per node); clients may check them early to fail fast with the same error.

/// Largest user key, in bytes.
pub const KEY_BYTES_MAX: usize = 4 * 1024;
/// Largest value, in bytes (default; a server may be configured otherwise).
pub const VALUE_BYTES_MAX: usize = 1024 * 1024;
/// Largest encoded gRPC message either side accepts.
pub const MESSAGE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Most mutations in one BatchWrite, or keys in one BatchGet.
pub const BATCH_KEYS_MAX: usize = 10_000;
/// Most pairs one Scan response returns.
pub const SCAN_LIMIT_MAX: u32 = 10_000;
/// Scan limit when the request says 0.
pub const SCAN_LIMIT_DEFAULT: u32 = 1_000;
/// Longest deadline a request may ask for, in milliseconds.
pub const TIMEOUT_MS_MAX: u64 = 10 * 60 * 1000;

const _: () = assert!(KEY_BYTES_MAX + VALUE_BYTES_MAX < MESSAGE_BYTES_MAX);
const _: () = assert!(SCAN_LIMIT_DEFAULT <= SCAN_LIMIT_MAX);
