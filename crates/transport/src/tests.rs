use super::*;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use std::io::ErrorKind;
use std::net::SocketAddr;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Generous bound on anything a test waits for, so a broken limit fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    (listener, address)
}

/// Accepts one TCP connection on a fresh port and runs the TLS handshake on it.
async fn serve_once(
    acceptor: Acceptor,
) -> (
    SocketAddr,
    JoinHandle<Result<(Fingerprint, FramedStream), TransportError>>,
) {
    let (listener, address) = listener().await;
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        acceptor.accept(tcp).await
    });
    (address, task)
}

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("test timed out")
}

/// A certificate that is not backed by its own key: `cert_of`'s certificate, `key_of`'s key.
fn forged(cert_of: &Identity, key_of: &Identity) -> Arc<CertifiedKey> {
    Arc::new(CertifiedKey::new(
        cert_of.certified().cert.clone(),
        key_of.certified().key.clone(),
    ))
}

fn reload(identity: &Identity) -> Identity {
    let (cert, key) = identity.to_pem();
    Identity::from_pem(&cert, &key).unwrap()
}

#[tokio::test]
async fn frames_round_trip_between_pinned_identities() {
    // Identities go through PEM as they do through the configuration files.
    let node = reload(&Identity::generate("node").unwrap());
    let alice = reload(&Identity::generate("alice").unwrap());
    let bob = reload(&Identity::generate("bob").unwrap());
    let acceptor = Acceptor::new(&node, vec![alice.fingerprint(), bob.fingerprint()]).unwrap();
    let (listener, address) = listener().await;
    let server = tokio::spawn(async move {
        let mut peers = Vec::new();
        for _ in 0..2 {
            let (tcp, _) = listener.accept().await.unwrap();
            let (peer, mut framed) = acceptor.accept(tcp).await.unwrap();
            // Echo every frame, prefixed with how many bytes it had, until the client closes.
            while let Some(frame) = framed.next().await {
                let frame = frame.unwrap();
                let mut reply = (frame.len() as u64).to_be_bytes().to_vec();
                reply.extend_from_slice(&frame);
                framed.send(Bytes::from(reply)).await.unwrap();
            }
            peers.push(peer);
        }
        peers
    });

    for client in [&alice, &bob] {
        let connector = Connector::new(client).unwrap();
        let mut framed = within(connector.connect(address, node.fingerprint()))
            .await
            .unwrap();
        let frames = [
            Bytes::from_static(b"ping"),
            Bytes::new(),
            Bytes::from(vec![0xa5; 300_000]),
        ];
        for frame in &frames {
            framed.send(frame.clone()).await.unwrap();
        }
        for frame in &frames {
            let reply = within(framed.next()).await.unwrap().unwrap();
            assert_eq!(reply[..8], (frame.len() as u64).to_be_bytes());
            assert_eq!(&reply[8..], &frame[..]);
        }
        SinkExt::<Bytes>::close(&mut framed).await.unwrap();
    }
    assert_eq!(
        within(server).await.unwrap(),
        vec![alice.fingerprint(), bob.fingerprint()],
        "the node learns which client it talks to"
    );
}

#[tokio::test]
async fn a_frame_of_exactly_the_limit_passes() {
    let node = Identity::generate("node").unwrap();
    let client = Identity::generate("client").unwrap();
    let acceptor = Acceptor::new(&node, vec![client.fingerprint()]).unwrap();
    let (address, server) = serve_once(acceptor).await;
    let connector = Connector::new(&client).unwrap();
    let mut framed = within(connector.connect(address, node.fingerprint()))
        .await
        .unwrap();
    // The sender refuses to encode a frame over the limit.
    let error = framed
        .send(Bytes::from(vec![1; FRAME_BYTES_MAX + 1]))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
    // A frame this large outgrows the socket buffers: the node must read while the client sends.
    let (_, mut served) = within(server).await.unwrap().unwrap();
    let receive = tokio::spawn(async move { within(served.next()).await.unwrap().unwrap() });
    within(framed.send(Bytes::from(vec![7; FRAME_BYTES_MAX])))
        .await
        .unwrap();
    let frame = within(receive).await.unwrap();
    assert_eq!(frame.len(), FRAME_BYTES_MAX);
    assert!(frame.iter().all(|&b| b == 7));
}

