//! The agent's local API on any bytes a client could send over its socket: HTTP/1
//! parsing and routing. It must not panic or hang, and whatever it answers is an HTTP/1
//! response.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use podlapse::syncloop::{StatusStore, api};
use podlapse::timeline::Collector;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let state =
            api::ApiState::new(Arc::new(StatusStore::default()), Arc::new(Collector::new()));
        let serving = tokio::spawn(api::serve_connection(server, state));
        client
            .write_all(data)
            .await
            .expect("the request is written");
        client.shutdown().await.expect("the request ends");
        let mut response = Vec::new();
        // Bounded: a connection that neither answers nor closes is a hang, and a finding.
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.read_to_end(&mut response),
        )
        .await
        .expect("the API answers or closes the connection")
        .expect("the response is read");
        if !response.is_empty() {
            // HTTP/1.1, or 1.0 to a 1.0 client.
            assert!(response.starts_with(b"HTTP/1."), "not an HTTP/1 response");
        }
        serving.await.expect("the connection task does not panic");
    });
});
