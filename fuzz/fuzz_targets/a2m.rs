//! The trusted log's socket, as its host (the party A2M guards against) drives it: each input is
//! a run of frames, each decoded as the component's server decodes it and answered by one
//! component with small limits. Inputs whose first byte is odd are read instead as compact calls
//! (a few bytes each: kind, log, slot, value, nonce), so that the fuzzer reaches deep call
//! sequences instead of spending itself on framing. Besides no panic and decode(encode(x)) = x, the point of A2M is
//! checked: every attestation verifies under the component's key, and no two attestations it
//! ever signed contradict each other, whatever the host asked. A trailing part of the input is
//! also read as the component's stored records and restored.
#![no_main]

use bulwark_a2m::socket::{FRAME_BYTES_MAX, Request, Response, answer};
use bulwark_a2m::{A2m, Component, Entry, Head, Limits, Logs};
use bulwark_core::a2m::{Attestation, Call, contradicts};
use bulwark_fuzz::round_trip;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        logs_max: 3,
        entries_max: 8,
    };
    let mut component = Component::in_memory(&[7; 32], limits);
    let key = component.public_key();
    let mut attested: Vec<Attestation> = Vec::new();
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let compact = mode % 2 == 1;
    loop {
        let frame = if compact {
            let Some((call, after)) = rest.split_first_chunk::<5>() else {
                break;
            };
            rest = after;
            compact_call(*call)
        } else {
            let Some((&length, after)) = rest.split_first() else {
                break;
            };
            let length = usize::from(length);
            if after.len() < length {
                break;
            }
            let (frame, after) = after.split_at(length);
            rest = after;
            frame.to_vec()
        };
        let Some(request) = round_trip::<Request>(&frame, FRAME_BYTES_MAX) else {
            continue;
        };
        let response = answer(&mut component, request, 0);
        let encoded = bulwark_core::wire::encode(&response);
        let decoded: Response =
            bulwark_core::wire::decode(&encoded, FRAME_BYTES_MAX).expect("an answer decodes");
        if let Response::Attested(attestation) = decoded {
            let signed = attestation
                .verify(&key)
                .expect("the component's attestations verify");
            let statement = *signed.value();
            for earlier in &attested {
                assert!(
                    !contradicts(earlier, &statement),
                    "{earlier:?} and {statement:?} contradict"
                );
            }
            attested.push(statement);
        }
    }
    // Whatever is left: stored heads and entries, as a damaged disk might hold them.
    let heads: Vec<(u64, Head)> = rest
        .chunks(24)
        .filter_map(|chunk| round_trip::<(u64, Head)>(chunk, 128))
        .collect();
    let entries: Vec<(u64, u128, Entry)> = rest
        .chunks(40)
        .filter_map(|chunk| round_trip::<(u64, u128, Entry)>(chunk, 128))
        .collect();
    let _ = Logs::restore(limits, heads, entries);
});

/// A call from five bytes: kind, log, slot (small, so that calls meet the logs' ends), value and
/// nonce (each a repeated byte), encoded as the host would send it.
fn compact_call([kind, log, seq, value, nonce]: [u8; 5]) -> Vec<u8> {
    let log = u64::from(log % 4);
    let seq = u128::from(seq % 16);
    let (value, nonce) = ([value % 4; 32], [nonce; 32]);
    let call = |call| Request::Call(call);
    let request = match kind % 9 {
        0 => call(Call::Append { log, value }),
        1 => call(Call::Advance {
            log,
            seq,
            digest: nonce,
            value,
        }),
        2 => call(Call::Lookup { log, seq, nonce }),
        3 => call(Call::End { log, nonce }),
        4 => call(Call::Truncate { log, seq }),
        5 => call(Call::AppendAttest { log, value, nonce }),
        6 => call(Call::AdvanceAttest {
            log,
            seq,
            digest: nonce,
            value,
            nonce,
        }),
        7 => Request::Status,
        _ => Request::Identity,
    };
    bulwark_core::wire::encode(&request)
}
