// Unit tests of the live view's output model (src/live.ts bundled by esbuild into lib/live.bundle.mjs; no DOM needed): node --test test/
import assert from 'node:assert/strict';
import test from 'node:test';

import { LiveOutput, formatElapsed } from '../lib/live.bundle.mjs';

const text = line => line.segments.map(s => s.text).join('');

test('a progress bar is one line, redrawn in place', () => {
  const out = new LiveOutput();
  const updates = [];
  out.subscribe(u => updates.push(u));
  out.append([[0, 'stderr', '\rtrain  10%'], [0, 'stdout', 'step 1\n']]);
  out.append([[0, 'stderr', '\rtrain  20%'], [0, 'stdout', 'step 2\n']]);
  assert.deepEqual(out.lines(0).map(text), ['train  20%', 'step 1', 'step 2']);
  // the second batch changed the open bar line and added one line
  assert.deepEqual(updates[1].changed.map(([, l]) => text(l)), ['train  20%']);
  assert.deepEqual(updates[1].added.map(([r, l]) => [r, text(l)]), [[0, 'step 2']]);
  assert.deepEqual(out.merged().map(([r, l]) => [r, text(l)]), [[0, 'train  20%'], [0, 'step 1'], [0, 'step 2']]);
});

test('at most `limit` lines per rank; the rest is counted as elided', () => {
  const out = new LiveOutput(5);
  let dropped = 0;
  out.subscribe(u => (dropped += u.dropped.size));
  const lines = Array.from({ length: 12 }, (_, i) => `line ${i}\n`).join('');
  out.append([[1, 'stdout', lines], [2, 'stdout', 'other\n']], { 1: 100 });
  assert.deepEqual(out.lines(1).map(text), ['line 7', 'line 8', 'line 9', 'line 10', 'line 11']);
  assert.equal(out.elided(1), 100 + 7);
  assert.equal(dropped, 7);
  assert.equal(out.merged().filter(([r]) => r === 1).length, 5);
  assert.deepEqual(out.ranks(), [1, 2]);
});

test('a replay replaces everything', () => {
  const out = new LiveOutput();
  let resets = 0;
  out.subscribe(u => (resets += u.reset ? 1 : 0));
  out.append([[0, 'stdout', 'old\n']]);
  out.reset({ 0: [['stdout', 'a\n'], ['stderr', 'b\n']], 3: [['stdout', 'c']] }, { 0: 4 });
  assert.equal(resets, 1);
  assert.deepEqual(out.lines(0).map(l => [l.stream, text(l)]), [['stdout', 'a'], ['stderr', 'b']]);
  assert.deepEqual(out.lines(3).map(text), ['c']);
  assert.equal(out.elided(0), 4);
});

test('malformed messages are ignored, not thrown', () => {
  const out = new LiveOutput();
  out.append([['x', 'stdout', 'a\n'], [0, 'stdout', 42], [0, 'weird', 'ok\n']], { 0: 'many', x: 3 });
  assert.deepEqual(out.lines(0).map(l => [l.stream, text(l)]), [['stdout', 'ok']]);
  out.reset(null, null);
  assert.deepEqual(out.ranks(), []);
});

test('the clock', () => {
  assert.equal(formatElapsed(7.9), '7 s');
  assert.equal(formatElapsed(65), '1 min 05 s');
  assert.equal(formatElapsed(3725), '1 h 02 min');
});
