// Unit tests of the live view's output model (src/output.ts bundled by esbuild into lib/bundled/output.mjs; no DOM needed): node --test test/
import assert from 'node:assert/strict';
import test from 'node:test';

import { formatElapsed, stoppedByUser } from '../lib/bundled/format.mjs';
import { LiveOutput, entryText } from '../lib/bundled/output.mjs';

const text = e => entryText(e);
const bar = (value, style = '') => ({
  type: 'box', dir: 'row',
  children: [{ type: 'text', value: 'train' }, { type: 'progress', value, min: 0, max: 10, bar_style: style }],
});

test('a bar being redrawn lives at the bottom; completed, it lands at the end of the flow', () => {
  const out = new LiveOutput();
  const updates = [];
  out.subscribe(u => updates.push(u));
  out.append([[0, 'stderr', '\rtrain  10%'], [0, 'stdout', 'step 1\n']]);
  // drawn once it is just a line
  assert.deepEqual(out.entries(0).map(text), ['train  10%', 'step 1']);
  out.append([[0, 'stderr', '\rtrain  20%'], [0, 'stdout', 'step 2\n']]);
  // redrawn: out of the flow, at the bottom
  assert.deepEqual(out.entries(0).map(text), ['step 1', 'step 2']);
  assert.deepEqual(out.bars(0).map(text), ['train  20%']);
  assert.deepEqual(out.lines(0).map(l => l.segments.map(s => s.text).join('')), ['step 1', 'step 2', 'train  20%']);
  assert.ok(updates[1].removed.has(out.bars(0)[0]));
  assert.deepEqual([...updates[1].bars], [0]);
  assert.deepEqual(updates[1].added.map(text), ['step 2']);
  out.append([[0, 'stdout', 'step 3\n'], [0, 'stderr', '\rtrain 100%\n'], [0, 'stdout', 'done\n']]);
  assert.deepEqual(out.entries(0).map(text), ['step 1', 'step 2', 'step 3', 'train 100%', 'done']);
  assert.deepEqual(out.bars(0), []);
  assert.deepEqual(out.merged().map(text), ['step 1', 'step 2', 'step 3', 'train 100%', 'done']);
  // stdout output does not touch the stderr bar
  out.append([[0, 'stderr', '\rnext 1%'], [0, 'stderr', '\rnext 2%']]);
  const n = updates.length;
  out.append([[0, 'stdout', 'x\n']]);
  assert.equal(updates[n].changed.size, 0);
});

test('the merged view: flows in arrival order, one bar per rank at the bottom, by rank', () => {
  const out = new LiveOutput();
  out.append([[2, 'stderr', '\r2: 1%\r2: 5%'], [0, 'stdout', 'a\n'], [1, 'stderr', '\r1: 1%\r1: 9%'], [2, 'stdout', 'b\n']]);
  assert.deepEqual(out.merged().map(e => [e.rank, text(e)]), [[0, 'a'], [2, 'b']]);
  assert.deepEqual(out.mergedBars().map(e => [e.rank, text(e)]), [[1, '1: 9%'], [2, '2: 5%']]);
  out.append([[1, 'stderr', '\r1: 100%\n']]);
  assert.deepEqual(out.merged().map(e => [e.rank, text(e)]), [[0, 'a'], [2, 'b'], [1, '1: 100%']]);
  assert.equal(out.count('merged'), 3);
});

