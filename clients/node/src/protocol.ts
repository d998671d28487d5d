// Generated from core/src/protocol.rs by tests/client_protocol.rs
// (CLIENT_PROTOCOL_BLESS=1 cargo test --test client_protocol rewrites it):
// the command names, option words, error codes and waits the module and
// every client share. Do not edit.
export const ACQUIRE = 'LOCK.ACQUIRE';
export const RELEASE = 'LOCK.RELEASE';
export const EXTEND = 'LOCK.EXTEND';
export const FENCE = 'LOCK.FENCE';
export const INFO = 'LOCK.INFO';
export const ACQUIRE_ALL = 'LOCK.ACQUIREALL';
export const RELEASE_ALL = 'LOCK.RELEASEALL';
export const EXEC = 'LOCK.EXEC';
export const FENCED = 'LOCK.FENCED';
export const OBSERVE = 'LOCK.OBSERVE';
export const BLOCK = 'BLOCK';
export const AFTER = 'AFTER';
export const VALUE = 'VALUE';
export const MINFENCE = 'MINFENCE';
export const SHARED = 'SHARED';
export const LIMIT = 'LIMIT';
export const FENCE_WORD = 'FENCE';
export const LINE_FULL = 'LINEFULL';
export const TRY_AGAIN = 'TRYAGAIN';
export const READ_ONLY = 'READONLY';
export const OUT_OF_MEMORY = 'OOM';
export const WRONG_TYPE = 'WRONGTYPE';
export const NO_PERMISSION = 'NOPERM';
export const NOT_HELD = 'NOTHELD';
export const STALE_FENCE = 'STALEFENCE';
export const NOT_GUARDABLE = 'NOTGUARDABLE';
export const MAX_BLOCK_MS = 316224000000;
export const OBSERVE_WAIT_MS = 30000;
export const OBSERVE_GRACE_MS = 5000;
