//! A collector for the unit tests: the OpenTelemetry project's generated trace service on
//! a loopback port, keeping every span it is sent with its resource's service name, and
//! an export queue pointed at it.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;

use super::ExportQueue;

/// Every span received, with its sender's `service.name`.
#[derive(Default, Clone)]
pub struct Collected(Arc<Mutex<Vec<(String, Span)>>>);

impl Collected {
    pub fn spans(&self) -> Vec<(String, Span)> {
        self.0.lock().unwrap().clone()
    }

    /// (service, span name) of each span received.
    pub fn names(&self) -> Vec<(String, String)> {
        self.spans()
            .into_iter()
            .map(|(service, s)| (service, s.name))
            .collect()
    }
}

#[tonic::async_trait]
impl TraceService for Collected {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in request.into_inner().resource_spans {
            let attrs = super::runtime_span::attributes(
                rs.resource.as_ref().map_or(&[][..], |r| &r.attributes),
            );
            let service = attrs
                .get("service.name")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    self.0.lock().unwrap().push((service.clone(), s));
                }
            }
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

/// The collector, its server's task, and a queue exporting to it as node `node-1`.
pub async fn start() -> (Collected, tokio::task::JoinHandle<()>, ExportQueue) {
    let collected = Collected::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = futures::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(s, _)| s), l))
    });
    let service = TraceServiceServer::new(collected.clone());
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    let endpoint = format!("http://{addr}");
    let queue = ExportQueue::start(
        super::exporter(&endpoint, "node-1").unwrap(),
        endpoint,
        super::ExportStats::default(),
        super::resource("node-1"),
    );
    (collected, server, queue)
}
