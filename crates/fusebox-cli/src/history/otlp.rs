//! OTLP/JSON files as an event source (`--from otlp PATH…`): what an OpenTelemetry
//! Collector's `file` exporter wrote (`format: json`, its default: one OTLP/JSON export
//! request per line, traces, logs and metrics requests mixed when one exporter serves
//! several pipelines), read back through the mapping fuseboxd's OTLP receiver uses.
//!
//! Each line is decoded with the OpenTelemetry project's own messages (the receiver's
//! decoder for `application/json`) and handed to the same pure functions the receiver
//! calls, `fusebox_otlp::map_request` for a traces request and `fusebox_otlp::map_logs`
//! for a logs request, with the tenant and the event bound the daemon would have used.
//! So the runs, the event ids (from span ids, or a log record's digest), each request's
//! order (a run's events in time order) and the refusals are the receiver's, and a file
//! imported gets the decisions the same requests got live. Lines are applied in file
//! order, as the receiver applies requests in arrival order; a request seen twice maps
//! to the same ids and the sequencer drops the copy, as the daemon does.
//!
//! Two things differ from live, both said in docs/history.md: metrics (and profiles)
//! requests are counted and skipped (the receiver serves neither), and the end of the
//! import closes every run it saw with a `run_finished`: the receiver keeps OTLP runs
//! open because it cannot know whether a conversation goes on, but a recording that has
//! been read to its end is over, and `tune` calibrates on finished runs. No decision of
//! the run's own events changes.
//!
//! Files may be compressed, told by their first bytes whatever their name: gzip (as
//! archived collector output usually is), and the file exporter's own `compression:
//! zstd` in both its forms (each request a frame after its length, its default; one
//! stream of lines, its native-compression gate). `format: proto` (binary frames that do
//! not say their signal) is reported and skipped, never misread line by line.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use fusebox_core::event::RunFinished;
use fusebox_core::{Event, EventBody, Sequencer};
use fusebox_otlp::{
    map_logs, map_request, ExportLogsServiceRequest, ExportTraceServiceRequest, Mapped,
};
use ruzstd::decoding::{FrameDecoder, StreamingDecoder};
use serde::de::IgnoredAny;

use super::{Agent, Import, ImportSummary};
use crate::replay::Admitted;

/// What an OTLP import read, beside [`ImportSummary`]'s shared counts.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub trace_requests: u64,
    pub log_requests: u64,
    /// Metrics requests: counted and skipped (nothing the guard reads is a metric).
    pub metric_requests: u64,
    /// Profiles requests (the exporter's development signal): counted and skipped.
    pub profile_requests: u64,
    pub spans: u64,
    pub log_records: u64,
    /// Spans and log records turned into events.
    pub mapped: u64,
    /// Known shapes with nothing to map (`invoke_agent`, …): as the receiver's `skipped`.
    pub skipped: u64,
    /// Refused spans and records by reason (the receiver's dead letters): how many, and
    /// the first one's detail as an example.
    pub refused: BTreeMap<&'static str, (u64, String)>,
    pub model_turns: u64,
    /// Files not read: binary (`format: proto`) or not OTLP/JSON from the start.
    pub unread_files: u64,
    /// The runs seen, in the order they first appear, each with its last event's time.
    runs: Vec<(String, u64)>,
    run_index: HashMap<String, usize>,
}

/// What one line (one export request) decodes and maps to: worked out on a worker
/// thread, applied to the summary and the sequencer in file order.
pub(crate) enum Decoded {
    Traces { spans: u64, mapped: Mapped },
    Logs { records: u64, mapped: Mapped },
    Metrics,
    Profiles,
}

/// Decodes one line with the OpenTelemetry project's messages and maps it with the
/// receiver's own function for its signal. Pure: lines are decoded in parallel.
pub(crate) fn decode(line: &[u8], tenant: &str, max_event_bytes: usize) -> Result<Decoded, String> {
    // The newline is not the request's: a truncated line's error then says where the
    // request stops, not that a string holds a control character.
    let line = line.trim_ascii_end();
    match first_key(line)? {
        "resourceSpans" => {
            let request: ExportTraceServiceRequest = serde_json::from_slice(line)
                .map_err(|e| format!("not an OTLP ExportTraceServiceRequest: {e}"))?;
            let spans = request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len() as u64)
                .sum();
            let mapped = map_request(&request, tenant, max_event_bytes);
            Ok(Decoded::Traces { spans, mapped })
        }
        "resourceLogs" => {
            let request: ExportLogsServiceRequest = serde_json::from_slice(line)
                .map_err(|e| format!("not an OTLP ExportLogsServiceRequest: {e}"))?;
            let records = request
                .resource_logs
                .iter()
                .flat_map(|r| &r.scope_logs)
                .map(|s| s.log_records.len() as u64)
                .sum();
            let mapped = map_logs(&request, tenant, max_event_bytes);
            Ok(Decoded::Logs { records, mapped })
        }
        signal @ ("resourceMetrics" | "resourceProfiles") => {
            // Skipped, but still a request: a truncated one is a bad line.
            serde_json::from_slice::<IgnoredAny>(line)
                .map_err(|e| format!("not an OTLP/JSON request: {e}"))?;
            Ok(if signal == "resourceMetrics" {
                Decoded::Metrics
            } else {
                Decoded::Profiles
            })
        }
        other => Err(format!(
            "not an OTLP/JSON export request: its first key is {other:?} (a request starts \
             with resourceSpans, resourceLogs or resourceMetrics)"
        )),
    }
}

