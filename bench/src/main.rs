//! `distlock-bench`: distlock beside the crates.io peers `rslock` and `redlock`, on the same
//! loopback Redis in the same run, each as a ratio to the floor measured in that run.
//! `cargo run --release -p distlock-bench -- --help` documents it; BENCHMARKS.md explains the
//! numbers.
//!
//! Layout: [`cli`] arguments → [`run`] (server, calibration, repetitions of [`floor`] and the
//! [`workloads`]) → [`report`] (medians, targets, table, JSON line). [`clients`] puts the three
//! libraries behind one interface; [`server_stats`] and [`calibrate`] count what the server did;
//! [`worker`] is the child process of the multi-process contended workloads.

mod calibrate;
mod cli;
mod clients;
mod fifo_floor;
mod floor;
mod measure;
mod pin;
mod plot;
mod report;
mod run;
mod server_stats;
mod worker;
mod workloads;

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mode = match cli::parse(std::env::args_os().skip(1)) {
        Ok(mode) => mode,
        Err(message) => {
            eprintln!("distlock-bench: {message}");
            return ExitCode::from(2);
        }
    };
    match mode {
        cli::Mode::Help => {
            print!("{}", cli::HELP);
            ExitCode::SUCCESS
        }
        cli::Mode::Worker(args) => match worker::main(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                println!("error {message}");
                ExitCode::FAILURE
            }
        },
        cli::Mode::Count(args) => match workloads::counts::child(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                println!("error {message}");
                ExitCode::FAILURE
            }
        },
        cli::Mode::Run(config) => bench(config),
        cli::Mode::Plot { from, to } => {
            match plot::read(&from).and_then(|json| plot::write(&json, &to)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    eprintln!("distlock-bench: {message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn bench(config: cli::Config) -> ExitCode {
    // Before the runtime starts its threads, which inherit the placement.
    if let Err(message) = config.pin.client() {
        eprintln!("distlock-bench: {message}");
        return ExitCode::FAILURE;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let progress = |line: String| eprintln!("distlock-bench: {line}");
    // The orchestration runs in `block_on`, on this thread rather than on a runtime worker: its
    // blocking calls (INFO, redis-benchmark, worker processes' pipes) hold up no task.
    let measured = match runtime.block_on(run::run(&config, &progress)) {
        Ok(measured) => measured,
        Err(message) => {
            eprintln!("distlock-bench: {message}");
            return ExitCode::FAILURE;
        }
    };
    let report = report::Report::new(&config, measured);
    let mut stdout = std::io::stdout().lock();
    if !config.json_only {
        let _ = write!(stdout, "{}", report.table(&config));
    }
    let _ = writeln!(stdout, "{}", report.json_line());
    let _ = stdout.flush();
    if let Some(dir) = &config.svg_dir {
        if let Err(message) = plot::write(report.json(), dir) {
            eprintln!("distlock-bench: {message}");
            return ExitCode::FAILURE;
        }
        eprintln!("distlock-bench: pictures in {}", dir.display());
    }
    drop(runtime);
    ExitCode::SUCCESS
}
