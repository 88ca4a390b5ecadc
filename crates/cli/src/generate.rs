//! `pagewise generate man|completions DIR` (hidden): the man pages and shell completions that
//! `make install` installs, generated from this binary's own command definitions so they
//! cannot disagree with it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

/// Generate man pages or shell completions into a directory (used by `make install`).
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// One man page per command: DIR/pagewise.1, DIR/pagewise-doctor.1, DIR/pagewise-reclaim-set.1, ...
    Man { dir: PathBuf },
    /// Completions for bash (DIR/pagewise.bash), zsh (DIR/_pagewise) and fish (DIR/pagewise.fish).
    Completions { dir: PathBuf },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cmd = crate::Cli::command();
    match args.what {
        What::Man { dir } => {
            for path in man_pages(cmd, &dir)? {
                println!("{}", path.display());
            }
        }
        What::Completions { dir } => {
            for path in completions(cmd, &dir)? {
                println!("{}", path.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn create(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Write a page for `cmd` and, recursively, for each visible subcommand, named as clap names
/// them once built (`pagewise-reclaim-set.1`, as git and cargo name theirs). Returns the files
/// written.
fn man_pages(cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    create(dir)?;
    let mut cmd = cmd;
    cmd.build();
    let mut written = Vec::new();
    write_page(&cmd, dir, &mut written)?;
    Ok(written)
}

fn write_page(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_string();
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut buf).with_context(|| format!("rendering the man page of {name}"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        write_page(sub, dir, written)?;
    }
    Ok(())
}

fn completions(cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    use clap_complete::Shell;
    create(dir)?;
    let mut written = Vec::new();
    for (shell, file) in [(Shell::Bash, "pagewise.bash"), (Shell::Zsh, "_pagewise"), (Shell::Fish, "pagewise.fish")] {
        let mut cmd = cmd.clone();
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cmd, "pagewise", &mut buf);
        let path = dir.join(file);
        std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_per_visible_command_and_none_for_hidden_ones() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("man-test").unwrap();
        let dir = scratch.path().to_path_buf();
        let files = man_pages(crate::Cli::command(), &dir).unwrap();
        let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for expected in ["pagewise.1", "pagewise-doctor.1", "pagewise-reclaimd.1", "pagewise-reclaim-set.1"] {
            assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("generate")), "hidden command documented: {names:?}");
        let top = std::fs::read_to_string(dir.join("pagewise.1")).unwrap();
        assert!(top.contains(".TH pagewise") && top.contains("doctor"), "{top}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn completions_for_three_shells_name_the_subcommands() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("completions-test").unwrap();
        let dir = scratch.path().to_path_buf();
        let files = completions(crate::Cli::command(), &dir).unwrap();
        assert_eq!(files.len(), 3);
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(text.contains("reclaimd") && text.contains("doctor"), "{}", f.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
