//! Finds the PromQL in the dashboards and alert rules, and the metric selectors in it.
//! Shared by the lint tests and meant for the later end-to-end test that evaluates every
//! expression against a real Prometheus (`#[path = ".../tests/common/promql.rs"] mod promql;`,
//! with `$__rate_interval` replaced by a real duration first).

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use serde_norway::Value as Yaml;

/// One PromQL expression and where it was written.
#[derive(Debug, Clone)]
pub struct Expr {
    /// e.g. `fleet-guard.json panel 4 "Gate latency" target A` or `alerts.yml FuseboxDown`.
    pub origin: String,
    pub expr: String,
    pub in_dashboard: bool,
}

/// A metric selector inside an expression, with the function call it is an argument of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    /// The innermost enclosing call (`rate`, `sum`, …); `None` at top level or in a bare parenthesis.
    pub enclosing_call: Option<String>,
    /// The range, e.g. `5m` or `$__rate_interval`, when it is a range selector.
    pub range: Option<String>,
}

/// Files in `dir` with extension `ext`, sorted so failures read the same every run.
pub fn files_with_extension(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

pub fn read_json(path: &Path) -> Json {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn read_yaml(path: &Path) -> Yaml {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every panel of a dashboard, including those nested in collapsed rows.
pub fn panels(dashboard: &Json) -> Vec<&Json> {
    fn walk<'a>(list: &'a Json, out: &mut Vec<&'a Json>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            if let Some(nested) = panel.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    if let Some(list) = dashboard.get("panels") {
        walk(list, &mut out);
    }
    out
}

/// Every target expression of every `*.json` dashboard in `dir`.
pub fn dashboard_expressions(dir: &Path) -> Vec<Expr> {
    let mut exprs = Vec::new();
    for path in files_with_extension(dir, "json") {
        let dashboard = read_json(&path);
        for panel in panels(&dashboard) {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    exprs.push(Expr {
                        origin: format!(
                            "{} panel {} {:?} target {}",
                            file_name(&path),
                            panel["id"],
                            panel["title"].as_str().unwrap_or(""),
                            target["refId"].as_str().unwrap_or("?"),
                        ),
                        expr: expr.to_string(),
                        in_dashboard: true,
                    });
                }
            }
        }
    }
    exprs
}

/// Rule files among the `*.yml` in `dir`: those with a top-level `groups` list (this
/// leaves out prometheus.yml and the promtool test file).
pub fn rule_files(dir: &Path) -> Vec<PathBuf> {
    files_with_extension(dir, "yml")
        .into_iter()
        .filter(|p| read_yaml(p).get("groups").is_some_and(Yaml::is_sequence))
        .collect()
}

/// Every rule of every rule file in `dir`, as (file name, rule mapping).
pub fn rules(dir: &Path) -> Vec<(String, Yaml)> {
    let mut out = Vec::new();
    for path in rule_files(dir) {
        let doc = read_yaml(&path);
        for group in doc["groups"].as_sequence().into_iter().flatten() {
            for rule in group["rules"].as_sequence().into_iter().flatten() {
                out.push((file_name(&path), rule.clone()));
            }
        }
    }
    out
}

/// The `expr` of every alerting and recording rule in `dir`.
pub fn rule_expressions(dir: &Path) -> Vec<Expr> {
    rules(dir)
        .into_iter()
        .map(|(file, rule)| {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .unwrap_or("?");
            Expr {
                origin: format!("{file} {name}"),
                expr: rule["expr"].as_str().unwrap_or("").to_string(),
                in_dashboard: false,
            }
        })
        .collect()
}

/// The `fusebox_*` selectors in `expr`. A small scanner, not a parser: it tracks string
/// literals, label-matcher braces and the call each parenthesis belongs to, which is all
/// the lint rules need.
pub fn fusebox_selectors(expr: &str) -> Vec<Selector> {
    let chars: Vec<char> = expr.chars().collect();
    let mut calls: Vec<Option<String>> = Vec::new();
    let mut last_ident: Option<String> = None;
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
            last_ident = None;
        } else if c == '{' {
            i = skip_braces(&chars, i);
            last_ident = None;
        } else if c == '(' {
            calls.push(last_ident.take());
            i += 1;
        } else if c == ')' {
            calls.pop();
            last_ident = None;
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            if ident.starts_with("fusebox_") {
                let (range, next) = selector_range(&chars, i);
                found.push(Selector {
                    metric: ident,
                    enclosing_call: calls.last().cloned().flatten(),
                    range,
                });
                i = next;
                last_ident = None;
            } else {
                last_ident = Some(ident);
            }
        } else {
            if !c.is_whitespace() {
                last_ident = None;
            }
            i += 1;
        }
    }
    found
}

/// After a metric name: skips `{…}` and returns the text of a following `[…]`.
fn selector_range(chars: &[char], mut i: usize) -> (Option<String>, usize) {
    let skip_ws = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    i = skip_ws(i);
    if i < chars.len() && chars[i] == '{' {
        i = skip_ws(skip_braces(chars, i));
    }
    if i < chars.len() && chars[i] == '[' {
        let end = chars[i..]
            .iter()
            .position(|&c| c == ']')
            .map_or(chars.len(), |p| i + p);
        let range: String = chars[i + 1..end].iter().collect();
        return (Some(range.trim().to_string()), (end + 1).min(chars.len()));
    }
    (None, i)
}

fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

fn skip_braces(chars: &[char], start: usize) -> usize {
    let mut i = start + 1;
    while i < chars.len() && chars[i] != '}' {
        i = if matches!(chars[i], '"' | '\'' | '`') {
            skip_string(chars, i)
        } else {
            i + 1
        };
    }
    i + 1
}
