//! Fuzzing against a live server, and damaged persistence files.
//!
//! * **Argument vectors.** Random argvs for every command (random arity and
//!   case, binary junk, huge, negative, signed and spaced numbers, option
//!   words anywhere), pipelined, also against held locks with wrong tokens.
//!   Every reply must be what a plain reading of the README allows, every
//!   error must name its problem, the held locks and their waiters must be
//!   untouched, the server up, and memory flat once the fuzz keys are gone.
//! * **RESTORE payloads.** DUMPs of locks, mutated (bytes flipped, cut,
//!   inserted, over-long lengths, other fences and deadlines) with a valid
//!   CRC64, so the module's decoder (not the checksum) has to refuse them.
//! * **RDB and AOF files.** Files holding locks, damaged in the lock values
//!   (RDB) or in the `LOCK._SET` commands (AOF), then loaded at start-up: the
//!   server refuses with a log line and exit code 1, or starts with only
//!   valid locks; it never dies by a signal.
//!
//! `FUZZ_SEED` replays a run (each test prints its seed); `FUZZ_ITERATIONS`
//! sets the number of argvs (default 200,000, about 33,000 per command, and
//! a quarter as many RESTORE payloads; `make stress` runs far more); `FUZZ_FILE_CASES` the number of damaged files of
//! each kind (default 40).
//!
//! The parts:
//!
//! * [`rng`]: the seeded generator and the settings.
//! * [`wire`]: a pipelining connection with binary arguments, and what
//!   every error reply must look like.
//! * [`generators`]: the limits the README gives, the fuzzer's target (held
//!   locks, keys of other types) and the generators of arguments and argvs.
//! * [`argv`]: the live argv fuzzing: what a reply may be, batches of argvs,
//!   and the checks that nothing held was touched.
//! * [`restore`]: DUMP payloads of locks, mutated, RESTOREd.
//! * [`boot`]: starting a server by hand on a prepared data directory, and
//!   judging how it refused or what it loaded.
//! * [`rdb`]: damaged RDB files.
//! * [`aof`]: damaged AOF files and bad commands in them.

mod aof;
mod argv;
mod boot;
mod generators;
mod rdb;
mod restore;
mod rng;
mod wire;
