//! A queue of encoded frames bounded by the bytes it holds, not by how many frames.
//!
//! Frames range from a 24-byte header to [`FRAME_BYTES_MAX`](crate::FRAME_BYTES_MAX); a bound on
//! the count would either admit gigabytes of fragments or refuse a burst of small acks, so each
//! frame holds permits for its length (plus a fixed charge, so a flood of empty frames is bounded
//! too) until it has been written out.

use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// Charged per frame on top of its bytes: roughly what the queue itself spends on one.
const FRAME_CHARGE_BYTES: usize = 64;

/// Why a frame was not queued. Nothing is queued when `send` fails: the caller still owns the
/// decision to retry, report or give up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The frame is longer than the connection's frame limit; the peer would refuse it (and our
    /// own encoder would fail the connection), so it is never queued.
    #[error("frame of {len} bytes exceeds the frame limit of {max} bytes")]
    TooLarge {
        /// The frame's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The queue holds its bound in bytes already: the peer is slow or unreachable.
    #[error("send queue full")]
    Full,
    /// The connection (or the link's task) is gone for good.
    #[error("connection closed")]
    Closed,
}

/// A frame waiting to be written; its bytes count against the queue until it is dropped.
pub(crate) struct Queued {
    pub(crate) frame: Bytes,
    _permit: OwnedSemaphorePermit,
}

/// The sending half; cheap to clone.
#[derive(Clone)]
pub(crate) struct QueueSender {
    frames: mpsc::UnboundedSender<Queued>,
    budget: Arc<Semaphore>,
    capacity: usize,
    max_frame_bytes: usize,
}

/// A queue holding at most `capacity_bytes` of frames, each at most `max_frame_bytes` long.
pub(crate) fn queue(
    capacity_bytes: usize,
    max_frame_bytes: usize,
) -> (QueueSender, mpsc::UnboundedReceiver<Queued>) {
    // Permits are taken in u32 amounts; larger capacities would never be usable anyway.
    let capacity = capacity_bytes.min(u32::MAX as usize);
    let (frames, receiver) = mpsc::unbounded_channel();
    let sender = QueueSender {
        frames,
        budget: Arc::new(Semaphore::new(capacity)),
        capacity,
        max_frame_bytes,
    };
    (sender, receiver)
}

impl QueueSender {
    /// Queues `frame` without waiting.
    pub(crate) fn push(&self, frame: Bytes) -> Result<(), SendError> {
        if frame.len() > self.max_frame_bytes {
            return Err(SendError::TooLarge {
                len: frame.len(),
                max: self.max_frame_bytes,
            });
        }
        let charge = frame.len().saturating_add(FRAME_CHARGE_BYTES);
        let charge = u32::try_from(charge).map_err(|_| SendError::Full)?;
        let permit = self
            .budget
            .clone()
            .try_acquire_many_owned(charge)
            .map_err(|_| SendError::Full)?;
        self.frames
            .send(Queued {
                frame,
                _permit: permit,
            })
            .map_err(|_| SendError::Closed)
    }

    /// Bytes (with the per-frame charge) queued and not yet written.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.capacity
            .saturating_sub(self.budget.available_permits())
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.frames.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_in_bytes_and_written_frames_free_it() {
        let (sender, mut receiver) = queue(1000, 600);
        assert_eq!(
            sender.push(Bytes::from(vec![0; 601])),
            Err(SendError::TooLarge { len: 601, max: 600 })
        );
        sender.push(Bytes::from(vec![1; 500])).unwrap();
        assert_eq!(sender.queued_bytes(), 500 + FRAME_CHARGE_BYTES);
        assert_eq!(
            sender.push(Bytes::from(vec![2; 500])),
            Err(SendError::Full),
            "a refused frame takes nothing"
        );
        assert_eq!(sender.queued_bytes(), 500 + FRAME_CHARGE_BYTES);
        let first = receiver.try_recv().unwrap();
        assert_eq!(first.frame[0], 1);
        drop(first);
        assert_eq!(sender.queued_bytes(), 0);
        sender.push(Bytes::from(vec![3; 500])).unwrap();
        drop(receiver);
        assert_eq!(sender.push(Bytes::new()), Err(SendError::Closed));
        assert!(sender.is_closed());
    }

    #[test]
    fn empty_frames_are_bounded_too() {
        let (sender, _receiver) = queue(10 * FRAME_CHARGE_BYTES, 100);
        for _ in 0..10 {
            sender.push(Bytes::new()).unwrap();
        }
        assert_eq!(sender.push(Bytes::new()), Err(SendError::Full));
    }
}
