//! The software backend as a process of its own: [`serve`] answers a component's calls on a
//! local (Unix) socket, and [`Remote`] is the [`A2m`] a node uses to reach it. The component's
//! key and store stay in the serving process; the host only ever sees attestations (spec §2.4,
//! option (b) with process isolation: run the process as its own user, and the host cannot read
//! the key).
//!
//! The host is the party A2M guards against, so every byte it sends is hostile: frames are
//! bounded, anything undecodable ends the connection, and each refusal is counted and logged.
//!
//! A frame is a 4-byte big-endian length and that many bytes of one postcard-encoded
//! [`Request`] or [`Response`].

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bulwark_core::a2m::{
    Attestation, Call, ChainDigest, Kind, LogId, Nonce, Outcome, Refusal, Seq, Value,
};
use bulwark_core::sign::{PublicKey, Signed, Unverified};
use bulwark_core::wire;
use serde::{Deserialize, Serialize};

use crate::{A2m, A2mError, Component, Head};

/// The largest frame either side accepts: a status answer with every log's head is the largest.
pub const FRAME_BYTES_MAX: usize = 64 * 1024;

/// What the host sends.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// The component's public key.
    Identity,
    /// One of the log's operations.
    Call(Call),
    /// Every log's bounds, the generation and the attestations made, for `bulwark status`.
    Status,
}

/// The component's answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    /// The component's key.
    Identity(PublicKey),
    /// The slot an append filled.
    Appended(Seq),
    /// A change made durable.
    Done,
    /// An attestation.
    Attested(Unverified<Attestation>),
    /// What [`Request::Status`] asks.
    Status(Status),
    /// The call was refused.
    Refused(Refusal),
}

/// What a component reports of itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The component's key.
    pub key: PublicKey,
    /// Each log's bounds.
    pub heads: Vec<(LogId, Head)>,
    /// Changes made durable since the identity was made.
    pub generation: Option<u64>,
    /// Attestations signed since the process started.
    pub attestations: u64,
    /// Requests refused since the process started (undecodable or invalid).
    pub refused: u64,
    /// Where its generation is anchored (a file's path, or a TPM's counter), or that it keeps
    /// nothing.
    pub anchor: String,
}

/// A delay added to every call a served component makes, for measurement only (the A2M paper's
/// Table 2, spec §7.2 T12): how a protocol's throughput follows the trusted log's latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delay {
    /// Added to each call, while the component is held (a device serves one call at a time).
    pub per_call: Duration,
    /// Charge a fused call (append or advance with its lookup) as the two calls it replaces.
    pub unfused: bool,
}

impl Delay {
    /// What `call` costs under this delay.
    pub fn of(&self, call: &Call) -> Duration {
        let fused = matches!(call, Call::AppendAttest { .. } | Call::AdvanceAttest { .. });
        if self.unfused && fused {
            self.per_call.saturating_mul(2)
        } else {
            self.per_call
        }
    }
}

/// Answers calls on `listener` until the process ends: one thread per connection, one call at
/// a time on the component.
pub fn serve(component: Component, listener: UnixListener) -> io::Result<()> {
    serve_with(component, listener, Delay::default())
}

/// [`serve`], each call delayed by `delay`.
pub fn serve_with(component: Component, listener: UnixListener, delay: Delay) -> io::Result<()> {
    let shared = Arc::new(Served {
        component: Mutex::new(component),
        refused: AtomicU64::new(0),
        connections: AtomicUsize::new(0),
        delay,
    });
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                // Out of descriptors, say: the component must outlive it.
                tracing::warn!(%error, "accepting a connection to the trusted log failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if let Err(error) = stream.set_read_timeout(Some(IDLE_TIMEOUT)) {
            tracing::warn!(%error, "a connection to the trusted log cannot be bounded; closed");
            continue;
        }
        if shared.connections.fetch_add(1, Ordering::AcqRel) >= CONNECTIONS_MAX {
            shared.connections.fetch_sub(1, Ordering::AcqRel);
            shared.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "the trusted log has {CONNECTIONS_MAX} connections open; one more refused"
            );
            continue;
        }
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            let mut stream = stream;
            // Counted before the stream closes, so the host sees the count once it sees the end.
            if let Err(error) = shared.connection(&mut stream) {
                shared.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "a connection to the trusted log sent something invalid; closed");
            }
            drop(stream);
            shared.connections.fetch_sub(1, Ordering::AcqRel);
        });
    }
    Ok(())
}

