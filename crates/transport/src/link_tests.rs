//! Links, routing and inbound connections over real loopback TLS.

use super::*;
use bulwark_core::envelope::{EnvelopeError, Header, Kind, frame_raw};
use bulwark_core::{ClientId, Epoch, GroupId, NodeId, ServiceId};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

/// Generous bound on anything a test waits for: a loaded 2-core machine must not fail a test,
/// and a broken link must fail it rather than hang it.
const PATIENCE: Duration = Duration::from_secs(30);

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("test timed out")
}

/// Waits for a condition nothing signals (a dial that failed, a counter), checking it often.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn header(kind: Kind, op: u64) -> Header {
    Header {
        kind,
        ..Header::request(ServiceId(3), GroupId(1), Epoch(0), op)
    }
}

fn request(op: u64, body: &[u8]) -> Bytes {
    frame_raw(&header(Kind::Request, op), body)
}

/// A port held (bound, not listening) so a dial is refused until [`Port::listen`]; it can be
/// listened on again after a listener on it is dropped.
struct Port(SocketAddr);

impl Port {
    fn socket(address: SocketAddr) -> TcpSocket {
        let socket = TcpSocket::new_v4().unwrap();
        // Lets a restarted server bind while the old connections sit in TIME_WAIT.
        socket.set_reuseaddr(true).unwrap();
        socket.bind(address).unwrap();
        socket
    }

    fn reserve() -> (Port, TcpSocket) {
        let socket = Port::socket("127.0.0.1:0".parse().unwrap());
        (Port(socket.local_addr().unwrap()), socket)
    }

    fn listen(&self, socket: Option<TcpSocket>) -> TcpListener {
        socket
            .unwrap_or_else(|| Port::socket(self.0))
            .listen(128)
            .unwrap()
    }
}

/// What a test server saw.
struct Seen {
    incoming: mpsc::Receiver<Incoming>,
    malformed: mpsc::UnboundedReceiver<(Peer, EnvelopeError)>,
    ended: mpsc::UnboundedReceiver<Result<Ended, InboundError>>,
}

#[derive(Clone)]
struct Recorder {
    incoming: mpsc::Sender<Incoming>,
    malformed: mpsc::UnboundedSender<(Peer, EnvelopeError)>,
}

impl Handler for Recorder {
    async fn handle(&self, incoming: Incoming) -> bool {
        self.incoming.send(incoming).await.is_ok()
    }

    fn malformed(&self, from: Peer, error: &EnvelopeError) {
        let _ = self.malformed.send((from, error.clone()));
    }
}

/// Serves `listener` until the returned task is aborted, which also drops every connection.
fn serve(listener: TcpListener, inbound: Arc<Inbound>) -> (JoinHandle<()>, Seen) {
    let (incoming, incoming_rx) = mpsc::channel(1024);
    let (malformed, malformed_rx) = mpsc::unbounded_channel();
    let (ended, ended_rx) = mpsc::unbounded_channel();
    let recorder = Recorder {
        incoming,
        malformed,
    };
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (inbound, recorder, ended) = (inbound.clone(), recorder.clone(), ended.clone());
            connections.spawn(async move {
                let _ = ended.send(inbound.serve(tcp, recorder).await);
            });
        }
    });
    let seen = Seen {
        incoming: incoming_rx,
        malformed: malformed_rx,
        ended: ended_rx,
    };
    (task, seen)
}

/// The server node, a client and another node, with the server's table naming both.
struct Cast {
    server: Identity,
    client: Identity,
    peer_node: Identity,
}

const SERVER: NodeId = NodeId(1);
const CLIENT: ClientId = ClientId(4);
const PEER_NODE: NodeId = NodeId(2);

impl Cast {
    fn new() -> Cast {
        Cast {
            server: Identity::generate("server").unwrap(),
            client: Identity::generate("client").unwrap(),
            peer_node: Identity::generate("peer node").unwrap(),
        }
    }

    fn inbound(&self) -> Inbound {
        let table = HashMap::from([
            (self.client.fingerprint(), Peer::Client(CLIENT)),
            (self.peer_node.fingerprint(), Peer::Node(PEER_NODE)),
        ]);
        Inbound::new(&self.server, table).unwrap()
    }

    fn link(&self, from: &Identity, address: SocketAddr, router: Router) -> Link {
        let connector = Arc::new(Connector::new(from).unwrap());
        Link::spawn(
            SERVER,
            address,
            self.server.fingerprint(),
            connector,
            router,
        )
    }
}

async fn next(seen: &mut Seen) -> Incoming {
    within(seen.incoming.recv()).await.expect("server gone")
}

