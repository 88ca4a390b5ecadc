//! `pagewise doctor`: what this kernel offers each Pagewise system. Changes nothing.

use std::process::ExitCode;

use pagewise_kernel::probe::{probe, Status};

/// Report every kernel feature Pagewise uses: present, absent, or present but unusable, why,
/// and which Pagewise feature depends on it. Changes nothing on the system.
#[derive(clap::Args)]
pub struct Args {
    /// Print JSON (stable snake_case keys) instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let caps = probe();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&caps.to_json())?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("kernel {}{}", caps.kernel_release, if caps.root { ", running as root" } else { ", not root" });
    println!();
    let key_w = caps.features.iter().map(|(k, _)| k.len()).max().unwrap_or(10);
    println!("{:<key_w$}  {:<8}  {:<44}  used by", "feature", "status", "detail");
    for (key, f) in &caps.features {
        let status = match f.status {
            Status::Present => "yes",
            Status::Absent => "no",
            Status::Unusable => "unusable",
        };
        let mut detail = f.detail.clone();
        if detail.chars().count() > 44 {
            // Long details wrap under their column rather than being cut.
            let mut lines = Vec::new();
            let mut line = String::new();
            for word in detail.split_whitespace() {
                if !line.is_empty() && line.len() + word.len() + 1 > 44 {
                    lines.push(std::mem::take(&mut line));
                }
                if !line.is_empty() {
                    line.push(' ');
                }
                line.push_str(word);
            }
            lines.push(line);
            detail = lines.join(&format!("\n{:<key_w$}  {:<8}  ", "", ""));
            let (first, rest) = detail
                .split_once('\n')
                .map(|(a, b)| (a.to_string(), format!("\n{b}")))
                .unwrap_or((detail.clone(), String::new()));
            println!("{key:<key_w$}  {status:<8}  {first:<44}  {}{rest}", f.used_by.join(", "));
        } else {
            println!("{key:<key_w$}  {status:<8}  {detail:<44}  {}", f.used_by.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}
