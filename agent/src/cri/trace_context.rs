//! W3C trace context on CRI calls: the recording layer names the span it will record a
//! call as, and the client sends it as the call's `traceparent` metadata, so a runtime
//! with tracing on (containerd's OTLP processor) makes its own spans children of it.

tokio::task_local! {
    /// The `traceparent` of the CRI call being made on this task, if it has one.
    static TRACEPARENT: Option<String>;
}

/// Runs `fut` (one CRI call) with `traceparent` as its trace context.
pub async fn with_traceparent<F: Future>(traceparent: Option<String>, fut: F) -> F::Output {
    TRACEPARENT.scope(traceparent, fut).await
}

/// The `traceparent` of the CRI call being made on this task, if any.
pub fn current() -> Option<String> {
    TRACEPARENT.try_with(Clone::clone).ok().flatten()
}

/// Adds the current call's `traceparent`, if any, to an outgoing request.
pub fn inject<T>(request: &mut tonic::Request<T>) {
    let Some(tp) = current() else {
        return;
    };
    if let Ok(value) = tp.parse() {
        request.metadata_mut().insert("traceparent", value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_made_inside_a_calls_scope_carries_its_traceparent() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string();
        let sent = with_traceparent(Some(tp.clone()), async {
            let mut r = tonic::Request::new(());
            inject(&mut r);
            r.metadata().get("traceparent").cloned()
        })
        .await;
        assert_eq!(sent.unwrap().to_str().unwrap(), tp);
        // Outside any call, and for a call of no pod, nothing is added.
        let mut r = tonic::Request::new(());
        inject(&mut r);
        assert!(r.metadata().get("traceparent").is_none());
        let none = with_traceparent(None, async {
            let mut r = tonic::Request::new(());
            inject(&mut r);
            r.metadata().get("traceparent").is_none()
        })
        .await;
        assert!(none);
    }
}
