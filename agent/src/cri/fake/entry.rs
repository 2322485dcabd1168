//! How every call into the fake runtime begins: shown to the observer, logged, and failed
//! when an injected fault fires for it.

use std::sync::MutexGuard;

use super::{FakeCall, FakeRuntime, State};
use crate::cri::service::CriResult;

impl State {
    /// The name (from its config) of the container a call is for, if it is for one.
    fn container_name(&self, call: &FakeCall) -> Option<String> {
        let id = match call {
            FakeCall::CreateContainer { name, .. } => return Some(name.clone()),
            FakeCall::StartContainer { container_id }
            | FakeCall::StopContainer { container_id, .. }
            | FakeCall::RemoveContainer { container_id }
            | FakeCall::UpdateContainerResources { container_id }
            | FakeCall::ContainerStatus { container_id }
            | FakeCall::ExecSync { container_id } => container_id,
            _ => return None,
        };
        let c = self.objects.container(id)?;
        c.config.metadata.as_ref().map(|m| m.name.clone())
    }

    /// Logs the call and fails it if a fault fires for it.
    fn enter(&mut self, call: FakeCall) -> CriResult<()> {
        let method = call.method();
        let container = self.container_name(&call);
        let image = call.image().map(str::to_string);
        self.calls.push(call);
        let mut error = None;
        for armed in &mut self.faults {
            if !armed
                .fault
                .matches(method, container.as_deref(), image.as_deref())
            {
                continue;
            }
            armed.seen += 1;
            if error.is_none() && armed.fault.fires_at(armed.seen) {
                error = Some(armed.fault.error());
            }
        }
        error.map_or(Ok(()), Err)
    }
}

impl FakeRuntime {
    /// Shows the call to the observer, logs it and fails it if a fault fires; on success,
    /// the state to answer from.
    pub(super) fn enter(&self, call: FakeCall) -> CriResult<MutexGuard<'_, State>> {
        if let Some(observe) = &self.observer {
            observe(&call);
        }
        let mut st = self.lock();
        st.enter(call)?;
        Ok(st)
    }
}
