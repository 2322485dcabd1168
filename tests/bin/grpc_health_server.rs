//! A gRPC health server for the lab's probe tests: serves `grpc.health.v1.Health` on the
//! port given as its only argument, for the overall server ("") and the service
//! `podlapse`, both SERVING. SIGUSR1 switches both to NOT_SERVING, SIGUSR2 back to
//! SERVING, so a test can flip a running container's health from outside.

use std::net::{Ipv4Addr, SocketAddr};

use tokio::signal::unix::{SignalKind, signal};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

const SERVICES: [&str; 2] = ["", "podlapse"];

async fn set_all(reporter: &HealthReporter, status: ServingStatus) {
    for service in SERVICES {
        reporter.set_service_status(service, status).await;
    }
    eprintln!("grpc-health-server: {status:?}");
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::args()
        .nth(1)
        .ok_or("usage: grpc-health-server PORT")?
        .parse()
        .map_err(|e| format!("PORT: {e}"))?;
    let (reporter, service) = tonic_health::server::health_reporter();
    set_all(&reporter, ServingStatus::Serving).await;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    let mut term = signal(SignalKind::terminate())?;
    let flips = reporter.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = usr1.recv() => set_all(&flips, ServingStatus::NotServing).await,
                _ = usr2.recv() => set_all(&flips, ServingStatus::Serving).await,
            }
        }
    });
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    eprintln!("grpc-health-server: serving on {addr}");
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_shutdown(addr, async move {
            term.recv().await;
        })
        .await?;
    Ok(())
}