test('display items are in the flow in order with text; update replaces every earlier item with that id', () => {
  const out = new LiveOutput();
  const updates = [];
  out.subscribe(u => updates.push(u));
  const png = { kind: 'data', id: 'fig', mime: 'image/png', value: 'iVBORw0KGgo=', text: '<Figure>', meta: { width: 64 } };
  out.append([[0, 'stdout', 'before\n'], [0, 'display', png], [0, 'stdout', 'between\n'], [0, 'display', png], [0, 'stdout', 'after\n']]);
  const flow = out.entries(0);
  assert.deepEqual(flow.map(e => e.kind), ['line', 'display', 'line', 'display', 'line']);
  assert.equal(flow[1].item.meta.width, 64);
  out.append([[0, 'display', { kind: 'update', id: 'fig', mime: 'text/html', value: '<b>new</b>', text: '' }]]);
  assert.deepEqual(out.entries(0).map(e => (e.kind === 'display' ? e.item.value : text(e))),
    ['before', '<b>new</b>', 'between', '<b>new</b>', 'after']);
  const u = updates.at(-1);
  assert.deepEqual([...u.changed], [flow[1], flow[3]]);
  assert.equal(u.added.length, 0);
  // an update of an unknown id, and junk, change nothing
  out.append([[0, 'display', { kind: 'update', id: 'nope', mime: 'text/plain', value: 'x' }], [0, 'display', 'junk'], [0, 'display', { kind: 'weird' }]]);
  assert.equal(out.entries(0).length, 5);
});

test('clear_output: now, or (wait) when the next output of that rank arrives', () => {
  const out = new LiveOutput();
  const updates = [];
  out.subscribe(u => updates.push(u));
  out.append([[0, 'stdout', 'a\n'], [1, 'stdout', 'other\n'], [0, 'display', { kind: 'clear', wait: false }], [0, 'stdout', 'b\n']]);
  assert.deepEqual(out.entries(0).map(text), ['b']);
  assert.deepEqual([...updates[0].cleared], [0]);
  out.append([[0, 'display', { kind: 'clear', wait: true }]]);
  assert.deepEqual(out.entries(0).map(text), ['b']);
  out.append([[0, 'stdout', 'c\n']]);
  assert.deepEqual(out.entries(0).map(text), ['c']);
  assert.deepEqual(out.entries(1).map(text), ['other']);
  assert.deepEqual(out.merged().map(text), ['other', 'c']);
});

test('a notebook progress bar (a widget updated in place) floats at the bottom until it finishes', () => {
  const out = new LiveOutput();
  const item = (kind, value, style) => ({ kind, id: 'widget:abc', mime: 'application/vnd.nbspawn.widget+json', value: bar(value, style), text: '' });
  out.append([[0, 'display', item('data', 0)], [0, 'stdout', 'epoch 1\n']]);
  assert.deepEqual(out.entries(0).map(e => e.kind), ['display', 'line']);
  out.append([[0, 'display', item('update', 3)], [0, 'stdout', 'loss 0.5\n']]);
  assert.deepEqual(out.entries(0).map(text), ['epoch 1', 'loss 0.5']);
  assert.equal(out.bars(0).length, 1);
  assert.equal(out.bars(0)[0].item.value.children[1].value, 3);
  out.append([[0, 'display', item('update', 10, 'success')], [0, 'stdout', 'epoch 2\n']]);
  assert.deepEqual(out.bars(0), []);
  assert.deepEqual(out.entries(0).map(e => e.kind === 'display' ? e.item.value.children[1].value : text(e)),
    ['epoch 1', 'loss 0.5', 10, 'epoch 2']);
});

test('at most `limit` entries per rank; the rest is counted as elided', () => {
  const out = new LiveOutput(5);
  let removed = 0;
  out.subscribe(u => (removed += u.removed.size));
  const lines = Array.from({ length: 12 }, (_, i) => `line ${i}\n`).join('');
  out.append([[1, 'stdout', lines], [2, 'stdout', 'other\n']], { 1: 100 });
  assert.deepEqual(out.entries(1).map(text), ['line 7', 'line 8', 'line 9', 'line 10', 'line 11']);
  assert.equal(out.elided(1), 100 + 7);
  assert.equal(removed, 7);
  assert.equal(out.merged().filter(e => e.rank === 1).length, 5);
  assert.deepEqual(out.ranks(), [1, 2]);
});