/// How long a host's connection may stay silent, mid-frame or between calls, before it is
/// closed: idle connections must not hold the connection slots.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Connections served at once at most: a host needs a few (one per agreement core or volume).
const CONNECTIONS_MAX: usize = 64;

struct Served {
    component: Mutex<Component>,
    refused: AtomicU64,
    connections: AtomicUsize,
    delay: Delay,
}

impl Served {
    /// Answers one connection's calls until it closes; an invalid frame ends it with an error.
    fn connection(&self, stream: &mut UnixStream) -> io::Result<()> {
        loop {
            let Some(frame) = read_frame(stream)? else {
                return Ok(());
            };
            let request: Request = wire::decode(&frame, FRAME_BYTES_MAX)
                .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error.to_string()))?;
            let response = self.answer(request);
            if matches!(response, Response::Refused(_)) {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
            write_frame(stream, &wire::encode(&response))?;
        }
    }

    fn answer(&self, request: Request) -> Response {
        // A thread that panicked while holding the lock left nothing half-done in the component
        // that its own checks would not refuse, and a component that stops is worse than one
        // that goes on checking: take the guard either way.
        let mut component = self
            .component
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Request::Call(call) = &request {
            let delay = self.delay.of(call);
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
        }
        answer(
            &mut component,
            request,
            self.refused.load(Ordering::Relaxed),
        )
    }
}

/// The component's answer to one request; `refused` is what a status reports as refused so far.
pub fn answer(component: &mut Component, request: Request, refused: u64) -> Response {
    match request {
        Request::Identity => Response::Identity(component.public_key()),
        Request::Call(call) => match component.call(&call) {
            Ok(Outcome::Appended(seq)) => Response::Appended(seq),
            Ok(Outcome::Done) => Response::Done,
            Ok(Outcome::Attested(signed)) => Response::Attested(signed.to_unverified()),
            Err(error) => Response::Refused(error.into()),
        },
        Request::Status => Response::Status(Status {
            key: component.public_key(),
            heads: component.heads(),
            generation: component.generation(),
            attestations: component.attestations(),
            refused,
            anchor: component.anchor(),
        }),
    }
}

/// A component in another process, reached through its socket. Every attestation it returns is
/// verified under the component's key before the caller sees it.
pub struct Remote {
    stream: UnixStream,
    key: PublicKey,
    /// Why the connection can no longer be trusted to pair answers with calls (a timeout or an
    /// I/O error mid-call): every later call fails until the host connects again.
    broken: Option<String>,
}

