//! A quinn client endpoint for the QUIC edge's tests: one UDP socket, several connections.
//!
//! Usage: `quinn_peer ROUTER_ADDR CA_DER [--at-once] [--rebinds N] SNI...`
//!
//! It opens one connection per SNI from ONE `quinn::Endpoint` (in the order given; each handshake
//! done before the next starts, or all at once with `--at-once`), asks each pod "who are you" on
//! a bidirectional stream (the demo pods answer `<pod>:<payload>`), rebinds the endpoint to a new
//! local port (`Endpoint::rebind`, as a NAT rebinding looks to the router), and asks again on every
//! connection. Each answer is printed as `<phase> <sni> <answer>`; the local port before and after
//! the rebind as `port <phase> <port>`. With `--rebinds N` (N > 1) it rebinds N times, asking on every
//! connection after each: phases `after`, `after-2` ... `after-N`. Exit status 0 only if every
//! exchange worked.
//!
//! `quinn_peer pod ...` is a pod instead, whose connection IDs name it (QUIC-LB): see `pod.rs`.

mod pod;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

const ALPN: &[u8] = b"stargate-whoami";
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_ANSWER_BYTES: usize = 64 * 1024;

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn client_config(ca_der: &[u8]) -> Result<quinn::ClientConfig, Failure> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(&rustls::Certificate(ca_der.to_vec()))?;
    let mut tls = rustls::ClientConfig::builder()
        .with_safe_defaults()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(quinn::ClientConfig::new(Arc::new(tls)))
}

async fn ask(connection: &quinn::Connection, payload: &[u8]) -> Result<String, Failure> {
    let (mut send, recv) = connection.open_bi().await?;
    send.write_all(payload).await?;
    send.finish().await?;
    let answer = recv.read_to_end(MAX_ANSWER_BYTES).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

async fn within<T>(what: &str, step: impl std::future::Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
    match tokio::time::timeout(STEP_TIMEOUT, step).await {
        Ok(result) => result,
        Err(_) => Err(format!("{what}: no answer within {STEP_TIMEOUT:?}").into()),
    }
}

async fn exchange_all(phase: &str, names: &[String], connections: &[quinn::Connection]) -> Result<(), Failure> {
    for (name, connection) in names.iter().zip(connections) {
        let payload = format!("{phase}-{name}");
        let answer = within(&format!("{phase} {name}"), ask(connection, payload.as_bytes())).await?;
        println!("{phase} {name} {answer}");
    }
    Ok(())
}

async fn run(
    router: SocketAddr, ca_der: Vec<u8>, at_once: bool, rebinds: usize, names: Vec<String>,
) -> Result<(), Failure> {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(client_config(&ca_der)?);
    println!("port before {}", endpoint.local_addr()?.port());
    let mut connections = Vec::new();
    if at_once {
        let connecting: Vec<_> = names.iter().map(|name| endpoint.connect(router, name)).collect::<Result<_, _>>()?;
        for (name, attempt) in names.iter().zip(connecting) {
            connections.push(within(&format!("handshake {name}"), async { Ok(attempt.await?) }).await?);
        }
    } else {
        for name in &names {
            let attempt = endpoint.connect(router, name)?;
            connections.push(within(&format!("handshake {name}"), async { Ok(attempt.await?) }).await?);
        }
    }
    exchange_all("before", &names, &connections).await?;
    for round in 1..=rebinds {
        let phase = if round == 1 { "after".to_string() } else { format!("after-{round}") };
        endpoint.rebind(UdpSocket::bind("127.0.0.1:0")?)?;
        println!("port {phase} {}", endpoint.local_addr()?.port());
        exchange_all(&phase, &names, &connections).await?;
    }
    for connection in &connections {
        connection.close(0u32.into(), b"done");
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("pod") {
        if let Err(error) = pod::serve(&args[1..]).await {
            eprintln!("quinn_peer pod: {error}");
            std::process::exit(1);
        }
        return;
    }
    let at_once = args.iter().any(|a| a == "--at-once");
    args.retain(|a| a != "--at-once");
    let mut rebinds = 1;
    if let Some(at) = args.iter().position(|a| a == "--rebinds") {
        match args.get(at + 1).and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n >= 1 => rebinds = n,
            _ => {
                eprintln!("--rebinds needs a count of at least 1");
                std::process::exit(2);
            }
        }
        args.drain(at..at + 2);
    }
    if args.len() < 3 {
        eprintln!("usage: quinn_peer ROUTER_ADDR CA_DER [--at-once] [--rebinds N] SNI...");
        std::process::exit(2);
    }
    let router: SocketAddr = match args[0].parse() {
        Ok(address) => address,
        Err(error) => {
            eprintln!("ROUTER_ADDR {:?}: {error}", args[0]);
            std::process::exit(2);
        }
    };
    let ca_der = match std::fs::read(&args[1]) {
        Ok(bytes) => bytes,
        Err(error) => {
            eprintln!("CA_DER {:?}: {error}", args[1]);
            std::process::exit(2);
        }
    };
    if let Err(error) = run(router, ca_der, at_once, rebinds, args[2..].to_vec()).await {
        eprintln!("quinn_peer: {error}");
        std::process::exit(1);
    }
}