#[tokio::test]
async fn requests_arrive_tagged_and_replies_route_by_op() {
    let cast = Cast::new();
    let (port, socket) = Port::reserve();
    let (server, mut seen) = serve(port.listen(Some(socket)), Arc::new(cast.inbound()));
    let router = Router::new();
    let link = cast.link(&cast.client, port.0, router.clone());
    let (replies_to_7, mut op7) = mpsc::channel(8);
    let _registration = router.register(7, replies_to_7).unwrap();

    // Op 8 is nobody's; its reply comes back first on the same connection, so by the time op 7's
    // second answer is routed, op 8's has been dropped.
    for (op, body) in [(8, &b"stray"[..]), (7, b"hello"), (7, b"again")] {
        link.send(request(op, body)).unwrap();
    }
    for (op, body) in [(8, &b"stray"[..]), (7, b"hello"), (7, b"again")] {
        let incoming = next(&mut seen).await;
        assert_eq!(incoming.from, Peer::Client(CLIENT));
        assert_eq!(incoming.envelope.header, header(Kind::Request, op));
        assert_eq!(&incoming.envelope.body[..], body);
        let answer = if body == b"again" {
            incoming.envelope.header.refused()
        } else {
            incoming.envelope.header.reply()
        };
        incoming
            .replies
            .send(frame_raw(&answer, &incoming.envelope.body))
            .unwrap();
    }
    for (kind, body) in [(Kind::Reply, &b"hello"[..]), (Kind::Refused, b"again")] {
        let (from, envelope) = within(op7.recv()).await.unwrap();
        assert_eq!(from, SERVER, "replies are tagged with the link's node");
        assert_eq!(envelope.header, header(kind, 7));
        assert_eq!(&envelope.body[..], body);
    }
    eventually("the router's counts", || {
        let stats = router.stats();
        (stats.delivered, stats.unknown_op) == (2, 1)
    })
    .await;
    assert!(link.connected());
    assert_eq!(link.last_error(), None);
    eventually("the sends to be counted", || link.stats().frames_sent == 3).await;
    server.abort();
}

#[tokio::test]
async fn frames_sent_before_the_server_listens_go_out_in_order_once_it_does() {
    let cast = Cast::new();
    let (port, socket) = Port::reserve();
    let link = cast.link(&cast.client, port.0, Router::new());
    // The node is not up, as when a command starts with the cluster: nothing may be dropped.
    let ops = 0..200u64;
    for op in ops.clone() {
        link.send(request(op, &op.to_be_bytes())).unwrap();
    }
    eventually("a refused dial", || link.last_error().is_some()).await;
    assert!(!link.connected());
    assert!(link.stats().queued_bytes > 0);

    let (server, mut seen) = serve(port.listen(Some(socket)), Arc::new(cast.inbound()));
    for op in ops {
        let incoming = next(&mut seen).await;
        assert_eq!(incoming.envelope.header.op, op, "in the order sent");
        assert_eq!(&incoming.envelope.body[..], &op.to_be_bytes());
    }
    within(link.wait_connected()).await;
    let stats = link.stats();
    assert_eq!((stats.connects, stats.queue_full), (1, 0), "{stats:?}");
    server.abort();
}

#[tokio::test]
async fn a_link_reconnects_after_the_server_restarts() {
    let cast = Cast::new();
    let (port, socket) = Port::reserve();
    let (server, mut seen) = serve(port.listen(Some(socket)), Arc::new(cast.inbound()));
    let router = Router::new();
    let link = cast.link(&cast.peer_node, port.0, router.clone());
    let (sender, mut replies) = mpsc::channel(8);
    let _registration = router.register(1, sender).unwrap();

    link.send(request(1, b"before")).unwrap();
    let incoming = next(&mut seen).await;
    assert_eq!(incoming.from, Peer::Node(PEER_NODE));
    drop(incoming);

    // Stopping the server closes its connections; the link notices on its next read.
    server.abort();
    let _ = server.await;
    eventually("the link to notice", || !link.connected()).await;
    link.send(request(1, b"while down")).unwrap();

    let (server, mut seen) = serve(port.listen(None), Arc::new(cast.inbound()));
    let incoming = next(&mut seen).await;
    assert_eq!(&incoming.envelope.body[..], b"while down");
    incoming
        .replies
        .send(frame_raw(&incoming.envelope.header.reply(), b"back"))
        .unwrap();
    let (from, envelope) = within(replies.recv()).await.unwrap();
    assert_eq!((from, &envelope.body[..]), (SERVER, &b"back"[..]));
    assert_eq!(link.stats().connects, 2);
    assert!(link.last_error().is_some(), "the outage is remembered");
    server.abort();
}

