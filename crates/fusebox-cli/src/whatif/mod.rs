//! `fusebox whatif`: what a candidate policy would have done to recorded runs.
//!
//! `source` reads the records (JSONL or a copy of a data directory), `compare` feeds them
//! to a baseline and a candidate engine and keeps a trace per run, `report` says what
//! changed, `table` prints it for a person (`--json` prints the report itself).

pub mod compare;
pub mod report;
pub mod source;
pub mod table;

use std::path::{Path, PathBuf};

use fusebox_core::{PolicySet, Preset};

use crate::config;
use compare::{Baseline, CandidateHalf, Disagreements, Pipeline};
use report::{ChangeKind, Report};
use source::{ReadTally, Source};

/// A policy named on the command line: a fusebox.toml and/or a preset.
#[derive(Debug, Clone, Default)]
pub struct PolicyChoice {
    pub file: Option<PathBuf>,
    pub preset: Option<Preset>,
}

impl PolicyChoice {
    pub fn is_given(&self) -> bool {
        self.file.is_some() || self.preset.is_some()
    }

    pub fn describe(&self) -> String {
        match (&self.file, self.preset) {
            (Some(file), Some(preset)) => {
                format!("{} over preset {}", file.display(), preset.name())
            }
            (Some(file), None) => file.display().to_string(),
            (None, Some(preset)) => format!("preset {}", preset.name()),
            (None, None) => "preset balanced (the default)".to_owned(),
        }
    }

    /// The policies and the event size bound the file sets.
    pub fn load(&self) -> Result<config::GuardConfig, String> {
        config::load(self.file.as_deref(), self.preset)
    }
}

pub struct Options {
    pub source: Source,
    pub baseline: PolicyChoice,
    pub candidate: PolicyChoice,
    pub json: bool,
    pub limit: usize,
}

/// The baseline for a source: as the log recorded it for a data directory (unless one
/// is named), else the named one (default: the balanced preset).
pub fn baseline_for(source: &Source, choice: &PolicyChoice) -> Result<(Baseline, String), String> {
    if source.is_data_dir() && !choice.is_given() {
        return Ok((
            Baseline::AsRecorded,
            "as recorded in the log (its set_policies operations)".to_owned(),
        ));
    }
    let loaded = choice.load()?;
    Ok((Baseline::Fixed(loaded.policies), choice.describe()))
}

/// Compares `candidate` with `baseline` over every record of `source`.
pub fn compare_source(
    source: &Source,
    input: &config::InputRules,
    baseline: Baseline,
    candidate: PolicySet,
) -> Result<(CandidateHalf, Disagreements, ReadTally), String> {
    let mut pipeline = Pipeline::new(baseline, candidate);
    let tally = source::read(source, input, &mut |item, recorded| {
        pipeline.feed(item, recorded)
    })?;
    let (candidate, disagreements) = pipeline.finish()?;
    Ok((candidate, disagreements, tally))
}

/// Runs the command: prints the report; returns the exit status (0: no completed run
/// would be stopped; 1: some would; 2: bad input lines were skipped).
pub fn run(options: &Options) -> Result<u8, String> {
    let started = std::time::Instant::now();
    let candidate = options.candidate.load()?;
    let (baseline, baseline_text) = baseline_for(&options.source, &options.baseline)?;
    let (comparison, disagreements, tally) = compare_source(
        &options.source,
        &candidate.input,
        baseline,
        candidate.policies,
    )?;
    let mut report = build_report(
        comparison,
        &describe_read(&options.source, &tally),
        baseline_text,
        options.candidate.describe(),
    );
    report.recorded_decisions = disagreements;
    let seconds = started.elapsed().as_secs_f64();
    print(&report, options.json, options.limit)?;
    eprintln!(
        "{} events compared under both policies in {seconds:.3} s ({:.0} events/s); {} rejected, {} duplicates",
        report.events,
        report.events as f64 / seconds.max(1e-9),
        tally.rejected,
        tally.duplicates
    );
    Ok(exit_status(&report, &tally))
}

/// The source as read: a data directory says how far its copy reached.
pub fn describe_read(source: &Source, tally: &ReadTally) -> String {
    if let (Source::History(import), Some(summary)) = (source, &tally.imported) {
        // The import's own summary: the first thing the report says.
        return format!("{} — {}", import.describe(), summary.text(import.agent));
    }
    match tally.position {
        Some(position) => format!(
            "{} (read from a copy, positions 1..={position})",
            source.describe()
        ),
        None => source.describe(),
    }
}