#[tokio::test]
async fn a_client_refuses_a_node_with_another_certificate() {
    let impostor = Identity::generate("impostor").unwrap();
    let expected = Identity::generate("node").unwrap();
    let client = Identity::generate("client").unwrap();
    let acceptor = Acceptor::new(&impostor, vec![client.fingerprint()]).unwrap();
    let (address, server) = serve_once(acceptor).await;
    let connector = Connector::new(&client).unwrap();
    let result = within(connector.connect(address, expected.fingerprint())).await;
    assert!(
        matches!(result, Err(TransportError::Tls(_))),
        "{:?}",
        result.map(|_| ())
    );
    assert!(within(server).await.unwrap().is_err());
}

#[tokio::test]
async fn a_client_refuses_a_node_presenting_the_pinned_certificate_without_its_key() {
    let node = Identity::generate("node").unwrap();
    let impostor = Identity::generate("impostor").unwrap();
    let client = Identity::generate("client").unwrap();
    let acceptor =
        Acceptor::from_certified(forged(&node, &impostor), vec![client.fingerprint()]).unwrap();
    let (address, _server) = serve_once(acceptor).await;
    let connector = Connector::new(&client).unwrap();
    let result = within(connector.connect(address, node.fingerprint())).await;
    assert!(
        matches!(result, Err(TransportError::Tls(_))),
        "{:?}",
        result.map(|_| ())
    );
}

/// Runs `connector` against a node listing only `listed`; returns what the node's accept said.
async fn node_verdict(
    connect: impl AsyncFnOnce(SocketAddr, Fingerprint) -> Option<FramedStream>,
    listed: Vec<Fingerprint>,
) -> Result<Fingerprint, TransportError> {
    let node = Identity::generate("node").unwrap();
    let acceptor = Acceptor::new(&node, listed).unwrap();
    let (address, server) = serve_once(acceptor).await;
    // TLS 1.3: the client may believe the handshake done before the node has judged it.
    if let Some(mut framed) = within(connect(address, node.fingerprint())).await {
        let _ = framed.send(Bytes::from_static(b"x")).await;
        let answer = within(framed.next()).await;
        assert!(
            !matches!(answer, Some(Ok(_))),
            "a refused client got an answer"
        );
    }
    within(server).await.unwrap().map(|(peer, _)| peer)
}

