//! The configuration service on trusted logs in real processes: `cluster init --a2m
//! --cs-protocol a2m-pbft-ea` (the CS on `2f_cs+1 = 3` replicas) and `a2m-pbft-e` (on
//! `3f_cs+1 = 4`, clients taking only `2f_cs+1` answers their trusted logs attest), each node's
//! trusted log its own `bulwark a2m serve` process. Orders go through while the CS primary is
//! killed with SIGKILL and restarted, and while one CS replica's trusted-log process is killed
//! and restarted; every node must end holding the same certified configurations, each verified
//! from the genesis.

use crate::common;

use bulwark_client::{ConfigAction, ConfigOutcome};
use bulwark_core::NodeId;
use bulwark_core::config::Fingerprint;
use bulwark_core::configuration::{self, CsProtocol, NewMember};
use bulwark_core::sign::SecretKey;
use common::TestCluster;
use std::time::{Duration, Instant};

/// A node identity with a trusted log that the authority adds; no process runs it, so while it
/// is a member it is one silent node, within f_cs = 1 when it is picked for the CS.
fn newcomer(round: u8) -> NewMember {
    NewMember {
        address: format!("127.0.0.1:{}", 1100 + u16::from(round))
            .parse()
            .unwrap(),
        fingerprint: Fingerprint([0xB0 + round; 32]),
        signing_key: SecretKey::from_seed(&[0x60 + round; 32]).public_key(),
        trusted_key: Some(SecretKey::from_seed(&[0x70 + round; 32]).public_key()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cs_on_ea_survives_a_killed_primary_and_a_killed_trusted_log() {
    survives_a_killed_primary_and_a_killed_trusted_log(CsProtocol::A2mPbftEa).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cs_on_e_survives_a_killed_primary_and_a_killed_trusted_log() {
    survives_a_killed_primary_and_a_killed_trusted_log(CsProtocol::A2mPbftE).await;
}

async fn survives_a_killed_primary_and_a_killed_trusted_log(protocol: CsProtocol) {
    let mut cluster = TestCluster::start_with(
        "powerstore",
        1,
        4,
        10_000,
        &[
            "--a2m",
            "--cs-protocol",
            protocol.name(),
            "--epoch-ms",
            "4000",
            "--stop-tolerance-ms",
            "500",
        ],
    );
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let genesis = admin.genesis().unwrap();
    assert_eq!(genesis.cs_protocol, protocol);
    assert_eq!(genesis.cs().len(), genesis.cs_size());
    let cs_size = if protocol == CsProtocol::A2mPbftEa {
        3
    } else {
        4
    };
    assert_eq!(genesis.cs_size(), cs_size, "2f_cs+1 on EA, 3f_cs+1 on E");

    // An ADD without a trusted log is refused: every member of such a configuration has one.
    let mut bare = newcomer(9);
    bare.trusted_key = None;
    let (_, outcome) = admin.order(ConfigAction::Add(bare)).await.unwrap();
    assert!(
        matches!(&outcome, ConfigOutcome::Rejected(reason) if reason.contains("trusted log")),
        "{outcome:?}"
    );

    let mut expected_members = 4;
    for round in 0..3u8 {
        let config = admin.configuration().await.unwrap();
        let cs = config.cs();
        let added = match round {
            1 => {
                // The CS primary, killed without warning while an order is pending.
                let member = cs[0];
                let status = admin.status_of(member).await.expect("a CS replica answers");
                let primary = status.cs.expect("a CS replica").primary as usize;
                eprintln!("killing the CS primary, node {primary}");
                cluster.kill(primary);
                let added = admin.order(ConfigAction::Add(newcomer(round))).await;
                cluster.spawn(primary, None);
                added
            }
            2 => {
                // A CS replica's trusted log dies: its node cannot say anything about the order
                // until the log is back, restarted from its own durable state.
                let replica = cs
                    .iter()
                    .map(|id| id.0 as usize)
                    .find(|id| *id < 4)
                    .unwrap();
                eprintln!("killing node {replica}'s trusted log");
                cluster.kill_trusted_log(replica);
                let added = admin.order(ConfigAction::Add(newcomer(round))).await;
                cluster.spawn_trusted_log(replica);
                added
            }
            _ => admin.order(ConfigAction::Add(newcomer(round))).await,
        };
        let (config, outcome) = added.expect("add accepted");
        let ConfigOutcome::Accepted { epoch, node } = outcome else {
            panic!("add: {outcome:?}");
        };
        assert_eq!(epoch.0, config.epoch.0 + 1);
        let next = admin.await_epoch(epoch.0).await.unwrap();
        assert!(next.member(node.expect("an id")).is_some());
        expected_members += 1;
        assert_eq!(next.members.len(), expected_members);
        // The newcomer leaves again, so that at most one silent member is ever in the CS.
        let newcomer_id = next
            .members
            .iter()
            .find(|m| m.signing_key == newcomer(round).signing_key)
            .expect("the newcomer is a member")
            .id;
        let (_, outcome) = admin
            .order(ConfigAction::Revoke(newcomer_id))
            .await
            .expect("revoke accepted");
        let ConfigOutcome::Accepted { epoch, .. } = outcome else {
            panic!("revoke: {outcome:?}");
        };
        let config = admin.await_epoch(epoch.0).await.unwrap();
        assert!(config.member(newcomer_id).is_none());
        expected_members -= 1;
    }

    // Every node ends on the same chain, verified from the genesis.
    let newest = admin.configuration().await.unwrap().epoch.0;
    let started = Instant::now();
    let mut chains = Vec::new();
    for node in 0..4u32 {
        loop {
            let mut certs = Vec::new();
            let mut after = genesis.epoch.0;
            while let Ok(page) = admin.certificates_from(NodeId(node), after).await {
                if page.is_empty() {
                    break;
                }
                after += page.len() as u64;
                certs.extend(page);
            }
            if after >= newest {
                let verified = configuration::verify_chain(&genesis, &certs)
                    .unwrap_or_else(|e| panic!("node {node}'s chain: {e}"));
                assert!(verified.epoch.0 >= newest);
                assert!(
                    certs
                        .iter()
                        .all(|cert| cert.signatures.len() >= genesis.cs_quorum())
                );
                chains.push(certs);
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "node {node} holds epoch {after}, not {newest}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for epoch in 0..newest as usize - 1 {
        let first = &chains[0][epoch].bytes;
        for (node, chain) in chains.iter().enumerate() {
            assert_eq!(
                &chain[epoch].bytes,
                first,
                "node {node}, epoch {}",
                epoch + 2
            );
        }
    }
    eprintln!(
        "{newest} epochs on {}, the same on every node",
        protocol.name()
    );
}
