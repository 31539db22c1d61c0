//! The pod side: a quinn server endpoint whose every connection ID names it (QUIC-LB).
//!
//! Usage: `quinn_peer pod LISTEN_ADDR CERT_DER KEY_DER POD_NAME SERVER_ID_HEX`
//!
//! It issues connection IDs of the plaintext layout of draft-ietf-quic-load-balancers, which the
//! router's `--quic-lb-server-id-bytes` reads: a first octet (config rotation 0b000 in its top
//! three bits, the connection ID's length minus one in its low five), the server ID (the router's:
//! the last bytes of the pod's address), a random nonce. The generator is the one docs/quic.md shows
//! a quinn pod (`EndpointConfig::cid_generator`; quinn 0.9 has the trait in `quinn_proto`). Each
//! bidirectional stream's request is answered `<POD_NAME>:<request>`, as the demo pods answer.
//! It prints `listening <port>` once bound, then serves until killed.

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;

use crate::{Failure, ALPN, MAX_ANSWER_BYTES};

/// Connection ID length: a first octet, the server ID, then at least 4 octets of nonce.
const CID_BYTES: usize = 12;

/// QUIC-LB connection IDs: first octet, server ID, random nonce.
struct QuicLbCids {
    server_id: Vec<u8>,
}

impl quinn_proto::ConnectionIdGenerator for QuicLbCids {
    fn generate_cid(&mut self) -> quinn_proto::ConnectionId {
        let mut cid = [0u8; CID_BYTES];
        let end = 1 + self.server_id.len();
        rand::thread_rng().fill_bytes(&mut cid[end..]); // the nonce
        cid[0] = (0b000 << 5) | (CID_BYTES as u8 - 1); // config rotation 0, the length self-encoded
        cid[1..end].copy_from_slice(&self.server_id); // the server ID
        quinn_proto::ConnectionId::new(&cid)
    }

    fn cid_len(&self) -> usize {
        CID_BYTES
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

fn hex(text: &str) -> Result<Vec<u8>, Failure> {
    if text.len() % 2 != 0 || text.len() / 2 + 5 > CID_BYTES {
        return Err(format!("SERVER_ID_HEX {text:?}: 1 to {} bytes in hex", CID_BYTES - 5).into());
    }
    (0..text.len()).step_by(2).map(|i| Ok(u8::from_str_radix(&text[i..i + 2], 16)?)).collect()
}

async fn answer(connection: quinn::Connection, pod: Arc<String>) {
    while let Ok((mut send, recv)) = connection.accept_bi().await {
        let pod = pod.clone();
        tokio::spawn(async move {
            if let Ok(request) = recv.read_to_end(MAX_ANSWER_BYTES).await {
                let mut reply = format!("{pod}:").into_bytes();
                reply.extend_from_slice(&request);
                if send.write_all(&reply).await.is_ok() {
                    let _ = send.finish().await;
                }
            }
        });
    }
}

pub async fn serve(args: &[String]) -> Result<(), Failure> {
    let [listen, cert, key, pod, server_id] = args else {
        return Err("usage: quinn_peer pod LISTEN_ADDR CERT_DER KEY_DER POD_NAME SERVER_ID_HEX".into());
    };
    let listen: SocketAddr = listen.parse()?;
    let server_id = hex(server_id)?;
    let certificate = rustls::Certificate(std::fs::read(cert)?);
    let private_key = rustls::PrivateKey(std::fs::read(key)?);
    let mut tls = rustls::ServerConfig::builder()
        .with_safe_defaults()
        .with_no_client_auth()
        .with_single_cert(vec![certificate], private_key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let server_config = quinn::ServerConfig::with_crypto(Arc::new(tls));
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config.cid_generator(move || Box::new(QuicLbCids { server_id: server_id.clone() }));
    let endpoint =
        quinn::Endpoint::new(endpoint_config, Some(server_config), UdpSocket::bind(listen)?, quinn::TokioRuntime)?;
    println!("listening {}", endpoint.local_addr()?.port());
    std::io::stdout().flush()?;
    let pod = Arc::new(pod.clone());
    while let Some(connecting) = endpoint.accept().await {
        let pod = pod.clone();
        tokio::spawn(async move {
            if let Ok(connection) = connecting.await {
                answer(connection, pod).await;
            }
        });
    }
    Ok(())
}
