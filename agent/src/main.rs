use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: podlapse::allocator::PerCommand = podlapse::allocator::PerCommand;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PODLAPSE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = podlapse::cli::Cli::parse();
    if cli.keeps_memory_low() {
        podlapse::agent::malloc::tune();
    }
    if cli.is_long_running() {
        podlapse::agent::malloc::exec_without_thread_caches();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if cli.wants_short_slice() {
        podlapse::cli::sched::request_short_slice();
        builder.on_thread_start(|| {
            podlapse::cli::sched::request_short_slice();
        });
        podlapse::event_thread::on_thread_start(cli.event_thread_policy().thread_start());
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("podlapse: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(podlapse::cli::main(cli))
}
