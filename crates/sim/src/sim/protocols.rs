//! One [`super::protocol::Protocol`] implementation per protocol the simulator drives.

pub mod a2m_storage;
pub mod content;
pub mod content_epochs;
pub mod cs;
pub mod powerstore;
pub mod powerstore_epochs;
pub mod reconfig;
pub mod registers;
pub mod table;
