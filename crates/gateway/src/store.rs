//! The registers the gateway stores into: a Bulwark client, or a map in tests.

use bulwark_client::{Client, ClientError, OpReport};
use bytes::Bytes;
use std::future::Future;

/// Why a register operation failed, in the terms the S3 front end answers with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Not enough nodes answered in time.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// The Bulwark client this access key maps to may not write.
    #[error("not permitted: {0}")]
    Denied(String),
    /// Anything else (a refusal, a protocol failure, a bad key).
    #[error("storage error: {0}")]
    Internal(String),
}

impl From<ClientError> for StoreError {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Unavailable { .. } => StoreError::Unavailable(error.to_string()),
            ClientError::NotWriter { .. } => StoreError::Denied(error.to_string()),
            _ => StoreError::Internal(error.to_string()),
        }
    }
}

/// Linearizable registers: one value per key, replaced whole.
pub trait Registers: Send + Sync + 'static {
    /// Replaces `key`'s value.
    fn put(&self, key: &[u8], value: Bytes) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Reads `key`'s value; `None` when never written or deleted.
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send;
    /// Deletes `key`.
    fn delete(&self, key: &[u8]) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The operation succeeded; what it proved about lying nodes goes to the log, so an operator
/// sees a misbehaving node even though every S3 request was answered correctly.
fn log_evidence(key: &[u8], report: &OpReport) {
    for evidence in &report.evidence {
        tracing::warn!(
            node = evidence.node.0,
            kind = ?evidence.kind,
            key = %String::from_utf8_lossy(key),
            "node misbehaviour proven"
        );
    }
}

impl Registers for Client {
    async fn put(&self, key: &[u8], value: Bytes) -> Result<(), StoreError> {
        let report = Client::put(self, key, value).await?;
        log_evidence(key, &report);
        Ok(())
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        let (value, report) = Client::get(self, key).await?;
        log_evidence(key, &report);
        Ok(value)
    }

    async fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        let report = Client::delete(self, key).await?;
        log_evidence(key, &report);
        Ok(())
    }
}

/// An in-memory register map, for tests: can be told to lie about chunks.
#[cfg(test)]
#[derive(Default)]
pub struct MemRegisters {
    /// Every register.
    pub map: std::sync::Mutex<std::collections::BTreeMap<Vec<u8>, Bytes>>,
    /// Writes to keys starting with this fail as a cluster without quorum would.
    pub fail_puts: std::sync::Mutex<Option<Vec<u8>>>,
}

#[cfg(test)]
impl Registers for MemRegisters {
    async fn put(&self, key: &[u8], value: Bytes) -> Result<(), StoreError> {
        if let Some(prefix) = self.fail_puts.lock().unwrap().as_deref()
            && key.starts_with(prefix)
        {
            return Err(StoreError::Unavailable("no quorum (test)".into()));
        }
        self.map.lock().unwrap().insert(key.to_vec(), value);
        Ok(())
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.map.lock().unwrap().get(key).cloned())
    }

    async fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        self.map.lock().unwrap().remove(key);
        Ok(())
    }
}
