//! Where things are: the repository, its deploy configs and fixtures, and the
//! workspace's own binaries.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The repository's top level.
pub fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    repo_dir().join("deploy")
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Whether `bin` is an executable file on the PATH or in the repo's venv.
pub fn on_path(bin: &str) -> bool {
    tool(bin).is_some()
}

/// An installed tool (nats-server, moto_server, prometheus …): from the PATH, else from
/// the repo's venv (`.venv/bin`, where scripts/setup.sh puts the PyPI-shipped servers),
/// so `cargo test` works without activating the venv first.
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([repo_dir().join(".venv/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// [`tool`], or a failure that says how to install it.
pub fn require_tool(name: &str) -> PathBuf {
    tool(name).unwrap_or_else(|| {
        panic!("{name} not found on PATH nor in .venv/bin: run `bash scripts/setup.sh`")
    })
}

/// A binary of this workspace (`fuseboxd`, `fusebox`, `fusebox-hook`, `fusebox-watchdog`,
/// `fusebox-stack`), from the target directory this test was built in (or
/// `$FUSEBOX_BIN_DIR`).
///
/// Cargo builds a package's binaries for that package's own integration tests only, so
/// the suites here cannot name them with `CARGO_BIN_EXE_*`; `cargo test --workspace`
/// builds them all in the same pass as the tests (each binary's crate has tests of its
/// own), with the same features. A binary older than a source it is built from would test
/// yesterday's code silently, so that is refused with the command that rebuilds it.
pub fn bin(name: &str) -> PathBuf {
    let dir = match std::env::var_os("FUSEBOX_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => target_profile_dir(),
    };
    let path = dir.join(name);
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is not built; build every binary with the tests: \
                 `cargo test --workspace --no-run` (scripts/test.sh does)",
                path.display()
            )
        });
    if let Some(newer) = source_newer_than(&path, built) {
        panic!(
            "{} is older than its source {}: rebuild it with `cargo test --workspace --no-run`",
            path.display(),
            newer.display()
        );
    }
    path
}

/// `target/<profile>/`: test executables run from its `deps/` folder.
fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().expect("the test's folder");
    if dir.ends_with("deps") {
        dir.parent().expect("the profile folder").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// A source file of `binary` modified after `built`, if any: the files are the ones
/// Cargo's dep-info file beside the binary (`<binary>.d`) lists, so only what the binary
/// is really built from counts. No dep-info (a binary from elsewhere): no check.
fn source_newer_than(binary: &Path, built: SystemTime) -> Option<PathBuf> {
    let mut dep_info = binary.as_os_str().to_owned();
    dep_info.push(".d");
    let text = std::fs::read_to_string(PathBuf::from(dep_info)).ok()?;
    let (_, sources) = text.lines().next()?.split_once(": ")?;
    // Make writes a space inside a path as `\ `.
    let sources = sources.replace("\\ ", "\u{0}");
    sources
        .split_whitespace()
        .map(|source| PathBuf::from(source.replace('\u{0}', " ")))
        .find(|source| {
            std::fs::metadata(source)
                .and_then(|m| m.modified())
                .is_ok_and(|modified| modified > built)
        })
}