#[tokio::test]
async fn nodes_and_clients_are_told_apart_and_strangers_refused() {
    let cast = Cast::new();
    let (port, socket) = Port::reserve();
    let inbound = Arc::new(cast.inbound());
    let (server, mut seen) = serve(port.listen(Some(socket)), inbound.clone());

    let client = cast.link(&cast.client, port.0, Router::new());
    client.send(request(1, b"from the client")).unwrap();
    let incoming = next(&mut seen).await;
    assert_eq!(incoming.from, Peer::Client(CLIENT));
    assert_eq!(&incoming.envelope.body[..], b"from the client");

    let node = cast.link(&cast.peer_node, port.0, Router::new());
    node.send(request(1, b"from the node")).unwrap();
    let incoming = next(&mut seen).await;
    assert_eq!(incoming.from, Peer::Node(PEER_NODE));
    assert_eq!(&incoming.envelope.body[..], b"from the node");

    let stranger = Identity::generate("stranger").unwrap();
    let stranger = cast.link(&stranger, port.0, Router::new());
    stranger.send(request(1, b"let me in")).unwrap();
    let refused = within(seen.ended.recv()).await.unwrap();
    assert!(
        matches!(
            refused,
            Err(InboundError::Handshake(TransportError::Tls(_)))
        ),
        "{refused:?}"
    );
    let stats = inbound.stats();
    assert!(stats.unknown_peers >= 1, "{stats:?}");
    assert!(stats.handshakes_failed >= 1, "{stats:?}");
    assert_eq!(stats.accepted, 2, "{stats:?}");
    // The stranger learns of the refusal on its first read and keeps the error to report.
    eventually("the stranger's error", || stranger.last_error().is_some()).await;
    assert!(
        seen.incoming.try_recv().is_err(),
        "nothing of the stranger's is handled"
    );
    server.abort();
}

#[tokio::test]
async fn a_node_takes_requests_and_replies_on_the_connection_it_dialled() {
    let cast = Cast::new();
    let (port, socket) = Port::reserve();
    let (server, mut seen) = serve(port.listen(Some(socket)), Arc::new(cast.inbound()));
    let (requests, mut dispatcher) = mpsc::channel(8);
    let router = Router::with_requests(requests);
    let link = cast.link(&cast.peer_node, port.0, router.clone());
    let (sender, mut replies) = mpsc::channel(8);
    let _registration = router.register(5, sender).unwrap();

    link.send(request(5, b"prepare")).unwrap();
    let incoming = next(&mut seen).await;
    assert_eq!(incoming.from, Peer::Node(PEER_NODE));
    // The accepting node answers, and asks something of its own, on the same connection; its
    // request reuses op 5 to show that a request never reaches the dialler's op registrations.
    let header = incoming.envelope.header;
    incoming
        .replies
        .send(frame_raw(&header.reply(), b"prepared"))
        .unwrap();
    incoming.replies.send(request(5, b"state?")).unwrap();

    let (from, reply) = within(replies.recv()).await.unwrap();
    assert_eq!((from, &reply.body[..]), (SERVER, &b"prepared"[..]));
    let (from, asked) = within(dispatcher.recv()).await.unwrap();
    assert_eq!((from, asked.header), (SERVER, header));
    assert_eq!(&asked.body[..], b"state?");
    assert!(replies.try_recv().is_err());
    server.abort();
}