#[tokio::test]
async fn a_node_refuses_an_unlisted_client() {
    let listed = Identity::generate("listed").unwrap();
    let stranger = Identity::generate("stranger").unwrap();
    let verdict = node_verdict(
        async |address, expect| {
            Connector::new(&stranger)
                .unwrap()
                .connect(address, expect)
                .await
                .ok()
        },
        vec![listed.fingerprint()],
    )
    .await;
    assert!(
        matches!(verdict, Err(TransportError::Tls(_))),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn a_node_refuses_a_client_without_a_certificate() {
    let listed = Identity::generate("listed").unwrap();
    let verdict = node_verdict(
        async |address, expect| {
            let provider = provider();
            let verifier = pin::PinnedNode {
                expected: expect,
                algorithms: provider.signature_verification_algorithms,
            };
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth();
            let tcp = TcpStream::connect(address).await.unwrap();
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
                .await
                .ok()?;
            Some(Framed::new(
                tokio_rustls::TlsStream::Client(tls),
                frame_codec(FRAME_BYTES_MAX),
            ))
        },
        vec![listed.fingerprint()],
    )
    .await;
    assert!(
        matches!(
            verdict,
            Err(TransportError::Tls(rustls::Error::NoCertificatesPresented))
        ),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn a_node_refuses_a_listed_certificate_without_its_key() {
    let listed = Identity::generate("listed").unwrap();
    let thief = Identity::generate("thief").unwrap();
    let verdict = node_verdict(
        async |address, expect| {
            let mut connector = Connector::new(&thief).unwrap();
            connector.certified = forged(&listed, &thief);
            connector.connect(address, expect).await.ok()
        },
        vec![listed.fingerprint()],
    )
    .await;
    assert!(
        matches!(verdict, Err(TransportError::Tls(_))),
        "{verdict:?}"
    );
}

/// Sends a bare length prefix claiming `claimed` bytes and returns what the node reads.
async fn claim(
    acceptor: Acceptor,
    client: &Identity,
    node: &Identity,
    claimed: u32,
) -> Option<std::io::Result<bytes::BytesMut>> {
    let (address, server) = serve_once(acceptor).await;
    let reader = tokio::spawn(async move {
        let (_, mut framed) = server.await.unwrap().unwrap();
        framed.next().await
    });
    let connector = Connector::new(client).unwrap();
    let mut framed = within(connector.connect(address, node.fingerprint()))
        .await
        .unwrap();
    framed
        .get_mut()
        .write_all(&claimed.to_be_bytes())
        .await
        .unwrap();
    framed.get_mut().flush().await.unwrap();
    // The connection stays open: only the length check can end the read.
    let read = within(reader).await.unwrap();
    drop(framed);
    read
}

#[tokio::test]
async fn an_oversized_frame_is_an_error_not_an_allocation() {
    let node = Identity::generate("node").unwrap();
    let client = Identity::generate("client").unwrap();
    let acceptor = Acceptor::new(&node, vec![client.fingerprint()]).unwrap();
    let read = claim(acceptor, &client, &node, (FRAME_BYTES_MAX + 1) as u32).await;
    match read {
        Some(Err(error)) => assert_eq!(error.kind(), ErrorKind::InvalidData, "{error}"),
        other => panic!("expected a frame-size error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_frame_limit_is_configurable() {
    let node = Identity::generate("node").unwrap();
    let client = Identity::generate("client").unwrap();
    let acceptor = Acceptor::new(&node, vec![client.fingerprint()])
        .unwrap()
        .with_max_frame_bytes(16);
    let read = claim(acceptor, &client, &node, 17).await;
    assert!(matches!(read, Some(Err(_))), "{read:?}");
}

#[tokio::test]
async fn a_silent_client_cannot_hold_the_handshake() {
    let node = Identity::generate("node").unwrap();
    let acceptor = Acceptor::new(&node, vec![])
        .unwrap()
        .with_handshake_timeout(Duration::from_millis(200));
    let (address, server) = serve_once(acceptor).await;
    let _silent = TcpStream::connect(address).await.unwrap();
    let verdict = within(server).await.unwrap().map(|(peer, _)| peer);
    assert!(
        matches!(verdict, Err(TransportError::Timeout)),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn a_silent_node_cannot_hold_the_connect() {
    let node = Identity::generate("node").unwrap();
    let client = Identity::generate("client").unwrap();
    let (listener, address) = listener().await;
    let held = tokio::spawn(async move { listener.accept().await.unwrap() });
    let connector = Connector::new(&client)
        .unwrap()
        .with_handshake_timeout(Duration::from_millis(200));
    let result = within(connector.connect(address, node.fingerprint())).await;
    assert!(
        matches!(result, Err(TransportError::Timeout)),
        "{:?}",
        result.map(|_| ())
    );
    drop(held);
}

#[test]
fn identities_survive_pem() {
    let identity = Identity::generate("x").unwrap();
    let (cert, key) = identity.to_pem();
    assert!(cert.contains("BEGIN CERTIFICATE"));
    assert!(key.contains("PRIVATE KEY"));
    let back = Identity::from_pem(&cert, &key).unwrap();
    assert_eq!(back.fingerprint(), identity.fingerprint());
    assert_eq!(back.to_pem(), (cert.clone(), key.clone()));
    assert_eq!(
        back.fingerprint(),
        Fingerprint::of_certificate(back.cert_der())
    );
    assert_eq!(
        identity.fingerprint().to_string().parse::<Fingerprint>(),
        Ok(identity.fingerprint())
    );

    let other = Identity::generate("y").unwrap();
    assert_ne!(other.fingerprint(), identity.fingerprint());
    let (other_cert, other_key) = other.to_pem();
    assert!(Identity::from_pem("garbage", &key).is_err());
    assert!(Identity::from_pem(&cert, "garbage").is_err());
    assert!(
        Identity::from_pem(&key, &key).is_err(),
        "a key is no certificate"
    );
    assert!(
        Identity::from_pem(&cert, &other_key).is_err(),
        "a key that is not the certificate's"
    );
    assert!(Identity::from_pem(&other_cert, &other_key).is_ok());
    assert!(!format!("{identity:?}").contains("PRIVATE"));
}
