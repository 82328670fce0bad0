//! `fusebox replay`: JSONL event files through the engine, with no daemon, no NATS and
//! no disk state. One decision JSON per decided event on stdout, then one summary line
//! per run; errors as `file:line: reason: message` on stderr, good lines still applied.
//! Two threads: one reads, parses and orders, the other applies and writes; the order
//! of input lines is kept end to end.

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use fusebox_core::{parse_event_bounded, Admission, Decision, Engine, Event, EventBody, Sequencer};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::config::{GuardConfig, InputRules};

/// What a replay saw, for the exit code and the stderr summary.
#[derive(Debug, Default)]
pub struct Tally {
    pub events: u64,
    pub decisions: u64,
    pub rejected: u64,
    pub duplicates: u64,
}

/// The per-run line after the decisions.
#[derive(Serialize)]
struct Summary<'a> {
    tenant: &'a str,
    run: &'a str,
    terminal_state: &'a str,
    reason: Option<&'a str>,
    steps: u64,
    calls_executed: u64,
    calls_refused: u64,
    calls_answered: u64,
    events: u64,
}

/// Which decisions replay prints: every gate decision and every tool_result's observe
/// decision; for the other events, only those that change something.
fn printed(event: &Event, decision: &Decision) -> bool {
    matches!(
        event.body,
        EventBody::ToolCall(_) | EventBody::ToolResult(_)
    ) || decision.is_notable()
}

pub struct Replay<W: Write> {
    engine: Engine,
    out: W,
    /// One decision's JSON line, its room reused.
    line: Vec<u8>,
    pub tally: Tally,
}

impl<W: Write> Replay<W> {
    pub fn new(config: &GuardConfig, out: W) -> Self {
        Replay {
            engine: Engine::new(config.policies.clone()),
            out,
            line: Vec::with_capacity(512),
            tally: Tally::default(),
        }
    }

    /// Applies what the reader admitted; a refused line is reported with its place.
    pub(crate) fn take(&mut self, admitted: &Admitted) -> io::Result<()> {
        self.tally.duplicates += admitted.duplicates;
        for refused in &admitted.rejected {
            self.tally.rejected += 1;
            eprintln!("{refused}");
        }
        for event in &admitted.events {
            self.apply(event)?;
        }
        Ok(())
    }

    fn apply(&mut self, event: &Event) -> io::Result<()> {
        self.tally.events += 1;
        let decision = self.engine.apply(event);
        if printed(event, &decision) {
            self.tally.decisions += 1;
            self.line.clear();
            decision.write_json(&mut self.line);
            self.line.push(b'\n');
            self.out.write_all(&self.line)?;
        }
        Ok(())
    }

    /// End of input: the summaries.
    pub fn finish(mut self) -> io::Result<(Engine, Tally)> {
        for (tenant, run, state) in self.engine.runs() {
            let report = state.report();
            let summary = Summary {
                tenant,
                run,
                terminal_state: report.map_or("OPEN", |r| r.terminal_state.as_str()),
                reason: report.map(|r| r.reason.as_str()),
                steps: state.counters.steps,
                calls_executed: state.counters.steps,
                calls_refused: state.counters.calls_refused,
                calls_answered: state.counters.calls_answered,
                events: state.counters.events,
            };
            self.out.write_all(b"{\"summary\":")?;
            serde_json::to_writer(&mut self.out, &summary)?;
            self.out.write_all(b"}\n")?;
        }
        self.out.flush()?;
        Ok((self.engine, self.tally))
    }
}

fn open(path: &str) -> io::Result<(Box<dyn Read>, Option<u64>)> {
    if path == "-" {
        return Ok((Box::new(io::stdin().lock()), None));
    }
    let file = File::open(PathBuf::from(path))
        .map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    let size = file.metadata().ok().map(|m| m.len());
    Ok((Box::new(file), size))
}

fn progress_bar(size: Option<u64>) -> Option<ProgressBar> {
    let size = size.filter(|s| *s > 16 << 20)?;
    if !io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(size);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(bar)
}

/// What the reader thread made of a stretch of input: the events to apply, in order, and
/// what it refused or dropped on the way. Parsing and admission (dedup, `seq` order) both
/// happen there, so the applying thread does nothing but apply and write.
#[derive(Default)]
pub(crate) struct Admitted {
    pub events: Vec<Event>,
    pub duplicates: u64,
    /// One line per refused input line or unfilled `seq` gap, place first.
    pub rejected: Vec<String>,
}

const BATCH: usize = 1024;

