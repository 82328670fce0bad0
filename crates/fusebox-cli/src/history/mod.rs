//! Coding agents' own history as an event source for `fusebox replay`, `whatif` and
//! `tune` (`--from claude-code PATH`): the sessions an agent keeps on disk become the
//! events its hook would have sent, so a user can ask what the guard would have done to
//! last month's sessions before installing the hook.
//!
//! The mapping is the hook's, not a second one: each transcript record is turned into
//! the hook payload the agent would have sent at that moment and handed to the hook
//! crate's own `event_for` (fusebox-hook), so an imported session and the same session
//! gated live through the hook reach the engine as the same events (same run ids, same
//! event ids, same call keys, the same agent name and so its built-in tool knowledge),
//! and get the same decisions. Only the times differ: the transcript's, not the hook's
//! clock.
//!
//! Files are read in the order their sessions began; every line that is not a record is
//! reported as `file:line: …` and skipped, the rest applied. What comes out goes through
//! the same admission (the sequencer) and the same batches as `fusebox replay`'s JSONL
//! reader, so the three commands take it unchanged.

pub mod claude_code;
pub mod codex;
pub mod gemini_cli;
pub mod otlp;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use fusebox_core::{Admission, Event, Sequencer};
use indicatif::{ProgressBar, ProgressStyle};

use crate::replay::Admitted;

/// The agents whose history can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Agent {
    /// Claude Code's project transcripts: `~/.claude/projects/<project>/<session>.jsonl`.
    ClaudeCode,
    /// Codex CLI's rollouts: `~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`.
    Codex,
    /// Gemini CLI's chats: `~/.gemini/tmp/<project>/chats/session-*.jsonl`.
    GeminiCli,
    /// OTLP/JSON files an OpenTelemetry Collector's `file` exporter wrote (one export
    /// request per line), mapped as fuseboxd's OTLP receiver maps them. No default path.
    Otlp,
}

impl Agent {
    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::GeminiCli => "gemini-cli",
            Agent::Otlp => "otlp",
        }
    }

    /// Where the agent keeps its sessions when no path is given.
    pub fn default_path(self) -> Option<PathBuf> {
        match self {
            Agent::ClaudeCode => claude_code::default_dir(),
            Agent::Codex => codex::default_dir(),
            Agent::GeminiCli => gemini_cli::default_dir(),
            Agent::Otlp => None,
        }
    }
}

/// What to import: one agent's sessions under some paths (files or directories), as runs
/// of `tenant` (the hook's `--tenant`; it matters for op_keys, which are per tenant).
#[derive(Debug, Clone)]
pub struct Import {
    pub agent: Agent,
    pub paths: Vec<PathBuf>,
    pub tenant: String,
}

impl Import {
    pub fn describe(&self) -> String {
        let paths: Vec<String> = self.paths.iter().map(|p| p.display().to_string()).collect();
        if self.agent == Agent::Otlp {
            return format!("otlp files in {}", paths.join(" "));
        }
        format!("{} sessions in {}", self.agent.name(), paths.join(" "))
    }
}

/// `--from AGENT` and `--tenant`, shared by `replay`, `whatif` and `tune`.
#[derive(clap::Args, Debug, Clone)]
pub struct FromArgs {
    /// Read the agent's own session history instead of JSONL events: the files named
    /// are its session files or directories of them (default: where the agent keeps
    /// them, e.g. ~/.claude/projects). Each session becomes the events its hook would
    /// have sent; see docs/history.md.
    #[arg(long, value_enum, value_name = "AGENT")]
    pub from: Option<Agent>,
    /// With --from: the tenant the sessions' runs belong to (the hook's --tenant).
    #[arg(long, value_name = "TENANT", default_value = DEFAULT_TENANT, requires = "from")]
    pub tenant: String,
}

impl FromArgs {
    /// The reader's input: the agent's history under `files` (or its default place),
    /// else the JSONL `files` themselves.
    pub fn input(&self, files: &[String]) -> Result<crate::replay::Input, String> {
        let Some(agent) = self.from else {
            if files.is_empty() {
                return Err("give JSONL files (\"-\" reads stdin), or --from AGENT".to_owned());
            }
            return Ok(crate::replay::Input::Files(files.to_vec()));
        };
        let paths = if files.is_empty() {
            let default = agent.default_path().ok_or_else(|| match agent {
                Agent::Otlp => {
                    "--from otlp: name the collector's files, or directories of them".to_owned()
                }
                _ => format!(
                    "--from {}: no HOME to find its sessions in; name the path",
                    agent.name()
                ),
            })?;
            vec![default]
        } else {
            files.iter().map(PathBuf::from).collect()
        };
        Ok(crate::replay::Input::History(Import {
            agent,
            paths,
            tenant: self.tenant.clone(),
        }))
    }
}