test('a replay replaces everything, display items included', () => {
  const out = new LiveOutput();
  let resets = 0;
  out.subscribe(u => (resets += u.reset ? 1 : 0));
  out.append([[0, 'stdout', 'old\n']]);
  out.reset({ 0: [['stdout', 'a\n'], ['display', { kind: 'data', id: null, mime: 'text/plain', value: 'shown', text: 'shown' }], ['stderr', 'b\n']], 3: [['stdout', 'c']] }, { 0: 4 });
  assert.equal(resets, 1);
  assert.deepEqual(out.entries(0).map(e => [e.kind, e.kind === 'line' ? e.line.stream : e.item.value]),
    [['line', 'stdout'], ['display', 'shown'], ['line', 'stderr']]);
  assert.deepEqual(out.entries(3).map(text), ['c']);
  assert.equal(out.elided(0), 4);
});

test('a run saved without its order interleaves the ranks by position', () => {
  const out = new LiveOutput();
  out.reset({ 0: [['stdout', 'a0\na1\na2\n']], 1: [['stdout', 'b0\nb1\n']] });
  out.interleave();
  assert.deepEqual(out.merged().map(text), ['a0', 'b0', 'a1', 'b1', 'a2']);
  assert.equal(out.byArrival, false);
});

test('tails given with their order merge in the order the ranks printed, each rank in its own', () => {
  const out = new LiveOutput();
  const tails = {
    0: [['stdout', 'a0\n'], ['stdout', 'a1\n'], ['display', { kind: 'data', id: null, mime: 'text/plain', value: 'fig', text: 'fig' }]],
    1: [['stdout', 'b0\n'], ['stdout', 'b1\n'], ['stdout', 'b2\n'], ['stderr', 'late']]
  };
  // rank 1 printed three lines first, then rank 0 its two lines and a figure, then rank 1 again
  out.reset(tails, {}, [1, 1, 1, 0, 0, 0, 1]);
  assert.deepEqual(out.merged().map(e => [e.rank, text(e)]),
    [[1, 'b0'], [1, 'b1'], [1, 'b2'], [0, 'a0'], [0, 'a1'], [0, '[text/plain]'], [1, 'late']]);
  assert.deepEqual(out.entries(1).map(text), ['b0', 'b1', 'b2', 'late']);
  assert.equal(out.byArrival, true);
  // an order that names too few chunks (or too many, or an unknown rank) loses nothing
  out.reset(tails, {}, [1, 7, 0]);
  assert.deepEqual(out.merged().map(e => [e.rank, text(e)]),
    [[1, 'b0'], [0, 'a0'], [0, 'a1'], [0, '[text/plain]'], [1, 'b1'], [1, 'b2'], [1, 'late']]);
  out.reset(tails, {}, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]);
  assert.equal(out.merged().length, 7);
});

test('malformed messages are ignored, not thrown', () => {
  const out = new LiveOutput();
  out.append([['x', 'stdout', 'a\n'], [0, 'stdout', 42], [0, 'weird', 'ok\n'], null, [0]], { 0: 'many', x: 3 });
  assert.deepEqual(out.entries(0).map(e => [e.line.stream, text(e)]), [['stdout', 'ok']]);
  out.append(null);
  out.reset(null, null);
  assert.deepEqual(out.ranks(), []);
});

test('many bars that land, and a flood, keep the merged order right and bounded', () => {
  const out = new LiveOutput(100);
  for (let i = 0; i < 300; i++) {
    out.append([[i % 3, 'stderr', `\rbar ${i} 1%\rbar ${i} 50%`], [i % 3, 'stdout', `line ${i}\n`], [i % 3, 'stderr', `\rbar ${i} done\n`]]);
  }
  const merged = out.merged();
  assert.equal(merged.length, 300);
  assert.deepEqual(merged.slice(-2).map(text), ['line 299', 'bar 299 done']);
  const seqs = merged.map(e => e.seq);
  assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b));
  assert.equal(new Set(merged).size, merged.length);
});

test('a stopped run says how the user stopped it', () => {
  assert.equal(stoppedByUser('%spawn stop'), 'stopped by you (%spawn stop)');
  assert.equal(stoppedByUser('run.stop()'), 'stopped by you (run.stop())');
  assert.equal(stoppedByUser('Stop button'), 'stopped by you (Stop)');
  assert.equal(stoppedByUser(null), 'stopped by you (Stop)'); // a bundle saved before the kernel said
});

