//! Loopback ports for test servers (the engine's MinIO; the server's, the CLI's and the
//! Redis gateway's tests include this file).

/// A loopback port for a node to listen on, never given twice in this process. Taken
/// below the kernel's ephemeral range (32768 and up on Linux): a port the kernel handed
/// out and got back can be taken again by any outgoing connection of a parallel test
/// before the node binds it, and the node then fails to start.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Processes start at different places, so test binaries run side by side rarely meet.
    let start = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free loopback port below the ephemeral range");
        let port = (LOW + (start + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