/// The hook's default tenant (`fusebox hook --tenant`), so an import lands where the
/// hook's runs would have.
pub const DEFAULT_TENANT: &str = "default";

/// What an import read, for the summary a person reads first.
#[derive(Debug, Default, Clone)]
pub struct ImportSummary {
    pub files: u64,
    pub sessions: u64,
    pub lines: u64,
    pub bytes: u64,
    pub calls: u64,
    pub results: u64,
    pub prompts: u64,
    pub compactions: u64,
    /// Lines that are not a record (truncated, not JSON, no type): reported with their
    /// place and skipped.
    pub bad_lines: u64,
    /// Records that say nothing the hook would have said (attachments, API request
    /// shapes, …), by type. Not errors: an agent writes many kinds.
    pub ignored: BTreeMap<String, u64>,
    /// Results of calls a PreToolUse hook refused (the call never ran, so the live hook
    /// sent no result), and results whose call is not in the file.
    pub skipped_results: u64,
    /// `--from otlp`: requests, spans and records, refusals by reason, runs.
    pub otlp: otlp::Counts,
    /// How long reading took (the applier's pace included: the reader waits on it).
    pub seconds: f64,
}

impl ImportSummary {
    /// One paragraph, what a person reads before any decision.
    pub fn text(&self, agent: Agent) -> String {
        if agent == Agent::Otlp {
            return otlp::text(self);
        }
        let ignored: u64 = self.ignored.values().sum();
        let mut kinds: Vec<(&String, &u64)> = self.ignored.iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let kinds: Vec<String> = kinds
            .iter()
            .take(6)
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        format!(
            "{agent}: {sessions} sessions in {files} files, {lines} lines ({mib:.1} MiB): \
             {calls} tool calls, {results} results, {prompts} prompts, {compactions} compactions; \
             {bad} bad lines skipped; {skipped} results not sent (their call was refused by a \
             hook or is not in the file); {ignored} records of other kinds ignored ({kinds}); \
             read in {seconds:.3} s ({rate:.0} lines/s)",
            agent = agent.name(),
            sessions = self.sessions,
            files = self.files,
            lines = self.lines,
            mib = self.bytes as f64 / (1 << 20) as f64,
            calls = self.calls,
            results = self.results,
            prompts = self.prompts,
            compactions = self.compactions,
            bad = self.bad_lines,
            skipped = self.skipped_results,
            kinds = kinds.join(", "),
            seconds = self.seconds,
            rate = self.lines as f64 / self.seconds.max(1e-9),
        )
    }
}

/// One session file's reader: lines in, the events the hook would have sent out. The
/// agent modules implement it; [`read_and_admit`] drives it.
pub(crate) trait SessionReader {
    /// The events of one line (`offset`: its byte offset in the file, which stands for
    /// the transcript's length at that moment). An error is the line's: it is reported
    /// with its place and the line skipped.
    fn line(
        &mut self,
        line: &[u8],
        offset: u64,
        summary: &mut ImportSummary,
        out: &mut Vec<Event>,
    ) -> Result<(), String>;
    /// The end of the file: the events that close its sessions.
    fn end(&mut self, summary: &mut ImportSummary, out: &mut Vec<Event>);
    /// Bad lines of other files the reader read on its own (a sub-agent's transcript),
    /// each with its place, since the last call.
    fn take_rejected(&mut self) -> Vec<String> {
        Vec::new()
    }
}

fn reader_for(agent: Agent, tenant: &str, file: &Path) -> Box<dyn SessionReader> {
    match agent {
        // Its own reader, `otlp::read_and_admit`: requests are decoded in parallel.
        Agent::Otlp => unreachable!("--from otlp is read by otlp::read_and_admit"),
        Agent::ClaudeCode => Box::new(claude_code::Reader::new(tenant, file)),
        Agent::Codex => Box::new(codex::Reader::new(tenant)),
        Agent::GeminiCli => Box::new(gemini_cli::Reader::new(tenant)),
    }
}

