"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.StaleFenceError = exports.NotHeldError = exports.NotAcquiredError = exports.ModuleMissingError = exports.LockLostError = exports.LockError = exports.Lease = exports.Locks = void 0;
/**
 * Locks for the redis-lock Redis module, over your own ioredis or node-redis
 * client: fencing tokens, a FIFO line in the server with hand-off, renewal,
 * guarded writes.
 *
 * ```ts
 * import Redis from 'ioredis';
 * import { Locks } from 'redis-lock-client';
 *
 * const locks = new Locks(new Redis());
 * await locks.using('order:42', 30_000, async (signal, lease) => {
 *   await db.write(order, { fence: lease.fence }); // the resource refuses stale fences
 * });
 * ```
 */
var locks_js_1 = require("./locks.js");
Object.defineProperty(exports, "Locks", { enumerable: true, get: function () { return locks_js_1.Locks; } });
var lease_js_1 = require("./lease.js");
Object.defineProperty(exports, "Lease", { enumerable: true, get: function () { return lease_js_1.Lease; } });
var errors_js_1 = require("./errors.js");
Object.defineProperty(exports, "LockError", { enumerable: true, get: function () { return errors_js_1.LockError; } });
Object.defineProperty(exports, "LockLostError", { enumerable: true, get: function () { return errors_js_1.LockLostError; } });
Object.defineProperty(exports, "ModuleMissingError", { enumerable: true, get: function () { return errors_js_1.ModuleMissingError; } });
Object.defineProperty(exports, "NotAcquiredError", { enumerable: true, get: function () { return errors_js_1.NotAcquiredError; } });
Object.defineProperty(exports, "NotHeldError", { enumerable: true, get: function () { return errors_js_1.NotHeldError; } });
Object.defineProperty(exports, "StaleFenceError", { enumerable: true, get: function () { return errors_js_1.StaleFenceError; } });
