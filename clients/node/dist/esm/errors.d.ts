/** Base class of every error this package throws about a lock. */
export declare class LockError extends Error {
    constructor(message: string);
}
/** A guarded command (`lease.exec`) found that this grant no longer holds
 * the lock (its lease ended, it was released, or another holder has it):
 * nothing ran. The server's reason is the message. */
export declare class NotHeldError extends LockError {
}
/** A gate write (`lease.fenced`) carried a fence below the gate's mark: a
 * later holder has written, so this holder is stale. Nothing ran. */
export declare class StaleFenceError extends LockError {
    /** This holder's fence. */
    readonly fence: number;
    /** The highest fence the gate has accepted. */
    readonly mark: number;
    constructor(
    /** This holder's fence. */
    fence: number, 
    /** The highest fence the gate has accepted. */
    mark: number, message?: string);
}
/** `locks.using`: the lock was lost while the routine ran (a renewal was
 * refused, or none succeeded within the validity), so its work may have
 * overlapped another holder's. */
export declare class LockLostError extends LockError {
}
/** `locks.using` with `timeoutMs`: not granted in time. */
export declare class NotAcquiredError extends LockError {
}
/** The server does not know the `LOCK.*` commands: the redis-lock module is
 * not loaded there. */
export declare class ModuleMissingError extends LockError {
    readonly server: string;
    constructor(server?: string);
}
/** The server's refusals as this package's errors; anything else as it came. */
export declare function translate(error: unknown, server: string): unknown;
