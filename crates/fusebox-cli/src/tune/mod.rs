//! `fusebox tune`: thresholds calibrated on the fleet's own history.
//!
//! `history` holds the recorded runs in memory with the baseline's decisions, `keys`
//! finds the policy's numeric thresholds and sets them under its ordering rules,
//! `search` lowers each as far as the completed runs allow (checked by replay),
//! `fragment` writes the proposal as TOML. The proposal's `whatif` report follows.

mod fragment;
mod history;
mod keys;
mod search;

use std::process::ExitCode;

use crate::whatif::{self, compare::Baseline, compare::Comparison, source, InputArgs};
use history::History;

/// `fusebox tune`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Completed runs each calibrated policy may stop or refuse a call of (k of n).
    #[arg(long, short = 'k', default_value_t = 0)]
    pub allow: usize,
    /// Completed runs an agent needs for an [agents.<name>.policy] of its own.
    #[arg(long, default_value_t = 10)]
    pub min_runs: usize,
    #[command(flatten)]
    pub input: InputArgs,
}

pub fn main(args: Args) -> Result<ExitCode, String> {
    let source = args.input.source()?;
    let choice = args.input.baseline();
    let input = choice.load()?.input;
    let (baseline, baseline_text) = whatif::baseline_for(&source, &choice)?;
    let fixed = match &baseline {
        Baseline::Fixed(set) => Some(set.clone()),
        Baseline::AsRecorded => None,
    };
    let mut items = Vec::new();
    let tally = source::read(&source, &input, &mut |item, _| items.push(item))?;
    let source_text = whatif::describe_read(&source, &tally);
    let history = History::new(items, baseline);
    let completed = history.completed().count();
    if completed == 0 {
        return Err(format!(
            "{source_text}: no run in it completed normally (run_finished or a terminal result), so there is nothing to calibrate on"
        ));
    }
    let calibration = search::calibrate(&history, args.allow, args.min_runs)?;
    let header = fragment::Header {
        source: &source_text,
        baseline: &baseline_text,
        runaways: history.runaways(),
        k: args.allow,
        min_runs: args.min_runs,
    };
    let toml = fragment::render(&calibration, &header);

    let baseline = match fixed {
        Some(set) => Baseline::Fixed(set),
        None => Baseline::AsRecorded,
    };
    let mut comparison = Comparison::new(baseline, calibration.policy_set());
    for item in &history.items {
        comparison.feed(item);
    }
    let report = whatif::build_report(
        comparison.candidate,
        &source_text,
        baseline_text,
        "the proposal above".to_owned(),
    );
    let text = if args.input.json {
        let json = serde_json::json!({ "toml": toml, "whatif": report });
        let mut text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
        text.push('\n');
        text
    } else {
        // The report as comments, so the output stays a valid TOML fragment.
        let mut text = toml;
        text.push('\n');
        for line in whatif::table::render(&report, args.input.limit).lines() {
            text.push('#');
            if !line.is_empty() {
                text.push(' ');
            }
            text.push_str(line);
            text.push('\n');
        }
        text
    };
    whatif::emit(&text)?;
    Ok(ExitCode::from(whatif::exit_status(&report, &tally)))
}