/// Counts what a decoded line holds and hands over its events, in the receiver's order.
fn tally(decoded: Decoded, summary: &mut ImportSummary, out: &mut Vec<Event>) {
    let counts = &mut summary.otlp;
    let mapped = match decoded {
        Decoded::Traces { spans, mapped } => {
            counts.trace_requests += 1;
            counts.spans += spans;
            mapped
        }
        Decoded::Logs { records, mapped } => {
            counts.log_requests += 1;
            counts.log_records += records;
            mapped
        }
        Decoded::Metrics => {
            counts.metric_requests += 1;
            return;
        }
        Decoded::Profiles => {
            counts.profile_requests += 1;
            return;
        }
    };
    counts.mapped += mapped.mapped_spans as u64;
    counts.skipped += mapped.skipped_spans as u64;
    for refused in &mapped.rejected {
        let entry = counts
            .refused
            .entry(refused.reason)
            .or_insert_with(|| (0, refused.detail.clone()));
        entry.0 += 1;
    }
    for event in &mapped.events {
        match &event.body {
            EventBody::ToolCall(_) => summary.calls += 1,
            EventBody::ToolResult(_) => summary.results += 1,
            EventBody::Prompt(_) => summary.prompts += 1,
            EventBody::Compaction(_) => summary.compactions += 1,
            EventBody::ModelTurn(_) => summary.otlp.model_turns += 1,
            other => {
                *summary
                    .ignored
                    .entry(other.type_name().to_owned())
                    .or_default() += 1
            }
        }
        let counts = &mut summary.otlp;
        match counts.run_index.get(&event.run) {
            Some(&at) => counts.runs[at].1 = counts.runs[at].1.max(event.ts_ms),
            None => {
                counts
                    .run_index
                    .insert(event.run.clone(), counts.runs.len());
                counts.runs.push((event.run.clone(), event.ts_ms));
            }
        }
    }
    summary.sessions = summary.otlp.runs.len() as u64;
    out.extend(mapped.events);
}

/// The end of the import: a `run_finished` for every run seen, in the order they first
/// appeared, at its last event's time.
fn close_runs(tenant: &str, summary: &ImportSummary, out: &mut Vec<Event>) {
    for (run, ts_ms) in &summary.otlp.runs {
        out.push(Event {
            v: 1,
            id: "otlp-import-end".to_owned(),
            tenant: tenant.to_owned(),
            run: run.clone(),
            seq: None,
            ts_ms: *ts_ms,
            body: EventBody::RunFinished(RunFinished {
                status: Some("the OTLP recording ended".to_owned()),
            }),
        });
    }
}

/// Lines handed to a worker at once: a few hundred small requests, or a few large ones.
const CHUNK_BYTES: usize = 1 << 20;
const CHUNK_LINES: usize = 256;

/// Lines of one file for a worker: their text and, per line, its number and place.
struct Chunk {
    file: usize,
    text: Vec<u8>,
    lines: Vec<(u64, std::ops::Range<usize>)>,
}

type Results = (usize, Vec<(u64, Result<Decoded, String>)>);

