//! The memcached text protocol, parsing only (pure: bytes in, [`Command`] or [`ProtoError`]
//! out). PROTOCOL.md lists the subset and every reply; memcached's doc/protocol.txt is the
//! reference.

/// Longest key (protocol.txt: "the length limit of a key is set at 250 characters").
pub const KEY_MAX: usize = 250;
/// Longest command line, `\r\n` included. Longer input without a newline gets
/// `CLIENT_ERROR line too long` and the connection is closed (memcached closes too: it cannot
/// find the end of the command to resynchronise).
pub const LINE_MAX: usize = 64 * 1024;
/// Tokens of a non-retrieval command (memcached's MAX_TOKENS is 24; more is `ERROR`).
const MAX_TOKENS: usize = 24;
/// Highest verbosity level (memcached's MAX_VERBOSITY_LEVEL); larger levels are capped to it.
pub const MAX_VERBOSITY: u64 = 2;
/// exptime above this many seconds is an absolute Unix time (protocol.txt, "Expiration times").
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// A storage command's verb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// A retrieval command's verb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retrieve {
    Get,
    Gets,
    /// get and touch, with the new exptime
    Gat(i64),
    Gats(i64),
}

/// `stats` and its argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsKind {
    General,
    Slabs,
    Items,
    Settings,
    Reset,
}

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// A storage command; the data block of `bytes` bytes + `\r\n` follows.
    Store {
        verb: Store,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        bytes: usize,
        cas: u64,
        noreply: bool,
    },
    Retrieve {
        verb: Retrieve,
        keys: Vec<&'a [u8]>,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    Stats(StatsKind),
    Version,
    /// The new level, capped at [`MAX_VERBOSITY`].
    Verbosity {
        level: u32,
        noreply: bool,
    },
    Quit,
}

/// A rejected command line: the reply, and how many bytes of data block to swallow so the
/// stream stays in sync (storage commands whose length parsed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtoError {
    pub reply: &'static str,
    /// Bytes to drop after the line (the data block and its `\r\n`), 0 if none.
    pub swallow: usize,
    pub noreply: bool,
}

impl ProtoError {
    fn new(reply: &'static str) -> Self {
        ProtoError { reply, swallow: 0, noreply: false }
    }
}

pub const ERROR: &str = "ERROR\r\n";
pub const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format\r\n";
pub const BAD_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument\r\n";
pub const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument\r\n";
pub const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk\r\n";
pub const LINE_TOO_LONG: &str = "CLIENT_ERROR line too long\r\n";
pub const TOO_LARGE: &str = "SERVER_ERROR object too large for cache\r\n";
pub const OUT_OF_MEMORY: &str = "SERVER_ERROR out of memory storing object\r\n";
pub const NON_NUMERIC: &str = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";

