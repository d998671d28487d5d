"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.OBSERVE_GRACE_MS = exports.OBSERVE_WAIT_MS = exports.MAX_BLOCK_MS = exports.NOT_GUARDABLE = exports.STALE_FENCE = exports.NOT_HELD = exports.NO_PERMISSION = exports.WRONG_TYPE = exports.OUT_OF_MEMORY = exports.READ_ONLY = exports.TRY_AGAIN = exports.LINE_FULL = exports.FENCE_WORD = exports.LIMIT = exports.SHARED = exports.MINFENCE = exports.VALUE = exports.AFTER = exports.BLOCK = exports.OBSERVE = exports.FENCED = exports.EXEC = exports.RELEASE_ALL = exports.ACQUIRE_ALL = exports.INFO = exports.FENCE = exports.EXTEND = exports.RELEASE = exports.ACQUIRE = void 0;
// Generated from core/src/protocol.rs by tests/client_protocol.rs
// (CLIENT_PROTOCOL_BLESS=1 cargo test --test client_protocol rewrites it):
// the command names, option words, error codes and waits the module and
// every client share. Do not edit.
exports.ACQUIRE = 'LOCK.ACQUIRE';
exports.RELEASE = 'LOCK.RELEASE';
exports.EXTEND = 'LOCK.EXTEND';
exports.FENCE = 'LOCK.FENCE';
exports.INFO = 'LOCK.INFO';
exports.ACQUIRE_ALL = 'LOCK.ACQUIREALL';
exports.RELEASE_ALL = 'LOCK.RELEASEALL';
exports.EXEC = 'LOCK.EXEC';
exports.FENCED = 'LOCK.FENCED';
exports.OBSERVE = 'LOCK.OBSERVE';
exports.BLOCK = 'BLOCK';
exports.AFTER = 'AFTER';
exports.VALUE = 'VALUE';
exports.MINFENCE = 'MINFENCE';
exports.SHARED = 'SHARED';
exports.LIMIT = 'LIMIT';
exports.FENCE_WORD = 'FENCE';
exports.LINE_FULL = 'LINEFULL';
exports.TRY_AGAIN = 'TRYAGAIN';
exports.READ_ONLY = 'READONLY';
exports.OUT_OF_MEMORY = 'OOM';
exports.WRONG_TYPE = 'WRONGTYPE';
exports.NO_PERMISSION = 'NOPERM';
exports.NOT_HELD = 'NOTHELD';
exports.STALE_FENCE = 'STALEFENCE';
exports.NOT_GUARDABLE = 'NOTGUARDABLE';
exports.MAX_BLOCK_MS = 316224000000;
exports.OBSERVE_WAIT_MS = 30000;
exports.OBSERVE_GRACE_MS = 5000;