/// How long a call may take before the host gives up on the component.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl Remote {
    /// Connects to the component at `socket`. With `expected`, refuses a component whose key is
    /// another (the host was configured with its component's identity).
    pub fn connect(socket: &Path, expected: Option<PublicKey>) -> Result<Remote, A2mError> {
        let stream = UnixStream::connect(socket).map_err(|error| {
            A2mError::Refused(Refusal::Stopped(format!(
                "cannot reach the trusted log at {}: {error}",
                socket.display()
            )))
        })?;
        let broken = |error: io::Error| {
            A2mError::Refused(Refusal::Stopped(format!("the trusted log: {error}")))
        };
        stream
            .set_read_timeout(Some(CALL_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(CALL_TIMEOUT)))
            .map_err(broken)?;
        let mut stream = stream;
        let Response::Identity(key) = call(&mut stream, &Request::Identity)? else {
            return Err(A2mError::Refused(Refusal::Stopped(
                "the trusted log did not say who it is".to_string(),
            )));
        };
        if let Some(expected) = expected
            && expected != key
        {
            return Err(A2mError::Refused(Refusal::Stopped(format!(
                "the trusted log at {} is {key}, not the configured {expected}",
                socket.display()
            ))));
        }
        Ok(Remote {
            stream,
            key,
            broken: None,
        })
    }

    /// Whether the component is known to be gone: its end of the connection closed (its
    /// process was restarted, say) or the connection broke. A host checks before a batch and
    /// connects again, so that a call is never sent where it cannot arrive.
    pub fn is_closed(&self) -> bool {
        if self.broken.is_some() {
            return true;
        }
        let mut byte = [0u8; 1];
        if self.stream.set_nonblocking(true).is_err() {
            return true;
        }
        // Nothing is ever unasked-for on this connection: a readable byte or an end of stream
        // both mean it can no longer pair answers with calls (so reading the byte loses nothing).
        let closed = match io::Read::read(&mut &self.stream, &mut byte) {
            Err(error) => error.kind() != io::ErrorKind::WouldBlock,
            Ok(_) => true,
        };
        closed || self.stream.set_nonblocking(false).is_err()
    }

    /// The component's report of itself.
    pub fn status(&mut self) -> Result<Status, A2mError> {
        match self.call(&Request::Status)? {
            Response::Status(status) => Ok(status),
            other => Err(unexpected(&other)),
        }
    }

    fn call(&mut self, request: &Request) -> Result<Response, A2mError> {
        if let Some(why) = &self.broken {
            return Err(A2mError::Refused(Refusal::Stopped(format!(
                "the connection to the trusted log broke ({why}); connect again"
            ))));
        }
        let answer = call(&mut self.stream, request);
        if let Err(A2mError::Refused(Refusal::Stopped(why))) = &answer {
            // An answer may still be on its way: the next read could pair it with another call.
            self.broken = Some(why.clone());
        }
        answer
    }

    /// The attestation answering `call`, verified under the component's key and checked to be
    /// the one asked for: its kind, log, slot, nonce and (for an append) value.
    fn attestation(&mut self, call: Call) -> Result<Signed<Attestation>, A2mError> {
        let signed = match self.call(&Request::Call(call.clone()))? {
            Response::Attested(attestation) => attestation.verify(&self.key).map_err(|error| {
                A2mError::Refused(Refusal::Stopped(format!(
                    "the trusted log's attestation: {error}"
                )))
            })?,
            other => return Err(unexpected(&other)),
        };
        let got = signed.value();
        let asked = match call {
            Call::Lookup { log, seq, nonce } => {
                got.kind == Kind::Lookup && got.log == log && got.seq == seq && got.nonce == nonce
            }
            Call::End { log, nonce } => {
                got.kind == Kind::End && got.log == log && got.nonce == nonce
            }
            Call::AppendAttest { log, value, nonce } => {
                got.kind == Kind::Lookup
                    && got.log == log
                    && got.nonce == nonce
                    && got.status == bulwark_core::a2m::Status::Assigned
                    && got.value == value
            }
            Call::AdvanceAttest {
                log,
                seq,
                value,
                nonce,
                ..
            } => {
                got.kind == Kind::Lookup
                    && got.log == log
                    && got.seq == seq
                    && got.nonce == nonce
                    && got.status == bulwark_core::a2m::Status::Assigned
                    && got.value == value
            }
            Call::Append { .. } | Call::Advance { .. } | Call::Truncate { .. } => false,
        };
        if !asked {
            let why = format!("the trusted log answered {got:?} to {call:?}");
            self.broken = Some(why.clone());
            return Err(A2mError::Refused(Refusal::Stopped(why)));
        }
        Ok(signed)
    }

    fn done(&mut self, request: &Request) -> Result<(), A2mError> {
        match self.call(request)? {
            Response::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}

/// One call: the request out, its answer back, a refusal turned into its error.
fn call(stream: &mut UnixStream, request: &Request) -> Result<Response, A2mError> {
    let broken =
        |error: io::Error| A2mError::Refused(Refusal::Stopped(format!("the trusted log: {error}")));
    write_frame(stream, &wire::encode(request)).map_err(broken)?;
    let frame = read_frame(stream).map_err(broken)?.ok_or_else(|| {
        A2mError::Refused(Refusal::Stopped(
            "the trusted log closed the connection".into(),
        ))
    })?;
    let response: Response = wire::decode(&frame, FRAME_BYTES_MAX).map_err(|error| {
        A2mError::Refused(Refusal::Stopped(format!(
            "the trusted log's answer: {error}"
        )))
    })?;
    match response {
        Response::Refused(refusal) => Err(refusal.into()),
        response => Ok(response),
    }
}

fn unexpected(response: &Response) -> A2mError {
    A2mError::Refused(Refusal::Stopped(format!(
        "the trusted log answered out of turn: {response:?}"
    )))
}

impl A2m for Remote {
    fn public_key(&self) -> PublicKey {
        self.key
    }

    fn append(&mut self, log: LogId, value: Value) -> Result<Seq, A2mError> {
        match self.call(&Request::Call(Call::Append { log, value }))? {
            Response::Appended(seq) => Ok(seq),
            other => Err(unexpected(&other)),
        }
    }

    fn advance(
        &mut self,
        log: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
    ) -> Result<(), A2mError> {
        self.done(&Request::Call(Call::Advance {
            log,
            seq,
            digest,
            value,
        }))
    }

    fn lookup(
        &mut self,
        log: LogId,
        seq: Seq,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        self.attestation(Call::Lookup { log, seq, nonce })
    }

    fn end(&mut self, log: LogId, nonce: Nonce) -> Result<Signed<Attestation>, A2mError> {
        self.attestation(Call::End { log, nonce })
    }

    fn truncate(&mut self, log: LogId, seq: Seq) -> Result<(), A2mError> {
        self.done(&Request::Call(Call::Truncate { log, seq }))
    }

    fn append_attest(
        &mut self,
        log: LogId,
        value: Value,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        self.attestation(Call::AppendAttest { log, value, nonce })
    }

    fn advance_attest(
        &mut self,
        log: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        self.attestation(Call::AdvanceAttest {
            log,
            seq,
            digest,
            value,
            nonce,
        })
    }
}

/// Reads one frame, or `None` at a clean end of stream.
fn read_frame(stream: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut length = [0; 4];
    match stream.read_exact(&mut length) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let length = u32::from_be_bytes(length) as usize;
    if length > FRAME_BYTES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {length} bytes (at most {FRAME_BYTES_MAX})"),
        ));
    }
    let mut frame = vec![0; length];
    stream.read_exact(&mut frame)?;
    Ok(Some(frame))
}

fn write_frame(stream: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    let length = u32::try_from(frame.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    stream.write_all(&length.to_be_bytes())?;
    stream.write_all(frame)?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_charges_a_fused_call_twice_only_when_unfused() {
        let lookup = Call::Lookup {
            log: 1,
            seq: 1,
            nonce: [0; 32],
        };
        let fused = Call::AdvanceAttest {
            log: 1,
            seq: 1,
            digest: [0; 32],
            value: [0; 32],
            nonce: [0; 32],
        };
        let per_call = Duration::from_micros(50);
        let delay = Delay {
            per_call,
            unfused: false,
        };
        assert_eq!(delay.of(&lookup), per_call);
        assert_eq!(delay.of(&fused), per_call);
        let unfused = Delay {
            unfused: true,
            ..delay
        };
        assert_eq!(unfused.of(&lookup), per_call);
        assert_eq!(unfused.of(&fused), 2 * per_call);
        assert_eq!(Delay::default().of(&fused), Duration::ZERO);
    }
}