/// The session files under `paths`, in the order their sessions began (the first
/// timestamp in the file; the file's modification time when it has none). A directory
/// is searched through; a file named is read whatever its name.
pub fn session_files(agent: Agent, paths: &[PathBuf]) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        if meta.is_dir() {
            walk(agent, path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    // One file named twice (a path and a symlink to it) is one session, read once.
    let mut seen = std::collections::HashSet::new();
    files.retain(|file| seen.insert(std::fs::canonicalize(file).unwrap_or_else(|_| file.clone())));
    let mut keyed: Vec<(String, PathBuf)> = files
        .into_iter()
        .map(|file| match agent {
            Agent::Otlp => (otlp::began(&file), file),
            _ => (began(&file), file),
        })
        .collect();
    keyed.sort();
    Ok(keyed.into_iter().map(|(_, file)| file).collect())
}

fn walk(agent: Agent, dir: &Path, files: &mut Vec<PathBuf>) -> io::Result<()> {
    let mut entries = std::fs::read_dir(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?
        .collect::<io::Result<Vec<_>>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            match agent {
                Agent::ClaudeCode if claude_code::skip_dir(&path) => {}
                _ => walk(agent, &path, files)?,
            }
        } else if match agent {
            Agent::ClaudeCode => claude_code::is_session_file(&path),
            Agent::Codex => codex::is_session_file(&path),
            Agent::GeminiCli => gemini_cli::is_session_file(&path),
            Agent::Otlp => otlp::is_otlp_file(&path),
        } {
            files.push(path);
        }
    }
    Ok(())
}

/// A sort key for when a session file began: its first `"timestamp"` (ISO 8601 UTC
/// sorts as text), else its modification time in the same form.
pub(crate) fn began(file: &Path) -> String {
    const NEEDLE: &str = "\"timestamp\":\"";
    if let Ok(handle) = File::open(file) {
        for line in BufReader::new(handle).lines().take(64) {
            let Ok(line) = line else { break };
            let compact = line.replace("\": \"", "\":\"");
            if let Some(at) = compact.find(NEEDLE) {
                let rest = &compact[at + NEEDLE.len()..];
                if let Some(end) = rest.find('"') {
                    return rest[..end].to_owned();
                }
            }
        }
    }
    let modified = std::fs::metadata(file)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis());
    // Not a timestamp, but after every one: files without one go last, by age.
    format!("~{modified:020}")
}

/// An import's files, its summary with their count, and a progress bar over their
/// bytes (when there are enough of them and stderr is a terminal).
pub(crate) fn start_import(
    agent: Agent,
    paths: &[PathBuf],
) -> io::Result<(Vec<PathBuf>, ImportSummary, Option<ProgressBar>)> {
    let files = session_files(agent, paths)?;
    let summary = ImportSummary {
        files: files.len() as u64,
        ..ImportSummary::default()
    };
    let total: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    Ok((files, summary, progress_bar(total)))
}

fn progress_bar(bytes: u64) -> Option<ProgressBar> {
    if bytes < 8 << 20 || !io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Some(bar)
}

const BATCH: usize = 1024;

/// `replay::read_and_admit`'s sibling for an agent's history: reads every session file
/// in order, maps its lines to the hook's events, admits them through a sequencer and
/// sends them in batches. Returns what it read.
#[cfg(test)]
pub(crate) fn read_and_admit(
    import: Import,
    batches: mpsc::SyncSender<Admitted>,
    spent: mpsc::Receiver<Vec<Event>>,
) -> io::Result<ImportSummary> {
    read_and_admit_bounded(
        import,
        fusebox_core::parse::DEFAULT_MAX_EVENT_BYTES,
        batches,
        spent,
    )
}