/// Parse one command line (without its `\r\n` / `\n`).
pub fn parse(line: &[u8]) -> Result<Command<'_>, ProtoError> {
    let tokens: Vec<&[u8]> = line.split(|&b| b == b' ').filter(|t| !t.is_empty()).collect();
    let Some(&verb) = tokens.first() else {
        return Err(ProtoError::new(ERROR));
    };
    let retrieval = matches!(verb, b"get" | b"gets" | b"gat" | b"gats");
    if !retrieval && tokens.len() > MAX_TOKENS {
        return Err(ProtoError::new(ERROR));
    }
    let noreply_at = |i: usize| tokens.get(i).is_some_and(|t| *t == b"noreply");
    match verb {
        b"get" | b"gets" => {
            let keys = keys(&tokens[1..])?;
            Ok(Command::Retrieve { verb: if verb == b"get" { Retrieve::Get } else { Retrieve::Gets }, keys })
        }
        b"gat" | b"gats" => {
            if tokens.len() < 3 {
                return Err(ProtoError::new(ERROR));
            }
            let exptime = num_i64(tokens[1]).ok_or(ProtoError::new(BAD_EXPTIME))?;
            let keys = keys(&tokens[2..])?;
            let verb = if verb == b"gat" { Retrieve::Gat(exptime) } else { Retrieve::Gats(exptime) };
            Ok(Command::Retrieve { verb, keys })
        }
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            let is_cas = verb == b"cas";
            let base = if is_cas { 6 } else { 5 };
            if tokens.len() != base && !(tokens.len() == base + 1 && noreply_at(base)) {
                return Err(ProtoError::new(ERROR));
            }
            let noreply = tokens.len() == base + 1;
            // The length first: once it parses, every refusal swallows the data block.
            let bytes = num_u64(tokens[4]).filter(|&b| b <= i32::MAX as u64 - 2);
            let Some(bytes) = bytes else {
                return Err(ProtoError { reply: BAD_FORMAT, swallow: 0, noreply });
            };
            let bytes = bytes as usize;
            let refuse = |reply| ProtoError { reply, swallow: bytes + 2, noreply };
            let key = tokens[1];
            if key.len() > KEY_MAX {
                return Err(refuse(BAD_FORMAT));
            }
            let flags = num_u64(tokens[2]).filter(|&f| f <= u32::MAX as u64).ok_or(refuse(BAD_FORMAT))? as u32;
            let exptime = num_i64(tokens[3]).ok_or(refuse(BAD_FORMAT))?;
            let cas = if is_cas { num_u64(tokens[5]).ok_or(refuse(BAD_FORMAT))? } else { 0 };
            let verb = match verb {
                b"set" => Store::Set,
                b"add" => Store::Add,
                b"replace" => Store::Replace,
                b"append" => Store::Append,
                b"prepend" => Store::Prepend,
                _ => Store::Cas,
            };
            Ok(Command::Store { verb, key, flags, exptime, bytes, cas, noreply })
        }
        b"delete" => {
            // memcached accepts a legacy "0" time argument: `delete <key> 0 [noreply]`.
            let (noreply, ok) = match tokens.len() {
                2 => (false, true),
                3 => (noreply_at(2), noreply_at(2) || tokens[2] == b"0"),
                4 => (noreply_at(3), noreply_at(3) && tokens[2] == b"0"),
                _ => (false, false),
            };
            if !ok {
                return Err(ProtoError {
                    reply: "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
                    swallow: 0,
                    noreply: false,
                });
            }
            let key = key_ok(tokens[1])?;
            Ok(Command::Delete { key, noreply })
        }
        b"incr" | b"decr" => {
            if tokens.len() != 3 && !(tokens.len() == 4 && noreply_at(3)) {
                return Err(ProtoError::new(ERROR));
            }
            let noreply = tokens.len() == 4;
            let key = key_ok(tokens[1]).map_err(|e| ProtoError { noreply, ..e })?;
            let delta = num_u64(tokens[2]).ok_or(ProtoError { reply: BAD_DELTA, swallow: 0, noreply })?;
            Ok(Command::Arith { incr: verb == b"incr", key, delta, noreply })
        }
        b"touch" => {
            if tokens.len() != 3 && !(tokens.len() == 4 && noreply_at(3)) {
                return Err(ProtoError::new(ERROR));
            }
            let noreply = tokens.len() == 4;
            let key = key_ok(tokens[1]).map_err(|e| ProtoError { noreply, ..e })?;
            let exptime = num_i64(tokens[2]).ok_or(ProtoError { reply: BAD_EXPTIME, swallow: 0, noreply })?;
            Ok(Command::Touch { key, exptime, noreply })
        }
        b"flush_all" => {
            let noreply = tokens.last().is_some_and(|t| *t == b"noreply");
            let args = &tokens[1..tokens.len() - usize::from(noreply)];
            match args {
                [] => Ok(Command::FlushAll { delay: 0, noreply }),
                [d] => {
                    let delay = num_i64(d).ok_or(ProtoError { reply: BAD_EXPTIME, swallow: 0, noreply })?;
                    Ok(Command::FlushAll { delay, noreply })
                }
                _ => Err(ProtoError::new(ERROR)),
            }
        }
        b"stats" => match &tokens[1..] {
            [] => Ok(Command::Stats(StatsKind::General)),
            [b"slabs"] => Ok(Command::Stats(StatsKind::Slabs)),
            [b"items"] => Ok(Command::Stats(StatsKind::Items)),
            [b"settings"] => Ok(Command::Stats(StatsKind::Settings)),
            [b"reset"] => Ok(Command::Stats(StatsKind::Reset)),
            _ => Err(ProtoError::new(ERROR)),
        },
        b"version" if tokens.len() == 1 => Ok(Command::Version),
        b"quit" if tokens.len() == 1 => Ok(Command::Quit),
        b"verbosity" => {
            if !(2..=3).contains(&tokens.len()) {
                return Err(ProtoError::new(ERROR));
            }
            // protocol.txt: "unless \"noreply\" is given as the last parameter". memcached 1.6
            // takes a last `noreply` before it reads the level, so `verbosity noreply` gets no
            // reply at all, not even the refusal of its level (memccapable's "ascii
            // verbosity" sends it and reads nothing back).
            let noreply = tokens.last().is_some_and(|t| *t == b"noreply");
            let refuse = ProtoError { reply: BAD_FORMAT, swallow: 0, noreply };
            if tokens.len() == 3 && !noreply {
                return Err(refuse);
            }
            let level = num_u64(tokens[1]).ok_or(refuse)?;
            Ok(Command::Verbosity { level: level.min(MAX_VERBOSITY) as u32, noreply })
        }
        _ => Err(ProtoError::new(ERROR)),
    }
}

