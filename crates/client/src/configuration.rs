//! The configuration service from the client's side: fetch the certified configurations from
//! the nodes and verify them one epoch after another from the genesis in `cluster.toml` (no node
//! is trusted for them: a node can withhold a certificate but not forge one), and submit
//! operations to the current epoch's CS replicas through the one generic driver.

use crate::{Client, ClientError};
use bulwark_core::NodeId;
use bulwark_core::configuration::{self, Configuration, cs_group};
use bulwark_core::membership::{Chain, GroupView};
use bulwark_core::sign::{PublicKey, SecretKey, Signed};
use bulwark_protocol::cs::{self, Action, ConfigService, Op, Order, Outcome};
use bulwark_protocol::pbft::Submit;
use bulwark_protocol::service::{SystemReply, SystemRequest};
use std::sync::Arc;
use std::time::Duration;

/// The file in a client's directory that keeps the newest configuration it verified: the
/// genesis digest it descends from, then the configuration's canonical encoding. A client
/// trusts its own directory (its keys are there); a file of another cluster, or one that does
/// not decode, is ignored.
pub const KNOWN_FILE: &str = "configuration.bin";
/// The largest [`KNOWN_FILE`] read.
const KNOWN_BYTES_MAX: u64 = 64 << 20;

/// How long one node may take to answer a request for certificates.
const FETCH_WAIT: Duration = Duration::from_secs(3);
/// Times an operation is resubmitted after the CS moved to a newer epoch under it.
const EPOCH_RETRIES: usize = 5;

/// Each member of `config` with the key its statements verify under.
fn member_keys(config: &Configuration) -> Vec<(NodeId, PublicKey)> {
    config
        .members
        .iter()
        .map(|member| (member.id, member.signing_key))
        .collect()
}

impl Client {
    /// The genesis configuration of `cluster.toml`, if the cluster has a configuration service.
    pub fn genesis(&self) -> Result<Configuration, ClientError> {
        self.cluster.genesis()?.ok_or_else(|| {
            ClientError::Protocol("this cluster has no configuration service".into())
        })
    }

    /// The newest configuration any node can prove: certificates fetched from the members of the
    /// newest one this client has verified (from the genesis on first use), each verified
    /// against the configuration before it.
    pub async fn configuration(&self) -> Result<Configuration, ClientError> {
        Ok(self.refresh().await?.0)
    }

    /// Where each epoch placed keys, from the genesis to the newest, as last fetched: fetched
    /// and verified on first use, again when an operation meets a replica in a newer epoch.
    /// A cluster without a configuration service has one epoch, `cluster.toml`'s.
    pub async fn rings(&self) -> Result<Arc<Chain>, ClientError> {
        let known = self.known.lock().ok().and_then(|known| known.clone());
        match known {
            Some((_, chain)) => Ok(chain),
            None => self.refresh_rings().await,
        }
    }

    /// [`Client::rings`], fetched and verified again now.
    pub(crate) async fn refresh_rings(&self) -> Result<Arc<Chain>, ClientError> {
        if self.cluster.configuration_service.is_none() {
            let ring = Arc::new(self.placement.ring().clone());
            let keys = self
                .placement
                .members()
                .map(|member| (member.id, member.signing_key));
            return Ok(Arc::new(Chain::new(vec![ring]).with_keys(keys)));
        }
        Ok(self.refresh().await?.1)
    }