/// `history::read_and_admit` for OTLP files. Decoding JSON is nearly all the work (the
/// engine's share is a tenth), and each request decodes and maps alone, so lines are
/// decoded on one worker per core, a chunk at a time, and their results taken back in
/// file order: the summary, the sequencer and the batches see the lines one after the
/// other, as the receiver sees requests.
pub(crate) fn read_and_admit(
    import: Import,
    max_event_bytes: usize,
    batches: mpsc::SyncSender<Admitted>,
    spent: mpsc::Receiver<Vec<Event>>,
) -> io::Result<ImportSummary> {
    let started = std::time::Instant::now();
    let (files, mut summary, bar) = super::start_import(Agent::Otlp, &import.paths)?;
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let tenant = import.tenant.as_str();
    let mut apply = Apply {
        summary: &mut summary,
        sequencer: Sequencer::default(),
        batch: Admitted::default(),
        events: Vec::new(),
        since_send: 0,
        batches: &batches,
        spent: &spent,
        files: &files,
    };
    let finished = std::thread::scope(|scope| -> io::Result<bool> {
        let mut to = Vec::with_capacity(workers);
        let mut from = Vec::with_capacity(workers);
        for _ in 0..workers {
            let (send_chunk, chunks) = mpsc::channel::<Chunk>();
            let (send_done, done) = mpsc::channel::<Results>();
            scope.spawn(move || {
                for chunk in chunks {
                    let decoded = chunk
                        .lines
                        .iter()
                        .map(|(number, range)| {
                            (
                                *number,
                                decode(&chunk.text[range.clone()], tenant, max_event_bytes),
                            )
                        })
                        .collect();
                    if send_done.send((chunk.file, decoded)).is_err() {
                        return;
                    }
                }
            });
            to.push(send_chunk);
            from.push(done);
        }
        // Chunks sent and not yet applied, oldest first, by worker: at most two a worker.
        let mut pending = std::collections::VecDeque::new();
        let mut next = 0usize;
        let mut send = |chunk: Chunk, apply: &mut Apply<'_>| -> bool {
            if pending.len() >= 2 * workers {
                let worker: usize = pending.pop_front().expect("pending");
                if !from[worker].recv().is_ok_and(|results| apply.take(results)) {
                    return false;
                }
            }
            let worker = next % workers;
            next += 1;
            pending.push_back(worker);
            to[worker].send(chunk).is_ok()
        };
        for (index, file) in files.iter().enumerate() {
            if let Some(bar) = &bar {
                bar.set_message(
                    file.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                );
            }
            let mut input = match open(file, bar.clone())? {
                Ok(text) => BufReader::with_capacity(1 << 16, text),
                Err(why) => {
                    // Binary framings reported, not misread line by line.
                    apply.summary.otlp.unread_files += 1;
                    apply
                        .batch
                        .rejected
                        .push(format!("{}: {why}", file.display()));
                    continue;
                }
            };
            let mut chunk = Chunk {
                file: index,
                text: Vec::with_capacity(CHUNK_BYTES + (1 << 16)),
                lines: Vec::new(),
            };
            let mut number = 0u64;
            loop {
                let from_byte = chunk.text.len();
                let read = match input.read_until(b'\n', &mut chunk.text) {
                    Ok(read) => read,
                    Err(err) => {
                        // A compressed file cut short or damaged: what came before is
                        // read, the rest of the file cannot be found again.
                        chunk.text.truncate(from_byte);
                        apply.summary.bad_lines += 1;
                        let place = format!("{}:{}", file.display(), number + 1);
                        apply.batch.rejected.push(format!(
                            "{place}: unreadable, the rest of the file skipped: {err}"
                        ));
                        break;
                    }
                };
                if read == 0 {
                    break;
                }
                number += 1;
                apply.summary.lines += 1;
                apply.summary.bytes += read as u64;
                if chunk.text[from_byte..].iter().all(u8::is_ascii_whitespace) {
                    chunk.text.truncate(from_byte);
                    continue;
                }
                chunk.lines.push((number, from_byte..chunk.text.len()));
                if chunk.text.len() >= CHUNK_BYTES || chunk.lines.len() >= CHUNK_LINES {
                    let full = std::mem::replace(
                        &mut chunk,
                        Chunk {
                            file: index,
                            text: Vec::with_capacity(CHUNK_BYTES + (1 << 16)),
                            lines: Vec::new(),
                        },
                    );
                    if !send(full, &mut apply) {
                        return Ok(false);
                    }
                }
            }
            if !chunk.lines.is_empty() && !send(chunk, &mut apply) {
                return Ok(false);
            }
        }
        for worker in pending.drain(..) {
            if !from[worker].recv().is_ok_and(|results| apply.take(results)) {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if !finished {
        return Ok(summary);
    }
    let Apply {
        mut sequencer,
        mut batch,
        mut events,
        ..
    } = apply;
    // Runs may go on in the next file (a rotated collector file): closed at the end.
    close_runs(tenant, &summary, &mut events);
    super::admit(&mut sequencer, &mut events, &mut batch);
    let _ = batches.send(batch);
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// The reader's side of the import: decoded lines in, counted, admitted, batched.
struct Apply<'a> {
    summary: &'a mut ImportSummary,
    sequencer: Sequencer,
    batch: Admitted,
    events: Vec<Event>,
    since_send: usize,
    batches: &'a mpsc::SyncSender<Admitted>,
    spent: &'a mpsc::Receiver<Vec<Event>>,
    files: &'a [PathBuf],
}

impl Apply<'_> {
    /// Applies one chunk's results; false once the applier has gone.
    fn take(&mut self, (file, results): Results) -> bool {
        for (number, decoded) in results {
            match decoded {
                Ok(decoded) => tally(decoded, self.summary, &mut self.events),
                Err(why) => {
                    self.summary.bad_lines += 1;
                    let place = self.files[file].display();
                    self.batch.rejected.push(format!("{place}:{number}: {why}"));
                }
            }
            self.since_send += super::admit(&mut self.sequencer, &mut self.events, &mut self.batch);
            if self.since_send >= super::BATCH {
                self.since_send = 0;
                if self.batches.send(std::mem::take(&mut self.batch)).is_err() {
                    return false;
                }
                for mut spent_events in self.spent.try_iter() {
                    spent_events.clear();
                    self.batch.events = spent_events;
                }
            }
        }
        true
    }
}

/// The key a JSON object's text starts with (`{"resourceSpans":[…`): the signal of an
/// export request, told without building the request twice. The collector and the
/// OpenTelemetry SDKs write the one key of a request first.
fn first_key(line: &[u8]) -> Result<&str, String> {
    let text = line.trim_ascii_start();
    let Some(rest) = text.strip_prefix(b"{") else {
        return Err("not an OTLP/JSON export request: not a JSON object".to_owned());
    };
    let rest = rest.trim_ascii_start();
    let Some(rest) = rest.strip_prefix(b"\"") else {
        return Err(if rest.starts_with(b"}") {
            "an empty OTLP/JSON request ({}): it names no signal".to_owned()
        } else {
            "not an OTLP/JSON export request: not a JSON object".to_owned()
        });
    };
    let end = rest
        .iter()
        .position(|&b| b == b'"')
        .ok_or("not an OTLP/JSON export request: truncated")?;
    std::str::from_utf8(&rest[..end]).map_err(|_| "not an OTLP/JSON export request".to_owned())
}

/// A file of a directory searched through: what the file exporter is usually told to
/// write (`*.json`, `*.jsonl`, `*.ndjson`), rotated (`name-<time>.json`) or gzipped.
pub fn is_otlp_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let name = name
        .strip_suffix(".gz")
        .or_else(|| name.strip_suffix(".zst"))
        .unwrap_or(name);
    [".json", ".jsonl", ".ndjson"]
        .iter()
        .any(|ext| name.ends_with(ext))
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The file's bytes as read, counted on the progress bar (whose total is the files'
/// sizes, compressed or not).
struct Counted {
    file: File,
    bar: Option<indicatif::ProgressBar>,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        if let Some(bar) = &self.bar {
            bar.inc(n as u64);
        }
        Ok(n)
    }
}

/// The file's text as lines: decompressed when it is gzip or zstd. `Ok(Err(why))` for a
/// file that is not OTLP/JSON lines (the exporter's proto format): reported, not read.
fn open(
    file: &Path,
    bar: Option<indicatif::ProgressBar>,
) -> io::Result<Result<Box<dyn Read + Send>, String>> {
    let handle = File::open(file)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    let handle = Counted { file: handle, bar };
    let mut head = [0u8; 8];
    let mut peek = BufReader::with_capacity(1 << 16, handle);
    let got = {
        let buffered = peek.fill_buf()?;
        let n = buffered.len().min(head.len());
        head[..n].copy_from_slice(&buffered[..n]);
        n
    };
    let head = &head[..got];
    if head.starts_with(&GZIP_MAGIC) {
        return Ok(Ok(Box::new(flate2::bufread::MultiGzDecoder::new(peek))));
    }
    if head.starts_with(&ZSTD_MAGIC) {
        // The exporter's native compression (a feature gate): one stream of lines, a
        // frame per flush.
        return Ok(Ok(Box::new(ZstdStream {
            source: Some(peek),
            frame: None,
        })));
    }
    if head.get(4..8) == Some(&ZSTD_MAGIC[..]) {
        // Its default form of `compression: zstd`: each request a frame of its own after
        // its length.
        return Ok(Ok(Box::new(ZstdFramed {
            source: peek,
            out: Vec::new(),
            at: 0,
        })));
    }
    match head.iter().find(|b| !b.is_ascii_whitespace()) {
        None | Some(b'{') => Ok(Ok(Box::new(peek))),
        Some(_) => Ok(Err(
            "not OTLP/JSON lines (binary: the file exporter's `format: proto`?): not read; \
             export with `format: json`"
                .to_owned(),
        )),
    }
}

/// A zstd stream of frames one after the other, as one text.
struct ZstdStream<R: BufRead> {
    source: Option<R>,
    frame: Option<StreamingDecoder<R, FrameDecoder>>,
}

impl<R: BufRead> Read for ZstdStream<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(frame) = &mut self.frame {
                let n = frame.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                self.source = self.frame.take().map(StreamingDecoder::into_inner);
            }
            let Some(mut source) = self.source.take() else {
                return Ok(0);
            };
            if source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            let frame = StreamingDecoder::new(source)
                .map_err(|e| io::Error::other(format!("not a zstd frame: {e}")))?;
            self.frame = Some(frame);
        }
    }
}

