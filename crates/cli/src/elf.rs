//! Whether LD_PRELOAD reaches a program. Only the dynamic loader reads it, and the kernel
//! starts the loader only for an ELF executable that names one (a PT_INTERP program header).
//! A statically linked executable (Go's default, `gcc -static`, static-pie) runs without the
//! shim: `pagewise run` and `pagewise hps run` would run it with none of its memory on
//! Pagewise's, and say nothing (the shim prints the exit summary). So they refuse it up front.

use std::io::Read;
use std::path::{Path, PathBuf};

/// What the start of an executable file says about the dynamic loader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loader {
    /// An ELF executable that names a program interpreter: the loader runs and preloads.
    Dynamic,
    /// An ELF executable that names none: nothing is preloaded.
    Static,
    /// Not an ELF file (a script: its interpreter is what runs), or one this check cannot read
    /// whole (big-endian, program headers past the bytes given).
    Unknown,
}

const PT_INTERP: u32 = 3;

/// The loader `head` (the first bytes of an executable file) asks for.
pub fn loader(head: &[u8]) -> Loader {
    if head.len() < 6 || &head[..4] != b"\x7fELF" || head[5] != 1 {
        return Loader::Unknown; // not ELF, or not little-endian
    }
    let bytes = |o: usize, n: usize| head.get(o..o.checked_add(n)?);
    let u16_at = |o: usize| bytes(o, 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |o: usize| bytes(o, 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    let u64_at = |o: usize| bytes(o, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    // (e_phoff, e_phentsize, e_phnum) of ELFCLASS32 and ELFCLASS64.
    let table = match head[4] {
        1 => (|| Some((u32_at(0x1c)? as usize, u16_at(0x2a)?, u16_at(0x2c)?)))(),
        2 => (|| Some((usize::try_from(u64_at(0x20)?).ok()?, u16_at(0x36)?, u16_at(0x38)?)))(),
        _ => None,
    };
    let Some((phoff, phentsize, phnum)) = table else { return Loader::Unknown };
    if phentsize < 4 {
        return Loader::Unknown;
    }
    let mut interp = false;
    for i in 0..phnum {
        let Some(p_type) = phoff.checked_add(i * phentsize).and_then(u32_at) else { return Loader::Unknown };
        interp |= p_type == PT_INTERP;
    }
    if interp {
        Loader::Dynamic
    } else {
        Loader::Static
    }
}

/// The file `program` names, as execvp(3) finds it: a name with a slash as it is, one without
/// in the directories of PATH. None when there is no such executable file (starting it will
/// say why).
fn resolve(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| is_executable_file(p))
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Fail with the reason when `program` is a statically linked executable. Anything this check
/// cannot tell (a script, a file it cannot read, a program not found) is left to start.
pub fn ensure_preloadable(program: &str) -> anyhow::Result<()> {
    let Some(path) = resolve(program) else { return Ok(()) };
    let mut head = Vec::with_capacity(64 << 10);
    let Ok(file) = std::fs::File::open(&path) else { return Ok(()) };
    if file.take(64 << 10).read_to_end(&mut head).is_err() {
        return Ok(());
    }
    anyhow::ensure!(
        loader(&head) != Loader::Static,
        "{} is statically linked: no dynamic loader runs for it, so Pagewise's shim (LD_PRELOAD) \
         never loads and none of its memory would be Pagewise's; run a dynamically linked build",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF header of `class` (1: 32-bit, 2: 64-bit) with program headers of the given types
    /// right after it.
    fn elf(class: u8, types: &[u32]) -> Vec<u8> {
        let (ehsize, phentsize) = if class == 2 { (64usize, 56usize) } else { (52, 32) };
        let mut b = vec![0u8; ehsize + types.len() * phentsize];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = class;
        b[5] = 1;
        if class == 2 {
            b[0x20..0x28].copy_from_slice(&(ehsize as u64).to_le_bytes());
            b[0x36..0x38].copy_from_slice(&(phentsize as u16).to_le_bytes());
            b[0x38..0x3a].copy_from_slice(&(types.len() as u16).to_le_bytes());
        } else {
            b[0x1c..0x20].copy_from_slice(&(ehsize as u32).to_le_bytes());
            b[0x2a..0x2c].copy_from_slice(&(phentsize as u16).to_le_bytes());
            b[0x2c..0x2e].copy_from_slice(&(types.len() as u16).to_le_bytes());
        }
        for (i, t) in types.iter().enumerate() {
            let o = ehsize + i * phentsize;
            b[o..o + 4].copy_from_slice(&t.to_le_bytes());
        }
        b
    }

    #[test]
    fn an_interpreter_header_makes_an_executable_dynamic() {
        // PT_PHDR, PT_INTERP, PT_LOAD: what a dynamically linked program starts with.
        assert_eq!(loader(&elf(2, &[6, PT_INTERP, 1])), Loader::Dynamic);
        assert_eq!(loader(&elf(1, &[6, PT_INTERP, 1])), Loader::Dynamic);
        // PT_LOAD, PT_NOTE, PT_TLS, PT_GNU_STACK: a static executable.
        assert_eq!(loader(&elf(2, &[1, 1, 4, 7, 0x6474_e551])), Loader::Static);
        assert_eq!(loader(&elf(1, &[1])), Loader::Static);
    }

    #[test]
    fn what_cannot_be_read_whole_is_unknown() {
        assert_eq!(loader(b"#!/bin/sh\necho hi\n"), Loader::Unknown);
        assert_eq!(loader(b""), Loader::Unknown);
        let full = elf(2, &[1, PT_INTERP]);
        // Program headers cut off by the end of the bytes read.
        assert_eq!(loader(&full[..full.len() - 60]), Loader::Unknown);
        let mut big_endian = full.clone();
        big_endian[5] = 2;
        assert_eq!(loader(&big_endian), Loader::Unknown);
        let mut absurd = full;
        absurd[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(loader(&absurd), Loader::Unknown);
    }

    #[test]
    fn the_system_programs_are_dynamic_and_scripts_unknown() {
        let head = |p: &str| std::fs::read(resolve(p).expect("on PATH")).unwrap();
        assert_eq!(loader(&head("true")), Loader::Dynamic);
        assert_eq!(loader(&head("ldd")), Loader::Unknown, "ldd is a shell script");
        assert!(ensure_preloadable("true").is_ok());
        assert!(ensure_preloadable("no-such-program-here").is_ok());
    }
}
