//! The systems the benchmark drives, each behind [`crate::driver::Target`].

pub mod bulwark;
pub mod etcd;
pub mod table;

use std::net::{SocketAddr, TcpListener};

/// A loopback port free right now (the OS picks it).
pub(crate) fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?
        .local_addr()?
        .port())
}
