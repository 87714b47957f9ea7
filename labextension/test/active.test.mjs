// Unit tests of the kernel's runs per cell as the page reads them (parseActiveRuns, src/messages.ts;
// kernel side nbspawn/views/_active.py): tolerant of what the kernel should not have sent.
import assert from 'node:assert/strict';
import test from 'node:test';

import { parseActiveRuns } from '../lib/bundled/messages.mjs';

const live = { run_id: 'r2', model_id: 'm', display_id: 'd', started_at: 1.5, nprocs: 2, log_dir: '/l' };

test('the active runs: a running cell, an ended one, and what is not a run', () => {
  const runs = parseActiveRuns({
    type: 'active',
    runs: [
      { cell_id: 'c1', run_id: 'r2', execution_count: 3, status: 'running', live, frozen: null },
      { cell_id: 'c2', run_id: 'r1', execution_count: null, status: 'ended', live: null, frozen: { 'text/plain': 'x' } },
      { cell_id: '', run_id: 'r0' },
      'nonsense',
      { cell_id: 'c3', run_id: 'r3', status: 'ended', frozen: null }
    ]
  });
  assert.deepEqual(runs, [
    { cell_id: 'c1', run_id: 'r2', execution_count: 3, status: 'running', live, frozen: null },
    { cell_id: 'c2', run_id: 'r1', execution_count: null, status: 'ended', live: null, frozen: { 'text/plain': 'x' } },
    { cell_id: 'c3', run_id: 'r3', execution_count: null, status: 'ended', live: null, frozen: null }
  ]);
});

test('anything but the active message is null', () => {
  assert.equal(parseActiveRuns(null), null);
  assert.equal(parseActiveRuns({ type: 'replay', runs: [] }), null);
  assert.equal(parseActiveRuns({ type: 'active', runs: {} }), null);
  assert.deepEqual(parseActiveRuns({ type: 'active', runs: [] }), []);
});
