"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.ModuleMissingError = exports.NotAcquiredError = exports.LockLostError = exports.StaleFenceError = exports.NotHeldError = exports.LockError = void 0;
exports.translate = translate;
const protocol_js_1 = require("./protocol.js");
/** Base class of every error this package throws about a lock. */
class LockError extends Error {
    constructor(message) {
        super(message);
        this.name = new.target.name;
    }
}
exports.LockError = LockError;
/** A guarded command (`lease.exec`) found that this grant no longer holds
 * the lock (its lease ended, it was released, or another holder has it):
 * nothing ran. The server's reason is the message. */
class NotHeldError extends LockError {
}
exports.NotHeldError = NotHeldError;
/** A gate write (`lease.fenced`) carried a fence below the gate's mark: a
 * later holder has written, so this holder is stale. Nothing ran. */
class StaleFenceError extends LockError {
    fence;
    mark;
    constructor(
    /** This holder's fence. */
    fence, 
    /** The highest fence the gate has accepted. */
    mark, message) {
        super(message ?? `stale fence ${fence}: the gate has accepted ${mark}, so a later holder has written; nothing ran`);
        this.fence = fence;
        this.mark = mark;
    }
}
exports.StaleFenceError = StaleFenceError;
/** `locks.using`: the lock was lost while the routine ran (a renewal was
 * refused, or none succeeded within the validity), so its work may have
 * overlapped another holder's. */
class LockLostError extends LockError {
}
exports.LockLostError = LockLostError;
/** `locks.using` with `timeoutMs`: not granted in time. */
class NotAcquiredError extends LockError {
}
exports.NotAcquiredError = NotAcquiredError;
/** The server does not know the `LOCK.*` commands: the redis-lock module is
 * not loaded there. */
class ModuleMissingError extends LockError {
    server;
    constructor(server = 'the server') {
        super(`${server} does not know the LOCK commands: load the redis-lock module there ` +
            '(redis-server --loadmodule /path/to/libredis_lock.so, or MODULE LOAD /path/to/libredis_lock.so)');
        this.server = server;
    }
}
exports.ModuleMissingError = ModuleMissingError;
const STALE = /fence (\d+) is below the gate's mark (\d+)/;
/** The server's refusals as this package's errors; anything else as it came. */
function translate(error, server) {
    if (!(error instanceof Error))
        return error;
    const text = error.message;
    const word = text.split(' ', 1)[0];
    if (word === protocol_js_1.NOT_HELD)
        return new NotHeldError(text);
    if (word === protocol_js_1.STALE_FENCE) {
        const m = STALE.exec(text);
        if (m)
            return new StaleFenceError(Number(m[1]), Number(m[2]), text);
    }
    if (/unknown command/i.test(text) && /LOCK\./i.test(text))
        return new ModuleMissingError(server);
    return error;
}
