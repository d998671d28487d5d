import { NOT_HELD, STALE_FENCE } from './protocol.js';
/** Base class of every error this package throws about a lock. */
export class LockError extends Error {
    constructor(message) {
        super(message);
        this.name = new.target.name;
    }
}
/** A guarded command (`lease.exec`) found that this grant no longer holds
 * the lock (its lease ended, it was released, or another holder has it):
 * nothing ran. The server's reason is the message. */
export class NotHeldError extends LockError {
}
/** A gate write (`lease.fenced`) carried a fence below the gate's mark: a
 * later holder has written, so this holder is stale. Nothing ran. */
export class StaleFenceError extends LockError {
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
/** `locks.using`: the lock was lost while the routine ran (a renewal was
 * refused, or none succeeded within the validity), so its work may have
 * overlapped another holder's. */
export class LockLostError extends LockError {
}
/** `locks.using` with `timeoutMs`: not granted in time. */
export class NotAcquiredError extends LockError {
}
/** The server does not know the `LOCK.*` commands: the redis-lock module is
 * not loaded there. */
export class ModuleMissingError extends LockError {
    server;
    constructor(server = 'the server') {
        super(`${server} does not know the LOCK commands: load the redis-lock module there ` +
            '(redis-server --loadmodule /path/to/libredis_lock.so, or MODULE LOAD /path/to/libredis_lock.so)');
        this.server = server;
    }
}
const STALE = /fence (\d+) is below the gate's mark (\d+)/;
/** The server's refusals as this package's errors; anything else as it came. */
export function translate(error, server) {
    if (!(error instanceof Error))
        return error;
    const text = error.message;
    const word = text.split(' ', 1)[0];
    if (word === NOT_HELD)
        return new NotHeldError(text);
    if (word === STALE_FENCE) {
        const m = STALE.exec(text);
        if (m)
            return new StaleFenceError(Number(m[1]), Number(m[2]), text);
    }
    if (/unknown command/i.test(text) && /LOCK\./i.test(text))
        return new ModuleMissingError(server);
    return error;
}
