//! One [`super::protocol::Protocol`] implementation per protocol the simulator drives.

pub(super) mod powerstore;
pub(super) mod registers;
