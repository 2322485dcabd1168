use thiserror::Error;

#[derive(Debug, Error)]
pub enum OtelError {
    #[error("--otlp-endpoint {endpoint:?}: {problem}")]
    Endpoint { endpoint: String, problem: String },
    #[error("--runtime-otlp-listen {addr:?}: {problem}")]
    Listen { addr: String, problem: String },
    #[error("OTEL_EXPORTER_OTLP_CERTIFICATE {path}: {problem}")]
    Certificate { path: String, problem: String },
    #[error("the OTLP exporter for {endpoint}: {source}")]
    Build {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}