fn key_ok(key: &[u8]) -> Result<&[u8], ProtoError> {
    if key.len() > KEY_MAX {
        return Err(ProtoError::new(BAD_FORMAT));
    }
    Ok(key)
}

fn keys<'a>(tokens: &[&'a [u8]]) -> Result<Vec<&'a [u8]>, ProtoError> {
    if tokens.is_empty() {
        return Err(ProtoError::new(ERROR));
    }
    tokens.iter().map(|k| key_ok(k)).collect()
}

/// A decimal u64, digits only (memcached's safe_strtoull also refuses signs and junk).
pub fn num_u64(t: &[u8]) -> Option<u64> {
    if t.is_empty() || t.len() > 20 || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// A decimal i64 with an optional leading `-`.
pub fn num_i64(t: &[u8]) -> Option<i64> {
    let (neg, digits) = match t.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, t),
    };
    let v = num_u64(digits)?;
    if neg {
        (v <= i64::MAX as u64 + 1).then(|| (v as i128).wrapping_neg() as i64)
    } else {
        i64::try_from(v).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_refuse_junk() {
        assert_eq!(num_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(num_u64(b"18446744073709551616"), None);
        assert_eq!(num_u64(b"-1"), None);
        assert_eq!(num_u64(b"1x"), None);
        assert_eq!(num_u64(b""), None);
        assert_eq!(num_i64(b"-1"), Some(-1));
        assert_eq!(num_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(num_i64(b"9223372036854775808"), None);
        assert_eq!(num_i64(b"--1"), None);
    }

    #[test]
    fn storage_refusals_swallow_the_block_once_the_length_parses() {
        let long = format!("set {} 0 0 5", "k".repeat(251));
        assert_eq!(parse(long.as_bytes()).unwrap_err().swallow, 7);
        assert_eq!(parse(b"set k x 0 5").unwrap_err().swallow, 7);
        assert_eq!(parse(b"set k 0 0 -1").unwrap_err().swallow, 0);
        assert_eq!(parse(b"set k 0 0").unwrap_err().reply, ERROR);
        assert!(matches!(
            parse(b"cas k 1 2 3 99 noreply").unwrap(),
            Command::Store { verb: Store::Cas, flags: 1, exptime: 2, bytes: 3, cas: 99, noreply: true, .. }
        ));
    }

    #[test]
    fn verbosity_noreply_silences_even_its_refusal() {
        assert_eq!(parse(b"verbosity 1").unwrap(), Command::Verbosity { level: 1, noreply: false });
        assert_eq!(parse(b"verbosity 7 noreply").unwrap(), Command::Verbosity { level: 2, noreply: true });
        let bare_noreply = parse(b"verbosity noreply").unwrap_err();
        assert!(bare_noreply.noreply, "memcached 1.6 sends nothing back to `verbosity noreply`");
        assert_eq!(parse(b"verbosity x").unwrap_err(), ProtoError::new(BAD_FORMAT));
        assert_eq!(parse(b"verbosity 1 2").unwrap_err(), ProtoError::new(BAD_FORMAT));
        assert_eq!(parse(b"verbosity").unwrap_err().reply, ERROR);
        assert_eq!(parse(b"verbosity foo bar my").unwrap_err().reply, ERROR);
    }

    #[test]
    fn retrieval_takes_many_keys() {
        let Command::Retrieve { keys, .. } = parse(b"get a  b c").unwrap() else { panic!() };
        assert_eq!(keys, vec![&b"a"[..], b"b", b"c"]);
        assert_eq!(parse(b"get").unwrap_err().reply, ERROR);
        assert_eq!(parse(b"gat x k").unwrap_err().reply, BAD_EXPTIME);
    }
}