pub fn build_report(
    comparison: CandidateHalf,
    source: &str,
    baseline: String,
    candidate: String,
) -> Report {
    let events = comparison.events;
    report::build(
        &comparison.traces.into_sorted(),
        source.to_owned(),
        baseline,
        candidate,
        events,
    )
}

pub fn print(report: &Report, json: bool, limit: usize) -> Result<(), String> {
    let text = if json {
        let mut text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        text.push('\n');
        text
    } else {
        table::render(report, limit)
    };
    emit(&text)
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
pub fn emit(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}

pub fn exit_status(report: &Report, tally: &ReadTally) -> u8 {
    if tally.rejected > 0 {
        2
    } else if report.count(ChangeKind::CompletedRunStopped) > 0 {
        1
    } else {
        0
    }
}

/// The source named by `--data-dir`, `--from` or the files.
pub fn source_of(
    data_dir: Option<&Path>,
    from: &crate::history::FromArgs,
    files: &[String],
) -> Result<Source, String> {
    if from.from.is_some() {
        if data_dir.is_some() {
            return Err("give either --data-dir or --from, not both".to_owned());
        }
        return match from.input(files)? {
            crate::replay::Input::History(import) => Ok(Source::History(import)),
            crate::replay::Input::Files(files) => Ok(Source::Files(files)),
        };
    }
    match (data_dir, files.is_empty()) {
        (Some(dir), true) => Ok(Source::DataDir(dir.to_owned())),
        (None, false) => Ok(Source::Files(files.to_vec())),
        (Some(_), false) => Err("give either --data-dir or JSONL files, not both".to_owned()),
        (None, true) => Err("give --data-dir DIR or JSONL files (\"-\" reads stdin)".to_owned()),
    }
}

fn parse_preset(name: &str) -> Result<Preset, String> {
    Preset::from_name(name).ok_or_else(|| format!("{name:?}: expected strict, balanced or lenient"))
}

/// Where the recorded runs come from and which policy they are compared with; shared
/// by `whatif` and `tune`.
#[derive(clap::Args, Debug)]
pub struct InputArgs {
    /// A fuseboxd data directory, live or stopped: it is copied and the copy is read;
    /// the directory itself is never opened.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The policy the runs are compared with: a fusebox.toml ([guard] preset, [policy],
    /// [agents.*.policy]). Default: for a data dir, the policies the log recorded; for
    /// JSONL, the balanced preset.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// The baseline's preset (strict, balanced, lenient), over which --baseline layers.
    #[arg(long, value_name = "PRESET", value_parser = parse_preset)]
    pub baseline_preset: Option<Preset>,
    #[command(flatten)]
    pub from: crate::history::FromArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Rows shown per section of the table (0: all).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// JSONL files (`fusebox log export`, traces), in order; "-" reads stdin. With
    /// --from: the agent's session files or directories.
    #[arg(value_name = "FILE")]
    pub files: Vec<String>,
}

impl InputArgs {
    pub fn source(&self) -> Result<Source, String> {
        source_of(self.data_dir.as_deref(), &self.from, &self.files)
    }

    pub fn baseline(&self) -> PolicyChoice {
        PolicyChoice {
            file: self.baseline.clone(),
            preset: self.baseline_preset,
        }
    }
}

/// `fusebox whatif`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The candidate: a fusebox.toml whose [guard] preset, [policy] and
    /// [agents.<name>.policy] apply.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The candidate's preset, over which --policy layers.
    #[arg(long, value_name = "PRESET", value_parser = parse_preset)]
    pub preset: Option<Preset>,
    #[command(flatten)]
    pub input: InputArgs,
}

/// The subcommand: exit status 0, 1 (a completed run would be stopped) or 2.
pub fn main(args: Args) -> Result<std::process::ExitCode, String> {
    if args.policy.is_none() && args.preset.is_none() {
        return Err("name the candidate with --policy FILE and/or --preset NAME".to_owned());
    }
    let options = Options {
        source: args.input.source()?,
        baseline: args.input.baseline(),
        candidate: PolicyChoice {
            file: args.policy,
            preset: args.preset,
        },
        json: args.input.json,
        limit: args.input.limit,
    };
    run(&options).map(std::process::ExitCode::from)
}
