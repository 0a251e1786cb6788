//! The child side of the multi-process contended workloads (`--worker contended …`).
//!
//! Protocol on stdin/stdout, one line each: the child connects and warms up, prints `ready`,
//! waits for `go`, runs, prints one `r <worker> <asked> <acquired> <releasing>` line per
//! acquisition and then `done`. On failure it prints `error <message>` and exits non-zero.

use crate::cli::WorkerArgs;
use crate::clients::Client;
use crate::workloads::contended::contend;
use std::io::{BufRead, Write};
use std::sync::Arc;

pub(crate) fn main(args: WorkerArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let client = Arc::new(Client::connect(args.lib, &args.url)?);
        client
            .warm_up(&format!("worker:{}", args.first_worker))
            .await?;
        say("ready")?;
        // Blocking here is fine: this future runs on the thread that called `block_on`.
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|e| format!("reading stdin: {e}"))?;
        if line.trim() != "go" {
            return Err(format!("expected `go`, got {line:?}"));
        }
        let acquisitions = contend(
            &client,
            &args.key,
            args.tasks,
            args.first_worker,
            args.duration,
            args.critical_section,
        )
        .await?;
        let mut out = std::io::stdout().lock();
        for acquisition in acquisitions {
            writeln!(out, "{}", acquisition.to_line()).map_err(|e| e.to_string())?;
        }
        writeln!(out, "done")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())
    })
}

fn say(line: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing stdout: {e}"))
}
