//! `pagewise doctor`: what this kernel offers each Pagewise system. Changes nothing.

use std::process::ExitCode;

use pagewise_kernel::features::users;
use pagewise_kernel::probe::{probe, Status};

use crate::features::REGISTRY;

/// Report every kernel feature Pagewise uses: present, absent, or present but unusable, why,
/// and which Pagewise feature of this build uses it. Changes nothing on the system.
#[derive(clap::Args)]
pub struct Args {
    /// Print JSON (stable snake_case keys) instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let caps = probe();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&caps.to_json(REGISTRY))?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("kernel {}{}", caps.kernel_release, if caps.root { ", running as root" } else { ", not root" });
    println!();
    let key_w = caps.features.iter().map(|(k, _)| k.key().len()).max().unwrap_or(10);
    println!("{:<key_w$}  {:<8}  {:<44}  used by", "feature", "status", "detail");
    for (cap, f) in &caps.features {
        let key = cap.key();
        let used_by = match users(REGISTRY, *cap) {
            u if u.is_empty() => "-".to_string(),
            u => u.join(", "),
        };
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
            println!("{key:<key_w$}  {status:<8}  {first:<44}  {used_by}{rest}");
        } else {
            println!("{key:<key_w$}  {status:<8}  {detail:<44}  {used_by}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
