// The CommonJS build: require() gives the same API.
const assert = require('node:assert/strict');
const { test } = require('node:test');

test('require() loads the CommonJS build', () => {
  const lib = require('redis-lock-client');
  for (const name of ['Locks', 'Lease', 'NotHeldError', 'StaleFenceError', 'LockLostError', 'ModuleMissingError']) {
    assert.equal(typeof lib[name], 'function', name);
  }
  const e = new lib.StaleFenceError(1, 2);
  assert.ok(e instanceof lib.LockError && e instanceof Error);
  assert.equal(e.name, 'StaleFenceError');
});