test('the clock', () => {
  assert.equal(formatElapsed(7.9), '7 s');
  assert.equal(formatElapsed(65), '1 min 05 s');
  assert.equal(formatElapsed(3725), '1 h 02 min');
});

test('queued output is parsed a budget at a time, in order, and told to views once per drain', () => {
  const out = new LiveOutput();
  const updates = [];
  out.subscribe(u => updates.push(u));
  out.enqueue([[0, 'stdout', 'a\n'], [1, 'stdout', 'b\n']], { 0: 3 });
  out.enqueue([[0, 'stdout', 'c\n']]);
  // nothing parsed yet: the message handler only queued
  assert.equal(out.queued, 3);
  assert.deepEqual(out.entries(0), []);
  assert.equal(updates.length, 0);
  // a zero budget still makes progress (a few chunks), the rest waits
  const many = Array.from({ length: 100 }, (_, i) => [0, 'stdout', `x${i}\n`]);
  out.enqueue(many);
  assert.equal(out.drain(0), true);
  assert.ok(out.queued > 0 && out.queued < 103);
  assert.equal(updates.length, 1);
  assert.equal(out.elided(0), 3);
  while (out.drain(0)) {
    // next frame
  }
  assert.equal(out.queued, 0);
  assert.deepEqual(out.entries(0).slice(0, 3).map(text), ['a', 'c', 'x0']);
  assert.deepEqual(out.entries(0).slice(-1).map(text), ['x99']);
  assert.deepEqual(out.entries(1).map(text), ['b']);
  // nothing queued: no update
  const n = updates.length;
  assert.equal(out.drain(), false);
  assert.equal(updates.length, n);
});

test('a rank flooding faster than frames: queued text beyond what the flow keeps is dropped unparsed, as elided', () => {
  const out = new LiveOutput(10);
  // a display item queued early survives the drop; rank 1's few lines are untouched
  out.enqueue([[0, 'display', { data: { 'text/plain': 'kept item' } }], [1, 'stdout', 'one\n']]);
  for (let i = 0; i < 2000; i++) {
    out.enqueue([[0, 'stdout', `line ${i}\nmore ${i}\n`]]);
  }
  assert.ok(out.queued < 2000, `queue bounded: ${out.queued}`);
  out.drain();
  const kept = out.entries(0).map(text);
  assert.equal(kept.length, 10);
  assert.deepEqual(kept.slice(-2), ['line 1999', 'more 1999']);
  // every line is either kept or counted: 4000 lines and the item, 10 entries kept
  assert.equal(out.elided(0) + kept.filter(t => !t.startsWith('[')).length, 4000);
  assert.deepEqual(out.entries(1).map(text), ['one']);
  // a replay replaces what was queued
  out.enqueue([[0, 'stdout', 'old\n']]);
  out.reset({ 0: [['stdout', 'fresh\n']] });
  assert.equal(out.queued, 0);
  out.drain();
  assert.deepEqual(out.entries(0).map(text), ['fresh']);
});

test('a run being stopped: the text queued and not drawn yet is dropped, counted as elided; displays stay', () => {
  const out = new LiveOutput();
  out.append([[0, 'stdout', 'drawn\n']]);
  out.enqueue([[0, 'stdout', 'a\nb\n'], [0, 'display', { kind: 'clear' }], [1, 'stdout', 'c\n'], [1, 'stdout', 'd\ne\n']], { 1: 2 });
  out.dropQueued();
  assert.equal(out.queued, 0);
  assert.deepEqual(out.entries(0).map(text), []); // the clear was applied: display items are never dropped
  assert.deepEqual(out.entries(1).map(text), []);
  assert.equal(out.elided(0), 2);
  assert.equal(out.elided(1), 2 + 3); // the kernel's count, and the three lines dropped here
  out.append([[1, 'stdout', 'f\n']]);
  assert.deepEqual(out.entries(1).map(text), ['f']);
});