/// The largest request frame read (the exporter splits nothing below its rotation size,
/// 100 MiB by default).
const MAX_FRAME: usize = 1 << 30;

/// Length-prefixed zstd frames (a big-endian u32, then the frame), each request's
/// JSON given as one line.
struct ZstdFramed<R: BufRead> {
    source: R,
    out: Vec<u8>,
    at: usize,
}

impl<R: BufRead> Read for ZstdFramed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.out.len() {
            if self.source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            let mut length = [0u8; 4];
            self.source.read_exact(&mut length)?;
            let length = u32::from_be_bytes(length) as usize;
            if length > MAX_FRAME {
                return Err(io::Error::other(format!(
                    "a zstd frame of {length} bytes: not the file exporter's framing"
                )));
            }
            let mut frame = vec![0u8; length];
            self.source.read_exact(&mut frame)?;
            self.out.clear();
            self.at = 0;
            // An oversized request is written as several frames, one after the other.
            let mut input = &frame[..];
            while !input.is_empty() {
                StreamingDecoder::new(&mut input)
                    .map_err(|e| io::Error::other(format!("not a zstd frame: {e}")))?
                    .read_to_end(&mut self.out)?;
            }
            self.out.push(b'\n');
        }
        let n = buf.len().min(self.out.len() - self.at);
        buf[..n].copy_from_slice(&self.out[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A sort key for when a file began: the first `startTimeUnixNano` or `timeUnixNano`
/// of its first line (nanoseconds, zero-padded so they sort as text), else its
/// modification time after every such key, as [`super::began`].
pub(crate) fn began(file: &Path) -> String {
    let mut first = Vec::new();
    if let Ok(Ok(text)) = open(file, None) {
        let _ = BufReader::new(text.take(4 << 20)).read_until(b'\n', &mut first);
    }
    let compact: Vec<u8> = first.iter().copied().filter(|b| *b != b' ').collect();
    let at = [&b"\"startTimeUnixNano\":"[..], &b"\"timeUnixNano\":"[..]]
        .iter()
        .filter_map(|needle| {
            compact
                .windows(needle.len())
                .position(|w| w == *needle)
                .map(|at| at + needle.len())
        })
        .min();
    if let Some(at) = at {
        let digits: String = compact[at..]
            .iter()
            .skip_while(|b| **b == b'"')
            .take_while(|b| b.is_ascii_digit())
            .map(|b| *b as char)
            .collect();
        if let Ok(ns) = digits.parse::<u64>() {
            return format!("{ns:020}");
        }
    }
    super::began(file)
}

/// One paragraph, what a person reads before any decision.
pub(crate) fn text(summary: &ImportSummary) -> String {
    let counts = &summary.otlp;
    let refused_total: u64 = counts.refused.values().map(|(n, _)| n).sum();
    let refused: Vec<String> = counts
        .refused
        .iter()
        .map(|(reason, (n, example))| format!("{reason} {n}, e.g. {example}"))
        .collect();
    let refused = if refused.is_empty() {
        String::new()
    } else {
        format!(" ({})", refused.join("; "))
    };
    let unread = if counts.unread_files > 0 {
        format!(" ({} not read)", counts.unread_files)
    } else {
        String::new()
    };
    format!(
        "otlp: {runs} runs in {files} files{unread}, {lines} lines ({mib:.1} MiB): \
         {traces} traces requests ({spans} spans), {logs} logs requests ({records} log \
         records), {metrics} metrics requests skipped{profiles}; {mapped} mapped, \
         {skipped} skipped (agent and workflow spans: structure, not steps), \
         {refused_total} refused as the receiver refuses them{refused}; {calls} tool calls, \
         {results} results, {turns} model turns, {prompts} prompts, {other} other events; \
         {bad} bad lines skipped; every run closed at the end of the import; read in \
         {seconds:.3} s ({rate:.0} lines/s, {span_rate:.0} spans and records/s)",
        runs = counts.runs.len(),
        files = summary.files,
        lines = summary.lines,
        mib = summary.bytes as f64 / (1 << 20) as f64,
        traces = counts.trace_requests,
        spans = counts.spans,
        logs = counts.log_requests,
        records = counts.log_records,
        metrics = counts.metric_requests,
        profiles = if counts.profile_requests > 0 {
            format!(", {} profiles requests skipped", counts.profile_requests)
        } else {
            String::new()
        },
        mapped = counts.mapped,
        skipped = counts.skipped,
        calls = summary.calls,
        results = summary.results,
        turns = counts.model_turns,
        prompts = summary.prompts,
        other = summary.ignored.values().sum::<u64>(),
        bad = summary.bad_lines,
        seconds = summary.seconds,
        rate = summary.lines as f64 / summary.seconds.max(1e-9),
        span_rate = (counts.spans + counts.log_records) as f64 / summary.seconds.max(1e-9),
    )
}

#[cfg(test)]
mod tests {
    //! Against `tests/fixtures/otlp/collector.jsonl`, a file in the collector's form
    //! written from Pydantic AI 2.66.0's own instrumentation (`python -m
    //! support.collector_file`, tests/py): a runaway (the same search 6 times) and a
    //! legitimate run, a metrics request, an HTTP client's span, a re-sent batch and a
    //! truncated line. `collector.expected.jsonl` is every admitted event with its
    //! decision under the default policy; `FUSEBOX_BLESS=1` rewrites it.

    use std::io::Write;
    use std::path::PathBuf;
    use std::sync::mpsc;

    use fusebox_core::{Engine, PolicySet, Sequencer};

    use crate::history::{read_and_admit, Agent, Import, ImportSummary};
    use crate::replay::Admitted;

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/otlp")
    }

    fn import(paths: Vec<PathBuf>) -> (ImportSummary, Vec<fusebox_core::Event>, Vec<String>, u64) {
        let (sender, batches) = mpsc::sync_channel::<Admitted>(1024);
        let (_, spent) = mpsc::channel();
        let summary = read_and_admit(
            Import {
                agent: Agent::Otlp,
                paths,
                tenant: "t".to_owned(),
            },
            sender,
            spent,
        )
        .unwrap();
        let (mut events, mut rejected, mut duplicates) = (Vec::new(), Vec::new(), 0);
        for batch in batches {
            events.extend(batch.events);
            rejected.extend(batch.rejected);
            duplicates += batch.duplicates;
        }
        (summary, events, rejected, duplicates)
    }

    /// Each event with the default policy's decision, one line each: `[run, event id,
    /// type, action, reason]`.
    fn decided(events: &[fusebox_core::Event]) -> String {
        let mut engine = Engine::new(PolicySet::default());
        let mut out = String::new();
        for event in events {
            let decision = engine.apply(event);
            let line = (
                &event.run,
                &event.id,
                event.body.type_name(),
                decision.action.as_str(),
                decision.reason.map(|r| r.as_str()),
            );
            out.push_str(&serde_json::to_string(&line).unwrap());
            out.push('\n');
        }
        out
    }

    #[test]
    fn a_collector_file_becomes_the_receivers_events_and_decisions() {
        let file = fixtures().join("collector.jsonl");
        let (summary, events, rejected, duplicates) = import(vec![file.clone()]);
        let got = decided(&events);
        let expected_path = fixtures().join("collector.expected.jsonl");
        if std::env::var_os("FUSEBOX_BLESS").is_some() {
            std::fs::write(&expected_path, &got).unwrap();
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap();
        assert_eq!(got, expected, "FUSEBOX_BLESS=1 rewrites the expected file");
        // The runaway is stopped, the legitimate run completes (closed by the import).
        assert!(got.contains(r#"["runaway","otlp-import-end","run_finished","continue",null]"#));
        assert!(
            got.contains(r#"["legit","otlp-import-end","run_finished","complete","completed"]"#)
        );
        assert!(
            got.contains(r#""tool_call","stop","consecutive_blocks"]"#),
            "{got}"
        );
        assert!(!got.lines().any(|l| l.starts_with(r#"["legit""#)
            && (l.contains(r#""block""#) || l.contains(r#""stop""#))));

        // The truncated last line: reported with its place, everything else read.
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        let place = format!(
            "{}:26: not an OTLP ExportTraceServiceRequest: EOF",
            file.display()
        );
        assert!(rejected[0].starts_with(&place), "{rejected:?}");
        // The re-sent first line maps to the same ids: dropped, as the daemon drops it.
        assert_eq!(duplicates, 1);

        let counts = &summary.otlp;
        assert_eq!(
            (summary.files, summary.lines, summary.bad_lines),
            (1, 26, 1)
        );
        assert_eq!(
            (
                counts.trace_requests,
                counts.log_requests,
                counts.metric_requests
            ),
            (24, 0, 1)
        );
        // 22 agent spans and the HTTP span, the re-sent one counted as read.
        assert_eq!((counts.spans, counts.mapped, counts.skipped), (24, 21, 2));
        assert_eq!(counts.refused.len(), 1);
        assert_eq!(counts.refused["no_operation"].0, 1);
        assert_eq!(
            (summary.calls, summary.results, counts.model_turns),
            (9, 9, 12)
        );
        assert_eq!(summary.sessions, 2);
        let text = summary.text(Agent::Otlp);
        for said in [
            "otlp: 2 runs in 1 files, 26 lines",
            "1 metrics requests skipped",
            "1 refused as the receiver refuses them (no_operation 1, e.g. span \"GET /search\"",
            "9 tool calls, 9 results, 12 model turns",
            "1 bad lines skipped",
        ] {
            assert!(text.contains(said), "{said:?} not in {text}");
        }
    }

    #[test]
    fn compressed_files_are_read_through_and_damaged_or_binary_ones_reported() {
        let dir = tempfile::tempdir().unwrap();
        let plain = fixtures().join("collector.jsonl");
        let gz = dir.path().join("traces.json.gz");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(&std::fs::read(&plain).unwrap()).unwrap();
        std::fs::write(&gz, encoder.finish().unwrap()).unwrap();
        // The file exporter's `compression: zstd`, both forms, written by the zstd CLI
        // (frames with checksums): each request a frame after its length (big-endian
        // u32), and the native form, one stream of lines in two frames (two flushes).
        let framed = fixtures().join("collector.framed.zst");
        let stream = fixtures().join("collector.stream.jsonl.zst");
        let (_, expected, expected_rejected, _) = import(vec![plain.clone()]);
        for file in [&gz, &framed, &stream] {
            let (summary, events, rejected, _) = import(vec![file.clone()]);
            assert_eq!(decided(&events), decided(&expected), "{}", file.display());
            assert_eq!(summary.lines, 26);
            // The truncated last request, named by its place in this file.
            let plain_place = format!("{}:", plain.display());
            let place = format!("{}:", file.display());
            assert_eq!(
                rejected,
                expected_rejected
                    .iter()
                    .map(|r| r.replace(&plain_place, &place))
                    .collect::<Vec<_>>()
            );
        }

        // A frame that is not zstd after its length, a truncated gzip file, and the
        // exporter's proto format.
        let damaged = dir.path().join("traces-zstd.json");
        std::fs::write(
            &damaged,
            [0, 0, 0, 9, 0x28, 0xb5, 0x2f, 0xfd, 9, 9, 9, 9, 9],
        )
        .unwrap();
        let cut = dir.path().join("cut.json.gz");
        let whole = std::fs::read(&gz).unwrap();
        std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
        let proto = dir.path().join("traces-proto.json");
        std::fs::write(&proto, [0, 0, 0, 3, 0x0a, 0x01, 0x00]).unwrap();
        // Not a file a directory is searched for.
        std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
        std::fs::remove_file(&gz).unwrap();
        let (summary, events, rejected, _) = import(vec![dir.path().to_path_buf()]);
        assert_eq!(summary.files, 3);
        assert_eq!(summary.otlp.unread_files, 1);
        let said = |what: String| {
            assert!(
                rejected.iter().any(|r| r.starts_with(&what)),
                "{what} in {rejected:?}"
            );
        };
        said(format!("{}: not OTLP/JSON lines", proto.display()));
        said(format!(
            "{}:1: unreadable, the rest of the file skipped: not a zstd frame",
            damaged.display()
        ));
        said(format!("{}:", cut.display()));
        // What came before the cut is read.
        assert!(!events.is_empty());
        assert!(summary
            .text(Agent::Otlp)
            .contains("in 3 files (1 not read)"));
    }

    #[test]
    fn files_are_read_in_the_order_their_first_request_began_and_runs_go_on_across_them() {
        // A rotated collector file (`name-<time>.json`) and the current one: the current
        // one sorts first by name but began later. One run spans both.
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = std::fs::read_to_string(fixtures().join("collector.jsonl"))
            .unwrap()
            .lines()
            .take(13)
            .map(str::to_owned)
            .collect();
        std::fs::write(dir.path().join("a-current.json"), lines[7..].join("\n")).unwrap();
        std::fs::write(dir.path().join("b-rotated.json"), lines[..7].join("\n")).unwrap();
        let (_, split, rejected, _) = import(vec![dir.path().to_path_buf()]);
        assert!(rejected.is_empty(), "{rejected:?}");
        let whole = dir.path().join("whole");
        std::fs::write(&whole, lines.join("\n")).unwrap();
        let (_, together, _, _) = import(vec![whole]);
        assert_eq!(decided(&split), decided(&together));
        // One run_finished for the runaway, after its last event, not one per file.
        let ends = split.iter().filter(|e| e.id == "otlp-import-end").count();
        assert_eq!(ends, 1);
        assert_eq!(split.last().map(|e| e.id.as_str()), Some("otlp-import-end"));
    }

    #[test]
    fn many_chunks_decoded_in_parallel_are_applied_in_file_order() {
        // 120 copies of the fixture's runs under other names: thousands of lines, many
        // chunks on every worker; the result must be the lines applied one by one.
        let text = std::fs::read_to_string(fixtures().join("collector.jsonl")).unwrap();
        let mut lines = Vec::new();
        for copy in 0..120 {
            for line in text.lines() {
                lines.push(
                    line.replace(
                        r#""stringValue":"runaway""#,
                        &format!(r#""stringValue":"runaway-{copy}""#),
                    )
                    .replace(
                        r#""stringValue":"legit""#,
                        &format!(r#""stringValue":"legit-{copy}""#),
                    ),
                );
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("many.json");
        std::fs::write(&file, lines.join("\n")).unwrap();
        let (summary, events, rejected, _) = import(vec![file.clone()]);
        assert!(lines.len() > 4 * super::CHUNK_LINES * 2);

        let mut one_by_one = ImportSummary::default();
        let (mut sequencer, mut batch, mut expected) =
            (Sequencer::default(), Admitted::default(), Vec::new());
        let mut bad = Vec::new();
        for (at, line) in lines.iter().enumerate() {
            match super::decode(line.as_bytes(), "t", 1 << 20) {
                Ok(decoded) => super::tally(decoded, &mut one_by_one, &mut expected),
                Err(why) => bad.push(format!("{}:{}: {why}", file.display(), at + 1)),
            }
        }
        super::close_runs("t", &one_by_one, &mut expected);
        crate::history::admit(&mut sequencer, &mut expected, &mut batch);
        assert_eq!(decided(&events), decided(&batch.events));
        assert_eq!(rejected, bad);
        assert_eq!(summary.sessions, 240);
        assert_eq!(summary.calls, 120 * 9);
    }

    #[test]
    fn a_logs_request_is_mapped_by_the_receivers_map_logs() {
        // Codex CLI 0.171.0's telemetry, as fusebox-otlp's own fixture has it, written
        // as the file exporter writes a logs request: one line.
        let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../fusebox-otlp/tests/fixtures/logs/codex_session.otlp.json");
        let text = std::fs::read_to_string(fixture).unwrap();
        let request: fusebox_otlp::ExportLogsServiceRequest = serde_json::from_str(&text).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("logs.json");
        std::fs::write(&file, format!("{value}\n")).unwrap();
        let (summary, events, rejected, _) = import(vec![file]);
        assert!(rejected.is_empty(), "{rejected:?}");

        let live = fusebox_otlp::map_logs(&request, "t", 1 << 20);
        assert!(!live.events.is_empty());
        let records: usize = request
            .resource_logs
            .iter()
            .flat_map(|r| &r.scope_logs)
            .map(|s| s.log_records.len())
            .sum();
        assert_eq!(summary.otlp.log_requests, 1);
        assert_eq!(summary.otlp.log_records, records as u64);
        assert_eq!(
            summary.otlp.mapped + summary.otlp.skipped,
            (live.mapped_spans + live.skipped_spans) as u64
        );
        // The receiver's events, then the import's end of each run.
        let runs = summary.sessions as usize;
        assert_eq!(events.len(), live.events.len() + runs);
        assert_eq!(events[..live.events.len()], live.events[..]);
        assert!(events[live.events.len()..]
            .iter()
            .all(|e| e.id == "otlp-import-end"));
    }

    #[test]
    fn lines_that_are_not_requests_say_why() {
        for (line, why) in [
            (&b"[1, 2]"[..], "not a JSON object"),
            (b"{}", "an empty OTLP/JSON request"),
            (
                b"{\"resourceThings\":[]}",
                "its first key is \"resourceThings\"",
            ),
            (b"{\"resourceMetrics\":[{", "not an OTLP/JSON request"),
            (
                b"{\"resourceSpans\":[{\"scopeSpans\":[{\"spans\":[{\"traceId\":\"zz\"}]}]}]}",
                "not an OTLP ExportTraceServiceRequest",
            ),
            (
                b"{\"resourceLogs\":7}",
                "not an OTLP ExportLogsServiceRequest",
            ),
        ] {
            let Err(err) = super::decode(line, "t", 1 << 20) else {
                panic!("{why}: decoded");
            };
            assert!(err.contains(why), "{why:?} not in {err:?}");
        }
    }
}