#[tokio::test]
async fn malformed_headers_are_counted_and_survived_until_there_are_too_many() {
    let cast = Cast::new();
    let (port, socket) = Port::reserve();
    let inbound = cast.inbound().with_limits(InboundLimits {
        malformed_max: 2,
        ..InboundLimits::default()
    });
    let inbound = Arc::new(inbound);
    let (server, mut seen) = serve(port.listen(Some(socket)), inbound.clone());
    let router = Router::new();
    let link = cast.link(&cast.client, port.0, router.clone());
    let (sender, mut replies) = mpsc::channel(8);
    let _registration = router.register(9, sender).unwrap();

    let mut bad_version = request(9, b"").to_vec();
    bad_version[0] = 0xff;
    link.send(Bytes::from_static(b"short")).unwrap();
    link.send(Bytes::from(bad_version)).unwrap();
    link.send(request(9, b"fine")).unwrap();
    let incoming = next(&mut seen).await;
    assert_eq!(&incoming.envelope.body[..], b"fine");
    for expected in [
        EnvelopeError::Short { len: 5 },
        EnvelopeError::Version { found: 0xff },
    ] {
        let (from, error) = within(seen.malformed.recv()).await.unwrap();
        assert_eq!((from, error), (Peer::Client(CLIENT), expected));
    }
    assert_eq!(inbound.stats().malformed, 2);

    // The link survives a node's junk the same way.
    incoming.replies.send(Bytes::from_static(b"junk")).unwrap();
    incoming
        .replies
        .send(frame_raw(&incoming.envelope.header.reply(), b"ok"))
        .unwrap();
    let (_, reply) = within(replies.recv()).await.unwrap();
    assert_eq!(&reply.body[..], b"ok");
    assert_eq!(link.stats().malformed, 1);
    drop(incoming);

    // One more is one too many: the node closes the connection, and the link dials again.
    link.send(Bytes::from_static(b"x")).unwrap();
    let ended = within(seen.ended.recv()).await.unwrap().unwrap();
    assert_eq!(
        ended,
        Ended {
            peer: Peer::Client(CLIENT),
            reason: EndReason::Malformed(3)
        }
    );
    // Sent before the link noticed, a frame would go into the dead connection.
    eventually("the second connection", || link.stats().connects == 2).await;
    link.send(request(9, b"after")).unwrap();
    let incoming = next(&mut seen).await;
    assert_eq!(&incoming.envelope.body[..], b"after");
    server.abort();
}

#[tokio::test]
async fn a_full_queue_refuses_and_counts_and_oversized_frames_are_never_queued() {
    let cast = Cast::new();
    // Nobody listens: everything sent stays queued.
    let (port, _held) = Port::reserve();
    let connector = Connector::new(&cast.client)
        .unwrap()
        .with_max_frame_bytes(1000);
    let limits = LinkLimits {
        queued_bytes_max: 4096,
        ..LinkLimits::default()
    };
    let link = Link::spawn_with(
        SERVER,
        port.0,
        cast.server.fingerprint(),
        Arc::new(connector),
        Router::new(),
        limits,
    );
    assert_eq!(
        link.send(Bytes::from(vec![0; 1001])),
        Err(SendError::TooLarge {
            len: 1001,
            max: 1000
        })
    );
    let mut accepted = 0;
    while link.send(request(accepted, &[0; 900])).is_ok() {
        accepted += 1;
        assert!(accepted < 100, "the queue is bounded");
    }
    assert_eq!(accepted, 4);
    let stats = link.stats();
    assert_eq!(stats.queue_full, 1, "{stats:?}");
    assert!(stats.queued_bytes <= 4096, "{stats:?}");
}

#[tokio::test]
async fn a_member_admitted_after_start_is_served_and_keeps_the_peer_it_was_admitted_as() {
    let cast = Cast::new();
    let newcomer = Identity::generate("newcomer").unwrap();
    const NEWCOMER: NodeId = NodeId(9);
    let (port, socket) = Port::reserve();
    let inbound = Arc::new(cast.inbound());
    let (server, mut seen) = serve(port.listen(Some(socket)), inbound.clone());

    // Not yet certified: its handshake is refused and nothing reaches the handler.
    let early = cast.link(&newcomer, port.0, Router::new());
    early.send(request(1, b"too early")).unwrap();
    eventually("the refused handshake to be counted", || {
        inbound.stats().unknown_peers > 0
    })
    .await;
    assert!(!early.connected());
    drop(early);

    inbound.admit(newcomer.fingerprint(), Peer::Node(NEWCOMER));
    // A second admission of the same certificate under another name changes nothing.
    inbound.admit(newcomer.fingerprint(), Peer::Client(CLIENT));
    let link = cast.link(&newcomer, port.0, Router::new());
    link.send(request(2, b"admitted")).unwrap();
    let incoming = next(&mut seen).await;
    assert_eq!(incoming.from, Peer::Node(NEWCOMER));
    assert_eq!(&incoming.envelope.body[..], b"admitted");
    server.abort();
}

#[tokio::test]
async fn a_link_dials_only_once_it_has_something_to_send() {
    let cast = Cast::new();
    let (port, socket) = Port::reserve();
    let listener = port.listen(Some(socket));
    let link = cast.link(&cast.client, port.0, Router::new());
    // Time enough for a dial: none comes, so a command refused before it sends leaves no trace.
    let early = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(early.is_err(), "dialled before any frame was queued");
    assert_eq!(link.stats().connects, 0);
    link.send(request(1, b"now")).unwrap();
    let (server, mut seen) = serve(listener, Arc::new(cast.inbound()));
    assert_eq!(&next(&mut seen).await.envelope.body[..], b"now");
    assert_eq!(link.stats().resent, 0, "a first connection resends nothing");
    server.abort();
}
