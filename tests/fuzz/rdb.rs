//! Damaged RDB files: lock values (and the module's aux field) damaged in
//! an RDB file, loaded at start-up.

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use redis_lock_testkit as common;

use common::{Resp, Server};

use crate::boot::{boot, check_loaded, check_refusal, last_warning, scratch_dir, Booted};
use crate::restore::{crc64, damage, lock_tokens, number_fields, Dump};
use crate::rng::{env_number, Rng};
use crate::wire::{int, Wire};

#[test]
fn damaged_rdb_files_are_refused_or_load_only_whole_locks() {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "starts the server binary by hand on damaged files",
    ) {
        return;
    }
    let started = Instant::now();
    let mut rng = Rng::for_test("RDB fuzz", 3);
    let cases = env_number("FUZZ_FILE_CASES", 40) as usize;
    let server = Server::start();
    let mut w = Wire::connect(server.port);
    let mut dumps = vec![];
    for (i, token) in lock_tokens().iter().enumerate() {
        let key = format!("lock:{i}").into_bytes();
        int(&w.call(&[b"LOCK.ACQUIRE", &key, token, b"600000"]));
        dumps.push(Dump::of(&mut w, &key));
    }
    w.call(&[b"SET", b"plain", b"value"]);
    assert_eq!(w.call(&[b"SAVE"]), Resp::Simple("OK".into()));
    let rdb = std::fs::read(server.dir.join("dump.rdb")).unwrap();
    drop(server);
    // The lock values (and their EOF opcodes) and the module's aux field.
    let mut regions = vec![];
    let mut numbers = vec![];
    for d in &dumps {
        let needle = &d.body[1..];
        let at = rdb
            .windows(needle.len())
            .position(|x| x == needle)
            .expect("the value in the RDB file");
        regions.push(at + 9..at + needle.len());
        numbers.extend(number_fields(&rdb, at + needle.len() - 1));
    }
    let aux = [&[0xf7u8][..], &dumps[0].body[1..10]].concat();
    let at = rdb
        .windows(10)
        .position(|x| x == aux)
        .expect("the aux field");
    // `when` (a number, with its opcode), the mark as a 64-bit number, and
    // the EOF opcode.
    assert_eq!(
        (rdb[at + 10], rdb[at + 12], rdb[at + 13], rdb[at + 22]),
        (0x02, 0x02, 0x81, 0x00)
    );
    regions.push(at + 10..at + 23);
    numbers.push(at + 14);
    let (mut loaded, mut refused, mut hung) = (0, 0, 0);
    let mut reasons = HashSet::new();
    for case in 0..cases {
        let mut bytes = rdb.clone();
        let region = rng.pick(&regions).clone();
        let truncated = rng.chance(20);
        if truncated {
            bytes.truncate(rng.range(region.start as i64, region.end as i64 - 1) as usize);
        } else {
            let len_before = bytes.len();
            damage(&mut rng, &mut bytes, region, &numbers);
            let n = bytes.len();
            assert!(n + 8 >= len_before);
            let crc = crc64(&bytes[..n - 8]);
            bytes[n - 8..].copy_from_slice(&crc.to_le_bytes());
        }
        let dir = scratch_dir(&format!("rdb-{case}"));
        std::fs::write(dir.join("dump.rdb"), &bytes).unwrap();
        let hang_after = Duration::from_secs(if truncated { 1 } else { 20 });
        match boot(
            &dir,
            &["--dbfilename", "dump.rdb", "--appendonly", "no"],
            hang_after,
        ) {
            Booted::Up(b) => {
                check_loaded(&b);
                loaded += 1;
            }
            Booted::Exited(status, log) => {
                check_refusal(status, &log, &format!("RDB case {case}"));
                reasons.insert(last_warning(&log));
                refused += 1;
            }
            Booted::CheckerHung(log) => {
                // Redis's redis-check-rdb, which a refused load runs, never
                // ends on a cut file, nor on a damaged one whose lengths now
                // reach past its end (which is a cut file to it). What the
                // module owes is the refusal, checked below, before it.
                // Or a damage that left a lock's fields valid but moved the
                // end of its value: Redis refuses the file at the missing
                // module-value EOF marker (seen once in a make test run).
                assert!(
                    truncated
                        || log.contains("refusing to load a lock value")
                        || log.contains("not terminated by the proper module value EOF marker"),
                    "only a cut file, or one the module or Redis refused, hangs the checker:\n{log}"
                );
                check_refusal(
                    ExitStatus::from_raw(1 << 8),
                    &log,
                    &format!("RDB case {case}"),
                );
                hung += 1;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!(
        "RDB fuzz: {cases} damaged files, {loaded} loaded, {refused} refused, {hung} refused \
         but then hung in Redis's redis-check-rdb, {:?}; reasons: {reasons:#?}",
        started.elapsed()
    );
}
