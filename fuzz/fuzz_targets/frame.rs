//! A frame as it comes off a connection: the envelope, then the body as the type its header's
//! service and kind say it is, for every service a node or client hosts.
#![no_main]

use bulwark_core::ServiceId;
use bulwark_core::envelope::{Envelope, Kind, Refusal};
use bulwark_core::wire::FRAME_BYTES_MAX;
use bulwark_fuzz::round_trip;
use bulwark_protocol::cs::ConfigService;
use bulwark_protocol::depot::{self, served};
use bulwark_protocol::pbft::{Answer, Message, Submitted};
use bulwark_protocol::register::{self, reconfig};
use bulwark_protocol::service::{NodeMessage, SystemReply, SystemRequest};
use bulwark_protocol::{a2m_storage, abd, content, cs, phalanx, powerstore, pubkey, table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = Envelope::decode(bytes::Bytes::copy_from_slice(data)) else {
        return;
    };
    let header = envelope.header;
    let frame = bulwark_core::envelope::frame_raw(&header, &envelope.body);
    assert_eq!(&frame[..], data, "an accepted frame re-frames to itself");
    let body = &envelope.body[..];
    let max = FRAME_BYTES_MAX;
    if header.kind == Kind::Refused {
        round_trip::<Refusal>(body, max);
        return;
    }
    match (header.service, header.kind) {
        (ServiceId::SYSTEM, Kind::Request) => drop(round_trip::<SystemRequest>(body, max)),
        (ServiceId::SYSTEM, Kind::Reply) => drop(round_trip::<SystemReply>(body, max)),
        (ServiceId::SYSTEM, _) => drop(round_trip::<NodeMessage>(body, max)),
        (ServiceId::POWERSTORE, Kind::Request) => {
            drop(round_trip::<powerstore::Request>(body, max))
        }
        (ServiceId::POWERSTORE, _) => drop(round_trip::<powerstore::Response>(body, max)),
        (ServiceId::ABD, Kind::Request) => drop(round_trip::<abd::Request>(body, max)),
        (ServiceId::ABD, _) => drop(round_trip::<register::Response<abd::Abd>>(body, max)),
        (ServiceId::PHALANX, Kind::Request) => drop(round_trip::<phalanx::Request>(body, max)),
        (ServiceId::PHALANX, _) => drop(round_trip::<register::Response<phalanx::Phalanx>>(
            body, max,
        )),
        (ServiceId::PUBKEY, Kind::Request) => drop(round_trip::<pubkey::Request>(body, max)),
        (ServiceId::PUBKEY, Kind::Reply) => {
            drop(round_trip::<register::Response<pubkey::PubKey>>(body, max))
        }
        (ServiceId::PUBKEY, _) => drop(round_trip::<reconfig::Transfer<pubkey::PubKey>>(body, max)),
        (ServiceId::CONTENT, Kind::Request) => drop(round_trip::<content::Request>(body, max)),
        (ServiceId::CONTENT, _) => drop(round_trip::<content::Response>(body, max)),
        (ServiceId::CONFIG, Kind::Request) => drop(round_trip::<Submitted<cs::Op>>(body, max)),
        (ServiceId::CONFIG, Kind::Reply) => drop(round_trip::<Answer<cs::Outcome>>(body, max)),
        (ServiceId::CONFIG, _) => {
            // Peer messages of either agreement core share the service.
            drop(round_trip::<Message<ConfigService>>(body, max));
            drop(round_trip::<
                bulwark_protocol::pbft::ea::Message<ConfigService>,
            >(body, max));
        }
        (ServiceId::A2M_STORAGE, Kind::Request) => {
            drop(round_trip::<a2m_storage::Request>(body, max))
        }
        (ServiceId::A2M_STORAGE, _) => drop(round_trip::<a2m_storage::Reply>(body, max)),
        (ServiceId::TABLE, Kind::Request) => drop(round_trip::<table::Request>(body, max)),
        (ServiceId::TABLE, Kind::Reply) => drop(round_trip::<table::Response>(body, max)),
        (ServiceId::TABLE, _) => drop(round_trip::<table::Message>(body, max)),
        (ServiceId::DEPOT, Kind::Request) => {
            if let Some(served::Request::Exchange { message, .. }) =
                round_trip::<served::Request>(body, max)
            {
                check_depot(message);
            }
        }
        (ServiceId::DEPOT, Kind::Reply) => drop(round_trip::<served::Reply>(body, max)),
        (ServiceId::DEPOT, _) => {
            if let Some(peer) = round_trip::<served::PeerMessage>(body, max) {
                check_depot(peer.message);
            }
        }
        _ => {}
    }
});

/// A decoded Depot message's updates checked against a volume, as a receiving node checks them
/// first: hostile bytes are refused, never a panic.
fn check_depot(message: depot::Message) {
    let config = depot::VolumeConfig::new(
        "fuzz",
        vec![depot::Member {
            key: bulwark_core::sign::SecretKey::from_seed(&[1; 32]).public_key(),
            role: depot::Role::Server,
            writes: vec![Vec::new()],
        }],
        depot::Staleness::default(),
    );
    let updates = match message {
        depot::Message::Push { updates, .. } | depot::Message::Got { updates, .. } => updates,
        depot::Message::Put { update, .. } => vec![update],
        _ => Vec::new(),
    };
    for update in updates {
        let _ = update.verify(&config);
    }
}