    /// Fetches the configurations after the newest one verified, verifies them, and keeps the
    /// newest with the ring of every epoch.
    async fn refresh(&self) -> Result<(Configuration, Arc<Chain>), ClientError> {
        let ring_of = |config: &Configuration| {
            config
                .ring()
                .map(Arc::new)
                .map_err(|e| ClientError::Protocol(format!("epoch {}: {e}", config.epoch.0)))
        };
        let known = self.known.lock().ok().and_then(|known| known.clone());
        let (mut newest, mut chain) = match known {
            Some(known) => known,
            None => {
                // Where this client left off, or the genesis: every epoch from there is verified.
                let genesis = self.genesis()?;
                let start = self.load_known(&genesis).unwrap_or(genesis);
                // A kept configuration may name members `cluster.toml` does not: nodes that
                // joined since. Nothing newer may come to introduce them.
                self.meet(&start.members);
                let ring = ring_of(&start)?;
                let chain = Chain::new(vec![ring]).with_keys(member_keys(&start));
                (start, Arc::new(chain))
            }
        };
        let newer = self.configurations_after(&newest).await;
        let moved = !newer.is_empty();
        if !newer.is_empty() {
            let mut grown = (*chain).clone();
            for config in newer {
                grown.push(ring_of(&config)?);
                grown = grown.with_keys(member_keys(&config));
                newest = config;
            }
            chain = Arc::new(grown);
        }
        if let Ok(mut known) = self.known.lock() {
            // Two fetches may race: the longer chain stays.
            if known
                .as_ref()
                .is_none_or(|(held, _)| held.epoch < newest.epoch)
            {
                *known = Some((newest.clone(), chain.clone()));
            }
        }
        if moved {
            self.save_known(&newest);
        }
        Ok((newest, chain))
    }