/// The reader: reads, parses and admits every file on its own thread (parsing is half
/// the work of a replay), handing batches to the applier in input order. At the end of
/// the input, runs still waiting for a missing `seq` get their held events released in
/// order, the gap reported as bad input. Event vectors the applier is done with come
/// back on `spent` and are freed here, by the allocator's thread that made them.
pub(crate) fn read_and_admit(
    files: Vec<String>,
    rules: InputRules,
    batches: mpsc::SyncSender<Admitted>,
    spent: mpsc::Receiver<Vec<Event>>,
) -> io::Result<()> {
    let mut sequencer = Sequencer::default();
    let mut line = Vec::with_capacity(4096);
    let mut batch = Admitted::default();
    let mut lines_in_batch = 0;
    for path in &files {
        let (input, size) = open(path)?;
        let bar = progress_bar(size);
        let mut reader = BufReader::with_capacity(1 << 16, input);
        let mut number = 0u64;
        loop {
            line.clear();
            let read = reader.read_until(b'\n', &mut line)?;
            if read == 0 {
                break;
            }
            number += 1;
            if let Some(bar) = &bar {
                bar.inc(read as u64);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let admitted = parse_event_bounded(&line, rules.max_event_bytes).and_then(|event| {
                fusebox_nats::check_watched(&event, &rules.instance_providers)?;
                sequencer.admit(event)
            });
            match admitted {
                Ok(Admission::Ready(events)) => batch.events.extend(events),
                Ok(Admission::Held { .. }) => {}
                Ok(Admission::Duplicate) => batch.duplicates += 1,
                Err(err) => batch.rejected.push(format!("{path}:{number}: {err}")),
            }
            lines_in_batch += 1;
            if lines_in_batch == BATCH {
                lines_in_batch = 0;
                let full = std::mem::take(&mut batch);
                if batches.send(full).is_err() {
                    return Ok(());
                }
                // Freed here, and the last one's room reused for the next batch.
                for mut events in spent.try_iter() {
                    events.clear();
                    batch.events = events;
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
    }
    let waiting: Vec<(String, String, u64)> = sequencer
        .waiting()
        .map(|(t, r, seq)| (t.to_owned(), r.to_owned(), seq))
        .collect();
    for (tenant, run, missing) in waiting {
        let held = sequencer.release_gap(&tenant, &run);
        batch.rejected.push(format!(
            "{tenant}/{run}: seq_gap: seq {missing} never arrived; applied the {} later events held for it",
            held.len()
        ));
        batch.events.extend(held);
    }
    let _ = batches.send(batch);
    Ok(())
}

/// What `replay`, `whatif` and `tune` read events from: JSONL files of events, or an
/// agent's own history (`--from`).
#[derive(Debug, Clone)]
pub enum Input {
    Files(Vec<String>),
    History(crate::history::Import),
}

/// Starts the reader thread for `input`: `read_and_admit` for JSONL, its sibling
/// `history::read_and_admit` for an agent's history. Either sends the same batches; the
/// history reader also returns what it read, for the summary.
pub(crate) fn spawn_reader(
    input: &Input,
    rules: InputRules,
    batches: mpsc::SyncSender<Admitted>,
    spent: mpsc::Receiver<Vec<Event>>,
) -> std::thread::JoinHandle<io::Result<Option<crate::history::ImportSummary>>> {
    let input = input.clone();
    std::thread::spawn(move || match input {
        Input::Files(files) => read_and_admit(files, rules, batches, spent).map(|()| None),
        Input::History(import) => {
            // The hook's own check bounds its events (fusebox-hook's `checked`), as live.
            // OTLP files are bounded as the daemon's receiver bounds them.
            crate::history::read_and_admit_bounded(import, rules.max_event_bytes, batches, spent)
                .map(Some)
        }
    })
}

/// Runs the whole command; returns whether every line was good.
pub fn run(config: &GuardConfig, input: &Input, quiet: bool) -> io::Result<bool> {
    let started = Instant::now();
    let stdout = io::stdout().lock();
    let mut replay = Replay::new(config, io::BufWriter::with_capacity(1 << 16, stdout));
    let (sender, batches) = mpsc::sync_channel::<Admitted>(8);
    let (give_back, spent) = mpsc::channel::<Vec<Event>>();
    let reader = spawn_reader(input, config.input.clone(), sender, spent);
    for admitted in batches {
        replay.take(&admitted)?;
        // The reader frees the events (its allocations) when it next sends a batch.
        let _ = give_back.send(admitted.events);
    }
    let imported = reader
        .join()
        .map_err(|_| io::Error::other("the reader thread panicked"))??;
    let (engine, tally) = replay.finish()?;
    // What was imported is said whatever --quiet says: it is how a person knows the
    // decisions above are about the sessions they meant.
    if let (Some(summary), Input::History(import)) = (&imported, input) {
        eprintln!("{}", summary.text(import.agent));
    }
    if !quiet {
        print_summary(&engine, &tally, started.elapsed().as_secs_f64());
    }
    // The process ends here: freeing every run's state piece by piece cost a large
    // replay 1.5% of its instructions (callgrind), for memory the exit returns anyway.
    std::mem::forget(engine);
    Ok(tally.rejected == 0)
}

fn print_summary(engine: &Engine, tally: &Tally, seconds: f64) {
    let mut err = io::stderr().lock();
    let runs = engine.run_count();
    if runs <= 20 {
        for (tenant, run, state) in engine.runs() {
            let outcome = match state.report() {
                Some(r) => format!("{} ({})", r.terminal_state.as_str(), r.reason.as_str()),
                None => "OPEN".to_owned(),
            };
            let _ = writeln!(
                err,
                "{:<36} {:<40} executed {:>4}  refused {:>3}  answered {:>3}",
                format!("{tenant}/{run}"),
                outcome,
                state.counters.steps,
                state.counters.calls_refused,
                state.counters.calls_answered
            );
        }
    } else {
        let closed = engine.runs().filter(|(_, _, s)| !s.is_open()).count();
        let _ = writeln!(err, "{runs} runs, {closed} closed");
    }
    let rate = if seconds > 0.0 {
        tally.events as f64 / seconds
    } else {
        0.0
    };
    let _ = writeln!(
        err,
        "{} events applied, {} decisions printed, {} rejected, {} duplicates; {:.3} s ({:.0} events/s)",
        tally.events, tally.decisions, tally.rejected, tally.duplicates, seconds, rate
    );
}
