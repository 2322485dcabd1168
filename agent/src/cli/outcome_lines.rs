//! The lines `podlapse run --until-ready` prints as each pod settles.

use crate::agent::PodOutcome;
use crate::kubelet::status::phase;

/// One line per pod; under a pod not wholly running, a line per container that is not,
/// with its state and why.
pub fn print_outcome(o: &PodOutcome) {
    let who = format!("{}/{}", o.namespace, o.name);
    let tail = match &o.reason {
        Some(r) if o.phase != phase::RUNNING => {
            format!("  {r}: {}", o.message.as_deref().unwrap_or(""))
        }
        _ => String::new(),
    };
    println!(
        "{who:<32} {:<9} {:<15} {:>7.3}s{tail}",
        o.phase,
        o.ip.as_deref().unwrap_or("-"),
        o.seconds
    );
    for c in &o.not_running {
        let why = match (&c.reason, &c.message) {
            (Some(r), Some(m)) if !m.is_empty() => format!("{r}: {m}"),
            (Some(r), _) => r.clone(),
            (None, _) => String::new(),
        };
        println!("  container {:<22} {:<11} {why}", c.container, c.state);
    }
}
