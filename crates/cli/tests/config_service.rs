//! The configuration service in real node processes: PBFT among the epoch's CS replicas over the
//! nodes' pinned TLS, orders from the trusted authority, epochs that end on their own, and a CS
//! primary killed with SIGKILL in the middle of it all. Every node must end holding the same
//! certified configurations, each verified from the genesis.

use crate::common;

use bulwark_client::{ConfigAction, ConfigOutcome};
use bulwark_core::NodeId;
use bulwark_core::config::Fingerprint;
use bulwark_core::configuration::{self, NewMember};
use bulwark_core::sign::SecretKey;
use common::TestCluster;
use std::time::{Duration, Instant};

/// A node identity the authority adds; no process ever runs it, so while it is a member it is
/// one faulty (silent) node, within the CS's f_cs = 1 when it is picked for the CS.
fn newcomer(round: u8) -> NewMember {
    NewMember {
        trusted_key: None,
        address: format!("127.0.0.1:{}", 1000 + u16::from(round))
            .parse()
            .unwrap(),
        fingerprint: Fingerprint([0xA0 + round; 32]),
        signing_key: SecretKey::from_seed(&[0x50 + round; 32]).public_key(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_ends_on_the_same_certified_configurations_after_a_killed_cs_primary() {
    let mut cluster = TestCluster::start_with(
        "powerstore",
        1,
        4,
        10_000,
        &["--epoch-ms", "4000", "--stop-tolerance-ms", "500"],
    );
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let genesis = admin.genesis().unwrap();

    let mut expected_members = 4;
    for round in 0..3u8 {
        if round == 1 {
            // The primary of the current CS, killed without warning while an order is pending.
            let status = admin.status_of(NodeId(0)).await.expect("node 0 answers");
            let primary = status.cs.expect("every node is a CS replica of 4").primary as usize;
            eprintln!("killing the CS primary, node {primary}");
            cluster.kill(primary);
            let added = admin.order(ConfigAction::Add(newcomer(round))).await;
            cluster.spawn(primary, None);
            check_add(&admin, added, &mut expected_members).await;
        } else {
            let added = admin.order(ConfigAction::Add(newcomer(round))).await;
            check_add(&admin, added, &mut expected_members).await;
        }
        // The newcomer leaves again, so that at most one silent member is ever in the CS.
        let config = admin.configuration().await.unwrap();
        let newcomer_id = config
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
        assert!(
            config.member(newcomer_id).is_none(),
            "revoked in epoch {}",
            epoch.0
        );
        expected_members -= 1;
        assert_eq!(config.members.len(), expected_members);
    }

    // A revoke that would leave fewer members than a storage group needs is refused, and an
    // order signed for another epoch is refused before it is ordered.
    let (_, outcome) = admin.order(ConfigAction::Revoke(NodeId(3))).await.unwrap();
    assert!(
        matches!(&outcome, ConfigOutcome::Rejected(reason) if reason.contains("cannot form")),
        "{outcome:?}"
    );

    // Every node, the restarted one included, ends on the same chain: fetch each node's own
    // certificates and verify them from the genesis.
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
                "node {node} certified another configuration for epoch {}",
                epoch + 2
            );
        }
    }
    eprintln!("{newest} epochs, the same on every node");
}