    /// The configuration [`KNOWN_FILE`] holds, if it descends from `genesis` and is newer.
    fn load_known(&self, genesis: &Configuration) -> Option<Configuration> {
        use std::io::Read;
        let path = self.known_file.as_ref()?;
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .ok()?
            .take(KNOWN_BYTES_MAX)
            .read_to_end(&mut bytes)
            .ok()?;
        let (digest, encoded) = bytes.split_first_chunk::<32>()?;
        if *digest != genesis.digest().0 {
            tracing::debug!(path = %path.display(), "a configuration of another cluster: ignored");
            return None;
        }
        match Configuration::decode(encoded) {
            Ok(config) if config.epoch > genesis.epoch => Some(config),
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "kept configuration ignored");
                None
            }
        }
    }

    /// Keeps `config` in [`KNOWN_FILE`], replacing the file whole: a reader sees the old one or
    /// the new one. Best effort: without it the next run verifies from the genesis again.
    fn save_known(&self, config: &Configuration) {
        let (Some(path), Ok(genesis)) = (self.known_file.as_ref(), self.genesis()) else {
            return;
        };
        let mut bytes = genesis.digest().0.to_vec();
        bytes.extend(config.encode());
        // Unique per write: clients of one process, or of several, may save at once.
        let staged = path.with_extension(format!("{:016x}.tmp", rand::random::<u64>()));
        let written = std::fs::write(&staged, &bytes).and_then(|()| std::fs::rename(&staged, path));
        if let Err(error) = written {
            let _ = std::fs::remove_file(&staged);
            tracing::debug!(path = %path.display(), %error, "configuration not kept");
        }
    }

    /// Every configuration after `from` (verified) that a node can prove, each verified against
    /// the one before it. Each round asks the members of the newest configuration so far, and
    /// waits for all but `f` of them: a node down or slow must not hold up every configuration
    /// change (a node can withhold, never forge, a certificate), and a node that left is not
    /// waited for.
    async fn configurations_after(&self, from: &Configuration) -> Vec<Configuration> {
        use futures::StreamExt;
        let mut configurations: Vec<Configuration> = Vec::new();
        let mut current = from.clone();
        loop {
            let after = current.epoch.0;
            let asked: Vec<NodeId> = current.members.iter().map(|member| member.id).collect();
            let enough = asked.len().saturating_sub(current.f as usize).max(1);
            let mut asks: futures::stream::FuturesUnordered<_> = asked
                .iter()
                .map(|&node| async move { (node.0, self.certificates_from(node, after).await) })
                .collect();
            let mut answers = Vec::new();
            while let Some((node, certs)) = asks.next().await {
                if let Ok(certs) = certs {
                    answers.push((node, certs));
                }
                if answers.len() >= enough {
                    break;
                }
            }
            drop(asks);
            let before = current.epoch;
            for (node, certs) in answers {
                for cert in certs {
                    match configuration::verify_successor(&current, &cert) {
                        Ok(next) => {
                            self.meet(&next.members);
                            configurations.push(next.clone());
                            current = next;
                        }
                        Err(configuration::CertError::WrongEpoch { got, .. })
                            if got <= current.epoch => {}
                        Err(error) => {
                            tracing::warn!(node, %error, "a node offered a bad configuration certificate");
                            break;
                        }
                    }
                }
            }
            if current.epoch == before {
                return configurations;
            }
        }
    }

    /// The certificates one node holds after epoch `after` (at most a page of them), unverified.
    pub async fn certificates_from(
        &self,
        node: NodeId,
        after: u64,
    ) -> Result<Vec<configuration::ConfigCert>, String> {
        match self
            .ask(node, &SystemRequest::Configuration { after })
            .await?
        {
            SystemReply::Configuration(certs) => Ok(certs),
            _ => Err("an answer to another question".into()),
        }
    }

    /// Submits `op` to the configuration service of the newest epoch, and again to a newer one
    /// if the CS moved on before ordering it. Returns the epoch that answered and its outcome.
    pub async fn configure(
        &self,
        op: impl Fn(&Configuration) -> Result<Op, ClientError>,
    ) -> Result<(Configuration, Outcome), ClientError> {
        let mut last = None;
        for _ in 0..EPOCH_RETRIES {
            let config = self.configuration().await?;
            match self.try_epoch(&config, op(&config)?).await? {
                Ok(outcome) => return Ok((config, outcome)),
                Err(moved_on) => last = Some(moved_on),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Protocol("no epoch answered".into())))
    }

    /// Submits `op` to the CS of `config`: its outcome, or (inside) why the next epoch's CS must
    /// be asked instead.
    async fn try_epoch(
        &self,
        config: &Configuration,
        op: Op,
    ) -> Result<Result<Outcome, ClientError>, ClientError> {
        match self.submit_to(config, op).await {
            Ok(Outcome::Ended { next }) => Ok(Err(ClientError::Protocol(format!(
                "epoch {} ended before the operation was ordered, and so did the next ones \
                 (now {})",
                config.epoch.0, next.0
            )))),
            Ok(outcome) => Ok(Ok(outcome)),
            // The CS of this epoch is gone (the epoch ended meanwhile): ask the next one.
            Err(ClientError::Refused { refusal, nodes }) if refusal.contains("epoch") => {
                Ok(Err(ClientError::Refused { refusal, nodes }))
            }
            Err(error) => Err(error),
        }
    }

    /// Submits `op` once to the CS replicas of `config` (a configuration already fetched and
    /// verified), without fetching it again or moving to a newer epoch: what
    /// [`Client::configure`] does each try, and what a benchmark of the CS itself measures.
    pub async fn submit_to(&self, config: &Configuration, op: Op) -> Result<Outcome, ClientError> {
        let view = GroupView::new(cs_group(config.epoch), config.epoch, config.cs())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut machine: Submit<ConfigService> =
            ConfigService::submit(config, self.id, self.op_id().0, op)
                .map_err(ClientError::Protocol)?;
        self.drive(
            &view,
            &"the configuration service",
            config.f_cs as usize,
            &mut machine,
        )
        .await
    }

    /// Whether this client holds the trusted authority's key (the administrator's).
    pub fn is_authority(&self) -> bool {
        self.authority.is_some()
    }

    /// Orders `action` as the trusted authority, signed for the epoch it is submitted in.
    pub async fn order(&self, action: Action) -> Result<(Configuration, Outcome), ClientError> {
        self.configure(|config| self.signed_order(config, &action))
            .await
    }

    /// `action` as an operation for the CS of `config`, signed by the trusted authority (for
    /// [`Client::submit_to`]).
    pub fn signed_order(&self, config: &Configuration, action: &Action) -> Result<Op, ClientError> {
        let Some(seed) = self.authority else {
            return Err(ClientError::Protocol(format!(
                "client {:?} holds no authority key (only the administrator does)",
                self.name
            )));
        };
        order_op(&SecretKey::from_seed(&seed), config, action)
    }

    /// Evicts `node` now, on the evidence of the CS replicas' own monitoring (Rosebud §3.3):
    /// asks each CS replica of the newest epoch for its signed agreement, and submits the
    /// eviction once `2f_cs+1` agree. A replica agrees only if `node` has stopped answering its
    /// pings, so this hurries an eviction the CS would propose by itself; it cannot remove a
    /// node that answers (that is a REVOKE, the authority's order).
    pub async fn evict(&self, node: NodeId) -> Result<(Configuration, Outcome), ClientError> {
        // Agreements are bound to their epoch: if it ends first, they are gathered anew from
        // the next epoch's CS.
        let mut last = None;
        for _ in 0..EPOCH_RETRIES {
            let config = self.configuration().await?;
            let op = self.evict_op(&config, node).await?;
            match self.try_epoch(&config, op).await? {
                Ok(outcome) => return Ok((config, outcome)),
                Err(moved_on) => last = Some(moved_on),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Protocol("no epoch answered".into())))
    }

    /// The EVICT of `node` for the CS of `config`, with the agreements of `2f_cs+1` of its
    /// replicas.
    async fn evict_op(&self, config: &Configuration, node: NodeId) -> Result<Op, ClientError> {
        if config.member(node).is_none() {
            return Err(ClientError::Protocol(format!(
                "{node} is not a member of epoch {}",
                config.epoch.0
            )));
        }
        let request = SystemRequest::Evict {
            epoch: config.epoch,
            node,
        };
        let cs = config.cs();
        let asks = cs.iter().map(|replica| {
            let request = &request;
            async move { (*replica, self.ask(*replica, request).await) }
        });
        let mut votes = Vec::new();
        let mut problems = Vec::new();
        for (replica, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok(SystemReply::Evict(Ok(vote))) => votes.push((replica, vote)),
                Ok(SystemReply::Evict(Err(reason))) => {
                    problems.push(format!("{replica}: {reason}"));
                }
                Ok(_) => problems.push(format!("{replica}: an answer to another question")),
                Err(error) => problems.push(format!("{replica}: {error}")),
            }
        }
        let needed = config.cs_quorum();
        if votes.len() < needed {
            return Err(ClientError::Protocol(format!(
                "{} of the {} CS replicas of epoch {} agree that {node} is unresponsive \
                 ({needed} needed): {}",
                votes.len(),
                cs.len(),
                config.epoch.0,
                problems.join("; ")
            )));
        }
        // The replicas verify every agreement before ordering; a bad one is refused there.
        Ok(Op::Evict { node, votes })
    }

    /// Challenges the CS replicas of the newest configuration with a fresh nonce; `f_cs+1`
    /// answers, each signed by a CS replica of that epoch for that configuration's digest,
    /// confirm it as current (at least one of them is correct).
    pub async fn confirm(&self) -> Result<Configuration, ClientError> {
        use bulwark_core::configuration::Fresh;
        let config = self.configuration().await?;
        let nonce = rand::random::<u64>();
        let cs = config.cs();
        let asks = cs.iter().map(|node| async move {
            let answer = self.ask(*node, &SystemRequest::Fresh { nonce }).await;
            (*node, answer)
        });
        let needed = config.f_cs as usize + 1;
        let mut confirmed = 0;
        let mut problems = Vec::new();
        // Done at the f_cs+1-th confirmation: a replica that is down or slow must not hold up
        // every client's first operation for the whole FETCH_WAIT.
        let mut answers: futures::stream::FuturesUnordered<_> = asks.collect();
        while confirmed < needed
            && let Some((node, answer)) = futures::StreamExt::next(&mut answers).await
        {
            let fresh = match answer {
                Ok(SystemReply::Fresh(Some(fresh))) => fresh,
                Ok(SystemReply::Fresh(None)) => {
                    problems.push(format!("{node} is not a CS replica of its current epoch"));
                    continue;
                }
                Ok(_) => continue,
                Err(error) => {
                    problems.push(format!("{node}: {error}"));
                    continue;
                }
            };
            let Some(key) = config.member(node).map(|m| m.signing_key) else {
                continue;
            };
            match fresh.verify(&key) {
                Ok(signed) => {
                    let Fresh {
                        nonce: echoed,
                        epoch,
                        digest,
                        node: signer,
                    } = *signed.value();
                    if echoed == nonce
                        && signer == node
                        && epoch == config.epoch
                        && digest == config.digest()
                    {
                        confirmed += 1;
                    } else {
                        problems.push(format!("{node} holds epoch {} as current", epoch.0));
                    }
                }
                Err(error) => problems.push(format!("{node}'s answer: {error}")),
            }
        }
        drop(answers);
        if confirmed >= needed {
            if let Ok(mut last) = self.confirmed.lock() {
                *last = Some((std::time::Instant::now(), config.epoch));
            }
            return Ok(config);
        }
        Err(ClientError::Stale {
            since: Duration::ZERO,
            reason: format!(
                "{confirmed} of the {} CS replicas of epoch {} confirmed it ({needed} needed): {}",
                cs.len(),
                config.epoch.0,
                problems.join("; ")
            ),
        })
    }

    /// Stops operations once the configuration has gone unconfirmed for longer than the
    /// cluster's `contact_ms`: confirms again then, and fails after a further `contact_grace_ms`
    /// of trying (Rosebud §3.8: a client cut off from the CS must not go on with a configuration
    /// that may no longer hold).
    pub(crate) async fn fresh(&self) -> Result<(), ClientError> {
        let Some(cs) = &self.cluster.configuration_service else {
            return Ok(());
        };
        let contact = Duration::from_millis(cs.contact_ms);
        let grace = Duration::from_millis(cs.contact_grace_ms);
        let last = self.confirmed.lock().ok().and_then(|last| *last);
        if last.is_some_and(|(at, _)| at.elapsed() < contact) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let stop_at = match last {
            Some((at, _)) => (at + contact + grace).max(started),
            None => started + grace,
        };
        loop {
            match self.confirm().await {
                Ok(_) => return Ok(()),
                Err(ClientError::Stale { reason, .. }) if std::time::Instant::now() >= stop_at => {
                    let since = last.map_or(started.elapsed(), |(at, _)| at.elapsed());
                    return Err(ClientError::Stale { since, reason });
                }
                Err(error) if std::time::Instant::now() >= stop_at => {
                    let since = last.map_or(started.elapsed(), |(at, _)| at.elapsed());
                    return Err(ClientError::Stale {
                        since,
                        reason: error.to_string(),
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    /// Asks one node a question about itself.
    async fn ask(&self, node: NodeId, request: &SystemRequest) -> Result<SystemReply, String> {
        self.ask_within(node, request, FETCH_WAIT).await
    }

    /// Waits until a configuration of at least `epoch` is certified, polling the nodes.
    pub async fn await_epoch(&self, epoch: u64) -> Result<Configuration, ClientError> {
        let deadline = tokio::time::Instant::now() + self.deadline;
        loop {
            let config = self.configuration().await?;
            if config.epoch.0 >= epoch {
                return Ok(config);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClientError::Protocol(format!(
                    "epoch {epoch} was not certified within {:?}; the newest is {}",
                    self.deadline, config.epoch.0
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `action` for the CS of `config`, signed with `authority`.
fn order_op(
    authority: &SecretKey,
    config: &Configuration,
    action: &Action,
) -> Result<Op, ClientError> {
    let order = Order {
        epoch: config.epoch,
        action: action.clone(),
    };
    let signed =
        Signed::sign(authority, order).map_err(|e| ClientError::Protocol(e.to_string()))?;
    Ok(Op::Order(signed.to_unverified()))
}

/// The configuration service's operations, re-exported for the command line.
pub use cs::{Action as ConfigAction, Outcome as ConfigOutcome};
