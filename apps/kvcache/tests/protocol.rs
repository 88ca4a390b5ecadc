//! The text protocol against the real server process: request → exact reply, every error case.

mod common;

use common::Server;

fn big(n: usize) -> Vec<u8> {
    vec![b'v'; n]
}

#[test]
fn table_of_requests_and_exact_replies() {
    let srv = Server::start(&["-m", "16", "-t", "2"]);
    let mut c = srv.connect();
    let k250 = "k".repeat(250);
    let k251 = "k".repeat(251);
    let owned: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (format!("set {k250} 0 0 1\r\nx\r\n").into_bytes(), b"STORED\r\n".to_vec()),
        (format!("get {k250}\r\n").into_bytes(), format!("VALUE {k250} 0 1\r\nx\r\nEND\r\n").into_bytes()),
        (format!("get {k251}\r\n").into_bytes(), b"CLIENT_ERROR bad command line format\r\n".to_vec()),
        (format!("get a {k251}\r\n").into_bytes(), b"CLIENT_ERROR bad command line format\r\n".to_vec()),
        // The refused block is swallowed: the stream stays in sync.
        (format!("set {k251} 0 0 1\r\nx\r\n").into_bytes(), b"CLIENT_ERROR bad command line format\r\n".to_vec()),
        (format!("delete {k251}\r\n").into_bytes(), b"CLIENT_ERROR bad command line format\r\n".to_vec()),
        (
            [b"set huge 0 0 1048577\r\n".to_vec(), big(1_048_577), b"\r\n".to_vec()].concat(),
            b"SERVER_ERROR object too large for cache\r\n".to_vec(),
        ),
        // Header + key + value must fit a 1 MiB slab page.
        (
            [b"set huge 0 0 1048576\r\n".to_vec(), big(1_048_576), b"\r\n".to_vec()].concat(),
            b"SERVER_ERROR object too large for cache\r\n".to_vec(),
        ),
        ([b"set huge 0 0 1000000\r\n".to_vec(), big(1_000_000), b"\r\n".to_vec()].concat(), b"STORED\r\n".to_vec()),
        (
            b"get huge\r\n".to_vec(),
            [b"VALUE huge 0 1000000\r\n".to_vec(), big(1_000_000), b"\r\nEND\r\n".to_vec()].concat(),
        ),
        // A too-large set drops the old value (no stale data), as memcached does.
        (
            [b"set huge 0 0 1048577\r\n".to_vec(), big(1_048_577), b"\r\n".to_vec()].concat(),
            b"SERVER_ERROR object too large for cache\r\n".to_vec(),
        ),
        (b"get huge\r\n".to_vec(), b"END\r\n".to_vec()),
    ];
    let cases: Vec<(&[u8], &[u8])> = vec![
        // storage and retrieval
        (b"set a 5 0 3\r\nabc\r\n", b"STORED\r\n"),
        (b"get a\r\n", b"VALUE a 5 3\r\nabc\r\nEND\r\n"),
        (b"get a nothere a\r\n", b"VALUE a 5 3\r\nabc\r\nVALUE a 5 3\r\nabc\r\nEND\r\n"),
        (b"get nothere\r\n", b"END\r\n"),
        (b"get a\n", b"VALUE a 5 3\r\nabc\r\nEND\r\n"),
        (b"set empty 0 0 0\r\n\r\n", b"STORED\r\n"),
        (b"get empty\r\n", b"VALUE empty 0 0\r\n\r\nEND\r\n"),
        (b"set bin 4294967295 0 4\r\n\r\n\x00\xff\r\n", b"STORED\r\n"),
        (b"get bin\r\n", b"VALUE bin 4294967295 4\r\n\r\n\x00\xff\r\nEND\r\n"),
        (b"set f 4294967296 0 1\r\nx\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        (b"add a 0 0 1\r\nx\r\n", b"NOT_STORED\r\n"),
        (b"add b 1 0 1\r\nx\r\n", b"STORED\r\n"),
        (b"replace c 0 0 1\r\nx\r\n", b"NOT_STORED\r\n"),
        (b"replace b 2 0 2\r\nyy\r\n", b"STORED\r\n"),
        (b"append b 9 0 2\r\nzz\r\n", b"STORED\r\n"),
        (b"prepend b 9 0 2\r\nxx\r\n", b"STORED\r\n"),
        (b"get b\r\n", b"VALUE b 2 6\r\nxxyyzz\r\nEND\r\n"),
        (b"append nope 0 0 1\r\nx\r\n", b"NOT_STORED\r\n"),
        (b"prepend nope 0 0 1\r\nx\r\n", b"NOT_STORED\r\n"),
        (b"cas nope 0 0 1 5\r\nx\r\n", b"NOT_FOUND\r\n"),
        (b"cas a 0 0 1 abc\r\nx\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        // deletion
        (b"delete b\r\n", b"DELETED\r\n"),
        (b"delete b\r\n", b"NOT_FOUND\r\n"),
        (b"delete b 0\r\n", b"NOT_FOUND\r\n"),
        (b"delete b 5\r\n", b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"),
        (b"delete\r\n", b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"),
        // incr/decr
        (b"set n 3 0 2\r\n10\r\n", b"STORED\r\n"),
        (b"incr n 5\r\n", b"15\r\n"),
        (b"decr n 100\r\n", b"0\r\n"),
        (b"incr n 18446744073709551615\r\n", b"18446744073709551615\r\n"),
        (b"incr n 2\r\n", b"1\r\n"),
        (b"get n\r\n", b"VALUE n 3 1\r\n1\r\nEND\r\n"),
        (b"incr n x\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n"),
        (b"incr n -1\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n"),
        (b"incr n 18446744073709551616\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n"),
        (b"incr a 1\r\n", b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
        (b"incr zz 1\r\n", b"NOT_FOUND\r\n"),
        (b"decr zz 1\r\n", b"NOT_FOUND\r\n"),
        (b"incr n\r\n", b"ERROR\r\n"),
        // touch, gat
        (b"touch a 100\r\n", b"TOUCHED\r\n"),
        (b"touch zz 100\r\n", b"NOT_FOUND\r\n"),
        (b"touch a x\r\n", b"CLIENT_ERROR invalid exptime argument\r\n"),
        (b"gat 0 a zz\r\n", b"VALUE a 5 3\r\nabc\r\nEND\r\n"),
        (b"gat x a\r\n", b"CLIENT_ERROR invalid exptime argument\r\n"),
        (b"gat 0\r\n", b"ERROR\r\n"),
        // exptime: negative = already expired, > 30 days = absolute Unix time
        (b"set e 0 -1 1\r\nx\r\n", b"STORED\r\n"),
        (b"get e\r\n", b"END\r\n"),
        (b"set e 0 1000000000 1\r\nx\r\n", b"STORED\r\n"),
        (b"get e\r\n", b"END\r\n"),
        (b"set e 0 2147483647 1\r\nx\r\n", b"STORED\r\n"),
        (b"get e\r\n", b"VALUE e 0 1\r\nx\r\nEND\r\n"),
        (b"set e 0 2592000 1\r\nx\r\n", b"STORED\r\n"),
        (b"get e\r\n", b"VALUE e 0 1\r\nx\r\nEND\r\n"),
        (b"gat -1 e\r\n", b"VALUE e 0 1\r\nx\r\nEND\r\n"),
        (b"get e\r\n", b"END\r\n"),
        // noreply
        (b"set q 0 0 1 noreply\r\nx\r\n", b""),
        (b"get q\r\n", b"VALUE q 0 1\r\nx\r\nEND\r\n"),
        (b"add q 0 0 1 noreply\r\nx\r\n", b""),
        (b"append q 0 0 1 noreply\r\ny\r\n", b""),
        (b"incr q 1 noreply\r\n", b""),
        (b"touch q 1 noreply\r\n", b""),
        (b"get q\r\n", b"VALUE q 0 2\r\nxy\r\nEND\r\n"),
        (b"delete q noreply\r\n", b""),
        (b"get q\r\n", b"END\r\n"),
        (b"set q x 0 1 noreply\r\nx\r\n", b""),
        (b"verbosity 1 noreply\r\n", b""),
        // unknown commands and bad lines
        (b"bogus\r\n", b"ERROR\r\n"),
        (b"\r\n", b"ERROR\r\n"),
        (b"   \r\n", b"ERROR\r\n"),
        (b"GET a\r\n", b"ERROR\r\n"),
        (b"\x00\x01\xfe\xff garbage\r\n", b"ERROR\r\n"),
        (b"get\r\n", b"ERROR\r\n"),
        (b"set k 0 0\r\n", b"ERROR\r\n"),
        (b"set k 0 0 1 2 3\r\n", b"ERROR\r\n"),
        (b"set k abc 0 1\r\nx\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        (b"set k 0 abc 1\r\nx\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        (b"set k 0 0 -1\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        (b"set k 0 0 abc\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        // a block longer than declared: its tail is read as a command line
        (b"set k 0 0 3\r\nabcde\r\n", b"CLIENT_ERROR bad data chunk\r\nERROR\r\n"),
        (b"get k\r\n", b"END\r\n"),
        (b"set k 0 0 1\r\nxy\r\n", b"CLIENT_ERROR bad data chunk\r\nERROR\r\n"),
        (b"verbosity 1\r\n", b"OK\r\n"),
        (b"verbosity\r\n", b"ERROR\r\n"),
        (b"verbosity x\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        (b"verbosity 1 2\r\n", b"CLIENT_ERROR bad command line format\r\n"),
        (b"verbosity foo bar my\r\n", b"ERROR\r\n"),
        // A last `noreply` silences even the refusal (memcached 1.6; memccapable's "ascii
        // verbosity" failed on the CLIENT_ERROR this used to send).
        (b"verbosity noreply\r\n", b""),
        (b"verbosity 0 noreply\r\n", b""),
        (b"stats bogus\r\n", b"ERROR\r\n"),
        (b"stats reset\r\n", b"RESET\r\n"),
        (b"flush_all x\r\n", b"CLIENT_ERROR invalid exptime argument\r\n"),
        (b"flush_all 0\r\n", b"OK\r\n"),
        (b"get a n\r\n", b"END\r\n"),
        (b"flush_all\r\n", b"OK\r\n"),
    ];
    for (req, rep) in &owned {
        c.exchange(req, rep);
    }
    for (req, rep) in cases {
        c.exchange(req, rep);
    }
}

#[test]
fn gets_and_cas() {
    let srv = Server::start(&["-m", "8"]);
    let mut c = srv.connect();
    c.exchange(b"set k 7 0 2\r\nv1\r\n", b"STORED\r\n");
    c.send(b"gets k\r\n");
    let head = String::from_utf8(c.read_n("VALUE k 7 2 ".len())).unwrap();
    assert_eq!(head, "VALUE k 7 2 ");
    let mut rest = Vec::new();
    loop {
        let b = c.read_n(1);
        rest.push(b[0]);
        if rest.ends_with(b"END\r\n") {
            break;
        }
    }
    let text = String::from_utf8(rest).unwrap();
    let cas: u64 = text.split("\r\n").next().unwrap().parse().unwrap();
    c.exchange(format!("cas k 0 0 2 {}\r\nv2\r\n", cas + 1).as_bytes(), b"EXISTS\r\n");
    c.exchange(format!("cas k 8 0 2 {cas}\r\nv3\r\n").as_bytes(), b"STORED\r\n");
    c.exchange(format!("cas k 8 0 2 {cas}\r\nv4\r\n").as_bytes(), b"EXISTS\r\n");
    c.exchange(b"get k\r\n", b"VALUE k 8 2\r\nv3\r\nEND\r\n");
    // gats returns the new cas, and gets of several keys one VALUE line each.
    c.send(b"gets k nope k\r\n");
    let mut got = Vec::new();
    while !got.ends_with(b"END\r\n") {
        got.extend(c.read_n(1));
    }
    let text = String::from_utf8(got).unwrap();
    assert_eq!(text.matches("VALUE k 8 2 ").count(), 2, "{text}");
}

#[test]
fn relative_expiry_and_delayed_flush() {
    let srv = Server::start(&["-m", "8"]);
    let mut c = srv.connect();
    c.exchange(b"set short 0 1 1\r\nx\r\n", b"STORED\r\n");
    c.exchange(b"set long 0 100 1\r\ny\r\n", b"STORED\r\n");
    c.exchange(b"flush_all 2\r\n", b"OK\r\n");
    c.exchange(b"get long\r\n", b"VALUE long 0 1\r\ny\r\nEND\r\n");
    // Server time is in whole seconds: exptime 1 is gone after at most 2 s, the flush at 2 s
    // after at most 3 s.
    std::thread::sleep(std::time::Duration::from_millis(3200));
    c.exchange(b"get short long\r\n", b"END\r\n");
    c.exchange(b"set after 0 0 1\r\nz\r\n", b"STORED\r\n");
    c.exchange(b"get after\r\n", b"VALUE after 0 1\r\nz\r\nEND\r\n");
}

#[test]
fn stats_report_every_section() {
    let srv = Server::start(&["-m", "8", "-t", "3", "-c", "77"]);
    let mut c = srv.connect();
    c.exchange(b"set a 0 0 1\r\nx\r\n", b"STORED\r\n");
    c.exchange(b"get a b\r\n", b"VALUE a 0 1\r\nx\r\nEND\r\n");
    assert_eq!(srv.stat_u64("curr_items"), 1);
    assert_eq!(srv.stat_u64("get_hits"), 1);
    assert_eq!(srv.stat_u64("get_misses"), 1);
    assert_eq!(srv.stat_u64("limit_maxbytes"), 8 << 20);
    assert_eq!(srv.stat_u64("threads"), 3);
    assert_eq!(srv.stat("memory_mode"), "default");
    assert_eq!(srv.stat("tracking_state"), "off");
    for k in ["hugepage_bytes", "promoted_regions", "compacted_items", "tracking", "hot_arena_bytes", "memory_bytes"] {
        srv.stat_u64(k);
    }
    for (req, must) in [
        (
            &b"stats settings\r\n"[..],
            &[
                "STAT maxconns 77\r\n",
                "STAT growth_factor 1.25\r\n",
                "STAT item_size_max 1048576\r\n",
                "STAT num_threads 3\r\n",
            ][..],
        ),
        (b"stats slabs\r\n", &["STAT 1:chunk_size 96\r\n", "STAT 1:used_chunks 1\r\n", "STAT active_slabs 1\r\n"]),
        (b"stats items\r\n", &["STAT items:1:number 1\r\n"]),
    ] {
        c.send(req);
        let mut got = Vec::new();
        while !got.ends_with(b"END\r\n") {
            got.extend(c.read_n(1));
        }
        let text = String::from_utf8(got).unwrap();
        for m in must {
            assert!(text.contains(m), "{m:?} missing from {text}");
        }
    }
    // `verbosity` sets the level `stats settings` shows (capped at 2, as memcached's).
    for (req, level) in [(&b"verbosity 9\r\n"[..], "2"), (b"verbosity 0\r\n", "0")] {
        c.exchange(req, b"OK\r\n");
        c.send(b"stats settings\r\n");
        let mut got = Vec::new();
        while !got.ends_with(b"END\r\n") {
            got.extend(c.read_n(1));
        }
        let text = String::from_utf8(got).unwrap();
        assert!(text.contains(&format!("STAT verbosity {level}\r\n")), "verbosity {level} missing from {text}");
    }
    c.send(b"quit\r\n");
    assert!(c.read_to_close().is_empty());
}

/// `-L` (memcached's: the whole cache preallocated on large pages): THP memory, the whole slab
/// area resident before any item is stored; with HPS it is refused.
#[test]
fn largepages_preallocates_the_slab_area() {
    let srv = Server::start(&["-m", "16", "-L"]);
    assert_eq!(srv.stat("memory_mode"), "thp");
    assert!(srv.stat_u64("memory_bytes") >= 16 << 20, "memory_bytes {}", srv.stat_u64("memory_bytes"));
    let mut c = srv.connect();
    c.exchange(b"set a 0 0 1\r\nx\r\n", b"STORED\r\n");
    c.exchange(b"get a\r\n", b"VALUE a 0 1\r\nx\r\nEND\r\n");
    assert!(Server::try_start(&["-m", "16", "-L", "--memory-mode", "hps"]).is_err());
}