async fn check_add(
    admin: &bulwark_client::Client,
    added: Result<(configuration::Configuration, ConfigOutcome), bulwark_client::ClientError>,
    expected_members: &mut usize,
) {
    let (config, outcome) = added.expect("add accepted");
    let ConfigOutcome::Accepted { epoch, node } = outcome else {
        panic!("add: {outcome:?}");
    };
    assert_eq!(
        epoch.0,
        config.epoch.0 + 1,
        "an ADD takes effect in the next epoch"
    );
    let next = admin.await_epoch(epoch.0).await.unwrap();
    let node = node.expect("an ADD names the id the node gets");
    assert!(
        next.member(node).is_some(),
        "node {node} is a member of epoch {}",
        next.epoch.0
    );
    *expected_members += 1;
    assert_eq!(next.members.len(), *expected_members);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_answering_pings_is_evicted_and_no_other() {
    let mut cluster = TestCluster::start_with(
        "powerstore",
        1,
        5,
        10_000,
        &[
            "--epoch-ms",
            "4000",
            "--stop-tolerance-ms",
            "500",
            "--ping-cycle-ms",
            "300",
        ],
    );
    cluster.wait_up(&[0, 1, 2, 3, 4]).await;
    let admin = cluster.client("admin").await;
    // Everyone answers for a while: nobody is evicted.
    let before = admin.configuration().await.unwrap();
    let later = admin.await_epoch(before.epoch.0 + 2).await.unwrap();
    assert_eq!(
        later.members.len(),
        5,
        "a member that answers is never evicted"
    );

    // An operator cannot evict a member that answers: no CS replica agrees.
    let refusal = admin
        .evict(NodeId(4))
        .await
        .expect_err("no replica agrees to evict a member that answers");
    assert!(refusal.to_string().contains("agree"), "{refusal}");

    cluster.kill(4);
    let started = Instant::now();
    // Once the replicas have missed its pings for n_accept cycles they agree, and the operator's
    // EVICT may go in ahead of the one they would propose themselves.
    let mut hurried = false;
    while started.elapsed() < Duration::from_secs(30) {
        match admin.evict(NodeId(4)).await {
            Ok((_, ConfigOutcome::Accepted { node, .. })) => {
                assert_eq!(node, Some(NodeId(4)));
                hurried = true;
                break;
            }
            Ok((_, ConfigOutcome::Rejected(reason))) => {
                assert!(
                    reason.contains("already leaving") || reason.contains("not a member"),
                    "{reason}"
                );
                break;
            }
            Ok((_, other)) => panic!("unexpected answer to an eviction: {other:?}"),
            // Not a member any more (its eviction was certified), or not enough agreement yet.
            Err(error) if error.to_string().contains("not a member") => break,
            Err(error) => assert!(error.to_string().contains("agree"), "{error}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let evicted = loop {
        let config = admin.configuration().await.unwrap();
        if config.member(NodeId(4)).is_none() {
            break config;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "node 4 is still a member in epoch {}",
            config.epoch.0
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        evicted.members.iter().map(|m| m.id.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3],
        "only the silent member leaves"
    );
    eprintln!(
        "node 4 evicted in epoch {}, {:.1} s after it stopped ({})",
        evicted.epoch.0,
        started.elapsed().as_secs_f64(),
        if hurried {
            "by the operator's EVICT"
        } else {
            "by the CS's own EVICT"
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_from_the_configuration_service_stops_and_says_why() {
    let mut cluster = TestCluster::start_with(
        "powerstore",
        1,
        4,
        10_000,
        &["--contact-ms", "1000", "--contact-grace-ms", "1500"],
    );
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    admin
        .put(b"k", bytes::Bytes::from_static(b"v"))
        .await
        .expect("a confirmed client writes");
    // Past contact_ms the client confirms again, and goes on while the CS answers.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    admin
        .put(b"k", bytes::Bytes::from_static(b"w"))
        .await
        .expect("confirmed again");

    // Only one CS replica left: f_cs+1 = 2 cannot confirm the configuration any more.
    for node in 1..4 {
        cluster.kill(node);
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let started = Instant::now();
    let error = admin
        .get(b"k")
        .await
        .expect_err("a client that cannot confirm its configuration stops");
    let text = error.to_string();
    assert!(
        matches!(error, bulwark_client::ClientError::Stale { .. }),
        "{text}"
    );
    assert!(text.contains("could not be confirmed"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it stops after the grace period, not at the operation's deadline"
    );
    eprintln!("{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_starts_from_the_configuration_it_verified_last() {
    let cluster = TestCluster::start_with(
        "powerstore",
        1,
        4,
        10_000,
        &["--epoch-ms", "1500", "--stop-tolerance-ms", "300"],
    );
    cluster.wait_up(&[0, 1, 2, 3]).await;
    let admin = cluster.client("admin").await;
    let verified = admin.await_epoch(3).await.expect("epochs go on ending");
    let kept = cluster
        .path()
        .join("client-admin")
        .join(bulwark_client::KNOWN_FILE);
    assert!(kept.exists(), "the client keeps what it verified");

    // The next run verifies only what came after: its chain starts there.
    let next = cluster.client("admin").await;
    let rings = next.rings().await.expect("rings");
    assert!(
        rings.genesis().epoch() >= verified.epoch,
        "started at epoch {} though epoch {} was verified before",
        rings.genesis().epoch().0,
        verified.epoch.0
    );
    next.put(b"after a restart", bytes::Bytes::from_static(b"v"))
        .await
        .expect("a put from the kept configuration");

    // A damaged file, or one of another cluster, is ignored: verified from the genesis again.
    for damage in [b"not a configuration".to_vec(), {
        let mut other = std::fs::read(&kept).unwrap();
        other[0] ^= 1;
        other
    }] {
        std::fs::write(&kept, damage).unwrap();
        let fresh = cluster.client("admin").await;
        let rings = fresh.rings().await.expect("rings");
        assert_eq!(rings.genesis().epoch(), configuration::GENESIS_EPOCH);
        assert!(fresh.configuration().await.unwrap().epoch >= verified.epoch);
    }
}

/// A cluster of five whose node 4 falls behind the configuration as `lag` says
/// (`bulwark-byzantine --transfers`), everything else honest and quick to judge.
async fn with_a_lagging_member(lag: &str) -> (TestCluster, bulwark_client::Client) {
    let mut cluster = TestCluster::init(
        "powerstore",
        1,
        5,
        10_000,
        &[
            "--epoch-ms",
            "3000",
            "--stop-tolerance-ms",
            "500",
            "--ping-cycle-ms",
            "300",
        ],
    );
    for id in 0..4 {
        cluster.spawn(id, None);
    }
    cluster.spawn_byzantine(4, &["--transfers", lag]);
    cluster.wait_up(&[0, 1, 2, 3, 4]).await;
    let admin = cluster.client("admin").await;
    (cluster, admin)
}

/// Waits until node `lagging` is no longer a member, at most `limit` after the call; returns the
/// configuration that left it out.
async fn evicted(
    admin: &bulwark_client::Client,
    lagging: NodeId,
    limit: Duration,
) -> configuration::Configuration {
    let started = Instant::now();
    loop {
        let config = admin.configuration().await.expect("configuration");
        if config.member(lagging).is_none() {
            eprintln!(
                "{lagging} evicted in epoch {}, {:.1} s after the wait began",
                config.epoch.0,
                started.elapsed().as_secs_f64()
            );
            return config;
        }
        assert!(
            started.elapsed() < limit,
            "{lagging} is still a member in epoch {}",
            config.epoch.0
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Content-hash objects written before a reconfiguration, to read back after it.
async fn write_objects(
    admin: &bulwark_client::Client,
) -> Vec<(bulwark_protocol::content::ContentId, Vec<u8>)> {
    let mut written = Vec::new();
    for i in 0..12u8 {
        let value = vec![i; 1000 + usize::from(i)];
        let (id, _) = admin.put_content(&value).await.expect("content write");
        written.push((id, value));
    }
    written
}

async fn assert_objects_readable(
    reader: &bulwark_client::Client,
    written: &[(bulwark_protocol::content::ContentId, Vec<u8>)],
) {
    for (id, value) in written {
        let (read, _) = reader.get_content(id).await.expect("content read");
        assert_eq!(read.as_deref(), Some(value.as_slice()), "object {id}");
    }
}

/// Rosebud §4.9: a member whose replicas never enter a newer epoch answers no ping of it, and
/// the configuration service evicts it on its own, and no one else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_skips_epochs_is_evicted_and_no_other() {
    let (_cluster, admin) = with_a_lagging_member("skip-epochs").await;
    let written = write_objects(&admin).await;
    let config = evicted(&admin, NodeId(4), Duration::from_secs(60)).await;
    assert_eq!(
        config.members.iter().map(|m| m.id.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3],
        "only the member that skipped epochs leaves"
    );
    assert_objects_readable(&admin, &written).await;
}

/// Rosebud §4.9: a member that enters every epoch but never finishes taking over what a change
/// of its groups gives it is evicted once such a change comes (a node joins), and no one else:
/// until then it is as good a member as any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_transfers_never_finish_is_evicted_once_its_groups_change() {
    let (mut cluster, admin) = with_a_lagging_member("stall").await;
    let written = write_objects(&admin).await;
    let before = admin.configuration().await.expect("configuration");
    let later = admin
        .await_epoch(before.epoch.0 + 2)
        .await
        .expect("epochs go on ending");
    assert_eq!(
        later.members.len(),
        5,
        "with nothing to take over, the stalling member answers and stays"
    );

    // On a ring of six nodes any two are at most three apart, so some group of four holds both
    // the newcomer and node 4: node 4 is in a group whose order changed, has fragments to take
    // over, and never will.
    let port = cluster.join();
    let started = Instant::now();
    let joined = loop {
        let config = admin.configuration().await.expect("configuration");
        if let Some(member) = config.members.iter().find(|m| m.address.port() == port) {
            break member.id;
        }
        if started.elapsed() > Duration::from_secs(60) {
            panic!(
                "the join was not certified: epoch {}\n{}",
                config.epoch.0,
                cluster.join_log(port)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let config = evicted(&admin, NodeId(4), Duration::from_secs(90)).await;
    let mut members: Vec<u32> = config.members.iter().map(|m| m.id.0).collect();
    members.sort_unstable();
    let mut expected = vec![0, 1, 2, 3, joined.0];
    expected.sort_unstable();
    assert_eq!(members, expected, "only the stalling member leaves");
    assert_objects_readable(&admin, &written).await;
}