/// [`read_and_admit`] with the configured `[guard] max_event_bytes`, the bound the
/// daemon's OTLP receiver refuses an event past (the hooks bound their own events).
pub(crate) fn read_and_admit_bounded(
    import: Import,
    max_event_bytes: usize,
    batches: mpsc::SyncSender<Admitted>,
    spent: mpsc::Receiver<Vec<Event>>,
) -> io::Result<ImportSummary> {
    if import.agent == Agent::Otlp {
        return otlp::read_and_admit(import, max_event_bytes, batches, spent);
    }
    let started = std::time::Instant::now();
    let (files, mut summary, bar) = start_import(import.agent, &import.paths)?;
    let mut sequencer = Sequencer::default();
    let mut batch = Admitted::default();
    let mut events = Vec::new();
    let mut line = Vec::with_capacity(1 << 16);
    let mut since_send = 0usize;
    for file in &files {
        if let Some(bar) = &bar {
            bar.set_message(
                file.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
        }
        let handle = File::open(file)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        let mut input = BufReader::with_capacity(1 << 16, handle);
        let mut reader = reader_for(import.agent, &import.tenant, file);
        let mut offset = 0u64;
        let mut number = 0u64;
        loop {
            line.clear();
            let read = input.read_until(b'\n', &mut line)?;
            if read == 0 {
                break;
            }
            number += 1;
            summary.lines += 1;
            summary.bytes += read as u64;
            if let Some(bar) = &bar {
                bar.inc(read as u64);
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                if let Err(why) = reader.line(&line, offset, &mut summary, &mut events) {
                    summary.bad_lines += 1;
                    batch
                        .rejected
                        .push(format!("{}:{number}: {why}", file.display()));
                }
            }
            batch.rejected.extend(reader.take_rejected());
            offset += read as u64;
            since_send += admit(&mut sequencer, &mut events, &mut batch);
            if since_send >= BATCH {
                since_send = 0;
                if batches.send(std::mem::take(&mut batch)).is_err() {
                    return Ok(summary);
                }
                for mut spent_events in spent.try_iter() {
                    spent_events.clear();
                    batch.events = spent_events;
                }
            }
        }
        reader.end(&mut summary, &mut events);
        admit(&mut sequencer, &mut events, &mut batch);
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // The hook's events carry no `seq`, so nothing waits on a gap; this is the same
    // end-of-input rule as replay's all the same.
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
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Admits `events` (drained) into `batch`; returns how many were taken.
fn admit(sequencer: &mut Sequencer, events: &mut Vec<Event>, batch: &mut Admitted) -> usize {
    let n = events.len();
    for event in events.drain(..) {
        let id = event.id.clone();
        match sequencer.admit(event) {
            Ok(Admission::Ready(ready)) => batch.events.extend(ready),
            Ok(Admission::Held { .. }) => {}
            Ok(Admission::Duplicate) => batch.duplicates += 1,
            Err(err) => batch.rejected.push(format!("event {id}: {err}")),
        }
    }
    n
}

/// Parses an ISO 8601 UTC time (`2026-12-04T21:35:50.298Z`, what the agents write) to
/// milliseconds since the epoch; `None` for anything else. Hand-written: the agents
/// write one form, and a date library would be a dependency for one function.
pub(crate) fn iso_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<u64> {
        let s = text.get(from..to)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let rest = &text[19..];
    let (millis, zone) = match rest.strip_prefix('.') {
        Some(frac) => {
            let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
            let ms: String = frac[..digits]
                .chars()
                .chain("000".chars())
                .take(3)
                .collect();
            (ms.parse::<u64>().ok()?, &frac[digits..])
        }
        None => (0, rest),
    };
    if zone != "Z" && zone != "+00:00" {
        return None;
    }
    // Days from the civil date (Howard Hinnant's days_from_civil).
    let (y, m) = if month <= 2 {
        (year as i64 - 1, month + 9)
    } else {
        (year as i64, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m as i64 + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + (hour * 3600 + minute * 60 + second) as i64;
    u64::try_from(seconds).ok().map(|s| s * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_times_parse_to_epoch_milliseconds() {
        for (text, ms) in [
            ("1970-01-01T00:00:00.000Z", Some(0)),
            ("2026-12-04T21:35:50.298Z", Some(1_796_420_150_298)),
            ("2000-02-29T12:00:00Z", Some(951_825_600_000)),
            ("2026-12-04T21:35:50.2Z", Some(1_796_420_150_200)),
            ("2026-12-04T21:35:50.298+00:00", Some(1_796_420_150_298)),
            ("2026-12-04 21:35:50Z", None),
            ("2026-13-04T21:35:50Z", None),
            ("2026-12-04T21:35:50.298+02:00", None),
            ("yesterday", None),
        ] {
            assert_eq!(iso_ms(text), ms, "{text}");
        }
    }
}
