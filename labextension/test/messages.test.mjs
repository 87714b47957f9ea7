// Unit tests of the wire (src/messages.ts, bundled into lib/bundled/messages.mjs): decoding of
// what the kernel sends, never throwing on what it should not have sent.  node --test test/
import assert from 'node:assert/strict';
import test from 'node:test';

import { costWords, formatBytes, formatDuration } from '../lib/bundled/format.mjs';
import {
  decodeState,
  decodeWidgetComm,
  decodeWidgetMessage,
  displayUpdate,
  parseBundle,
  parseItem,
  parseLiveInfo,
  parseOrder,
  parseStatus,
  record,
  statusWords,
  stopHeard
} from '../lib/bundled/messages.mjs';
import { LiveOutput, applyWidgetMessage, entryText } from '../lib/bundled/output.mjs';
import { ChunkQueue } from '../lib/bundled/queue.mjs';

// a run record as nbspawn/views/_bundle.py's run_record writes it
const RUN = {
  version: 2, run_id: 'r1', nprocs: 2, start_method: 'spawn', backend: 'gloo', log_dir: '/tmp/logs/r1',
  started_at: 1700000000.5, duration: 3.25, status: 'failed', world: null, world_cell: null,
  error: { rank: 1, summary: 'ValueError: boom' }, output_in: 'text/html',
  ranks: [
    { rank: 0, pid: 11, status: 'done', after: null, exit_code: 0, signal: null, duration: 3.2, summary: null, traceback: null,
      elided_lines: 0, stdout_path: '/tmp/logs/r1/0/stdout.log', stderr_path: '/tmp/logs/r1/0/stderr.log',
      display_path: '/tmp/logs/r1/0/display.jsonl', node: null, note: 'at a breakpoint (Pdb, cell line 4)', prompt: 'pdb',
      cpu: null, rss: null, peak_rss: 1234000000, gpu: null, gpu_allocated: null, gpu_reserved: null,
      peak_gpu_allocated: null, peak_gpu_reserved: null },
    { rank: 1, pid: 12, status: 'failed', after: null, exit_code: 1, signal: null, duration: 3.1, summary: 'ValueError: boom',
      traceback: 'Traceback ...', elided_lines: 5, stdout_path: 'hostb:/l/1/stdout.log', stderr_path: null,
      display_path: null, node: 'node 1 (hostb)', note: 'waiting in barrier #3 for 25 s; rank 0 has not entered it',
      prompt: null, cpu: 97.5, rss: 850000000, peak_rss: 900000000, gpu: 'GPU 0', gpu_allocated: 3100000000,
      gpu_reserved: 4000000000, peak_gpu_allocated: 3500000000, peak_gpu_reserved: 4000000000 },
  ],
  memory: { total: 12700000000, used: 6100000000, source: 'container' }, memory_warning: null,
  gpus: [{ gpu: 'GPU 0', name: 'Tesla T4', total: 15800000000, reserved: 4000000000 }],
};

test('record: plain objects only', () => {
  assert.deepEqual(record(null), {});
  assert.deepEqual(record([1, 2]), {});
  assert.deepEqual(record('x'), {});
  const o = { a: 1 };
  assert.equal(record(o), o);
});

test('parseBundle keeps a well-formed run record as it is', () => {
  const run = parseBundle(RUN);
  assert.equal(run.run_id, 'r1');
  assert.equal(run.status, 'failed');
  assert.equal(run.started_at, 1700000000.5);
  // the kernel sends no error traceback (the rank record has it): neutral value
  assert.deepEqual(run.error, { rank: 1, summary: 'ValueError: boom', traceback: '', stopped_by: null, verdict: null, cause: null });
  assert.equal(run.ranks.length, 2);
  assert.deepEqual(run.ranks[1], { ...RUN.ranks[1], output: [] });
  assert.deepEqual(run.ranks[0], { ...RUN.ranks[0], output: [] }); // a rank at a prompt: its note and prompt kept
  assert.equal(run.output_in, 'text/html');
  assert.deepEqual(run.memory, RUN.memory); // the machine's (here a container's) memory, as sampled
  assert.equal(run.memory_warning, null);
  assert.deepEqual(run.gpus, RUN.gpus); // the GPUs the ranks used, each against its total
});

test('parseBundle: GPU figures absent or malformed are null or left out, never a throw', () => {
  const older = { ...RUN.ranks[1] }; // a record from before the GPU figures
  for (const key of ['gpu', 'gpu_allocated', 'gpu_reserved', 'peak_gpu_allocated', 'peak_gpu_reserved']) {
    delete older[key];
  }
  const run = parseBundle({ ...RUN, gpus: [{ gpu: 'GPU 1', total: 'big' }, null, 'x', { name: 'no gpu' }], ranks: [older] });
  assert.deepEqual(run.gpus, [{ gpu: 'GPU 1', name: '', total: 0, reserved: 0 }]);
  assert.deepEqual([run.ranks[0].gpu, run.ranks[0].gpu_allocated, run.ranks[0].peak_gpu_allocated], [null, null, null]);
  assert.deepEqual(parseBundle({ ...RUN, gpus: undefined }).gpus, []);
});

test('parseBundle: memory figures that are absent or malformed are null, never a throw', () => {
  const older = { ...RUN.ranks[1] }; // a record from before the figures
  delete older.cpu;
  delete older.rss;
  delete older.peak_rss;
  const run = parseBundle({ ...RUN, memory: { total: 'lots', used: 1 }, ranks: [older] });
  assert.equal(run.memory, null);
  assert.deepEqual([run.ranks[0].cpu, run.ranks[0].rss, run.ranks[0].peak_rss], [null, null, null]);
  assert.equal(parseBundle({ ...RUN, memory: { total: 2, used: 1, source: 'x' } }).memory.source, 'machine');
});

test('a rank\'s cost in words: CPU, memory now, its peak when higher; bytes as the kernel writes them', () => {
  assert.equal(formatBytes(5.14e9), '5.1 GB');
  assert.equal(formatBytes(849.6e6), '850 MB');
  assert.equal(formatBytes(null), '');
  assert.equal(costWords(RUN.ranks[1]), 'CPU 98% · 850 MB · peak 900 MB · GPU 0 3.1 GB (4.0 GB reserved)');
  // ended: the GPU's peak (torch's max_memory_allocated) and what it reserved at the most
  assert.equal(costWords({ peak_rss: 9e8, gpu: 'GPU 2', peak_gpu_allocated: 3.5e9, peak_gpu_reserved: 4e9 }), 'peak 900 MB · GPU 2 peak 3.5 GB (4.0 GB reserved)');
  assert.equal(costWords({ gpu: 'GPU 2' }), ''); // a GPU named with no figure says nothing
  assert.equal(costWords({ cpu: null, rss: null, peak_rss: 1.234e9 }), 'peak 1.2 GB'); // ended: its peak only
  assert.equal(costWords({ cpu: 3, rss: 2e9, peak_rss: 2e9 }), 'CPU 3% · 2.0 GB');
  assert.equal(costWords({}), '');
});

test('a rank that failed after the first failure keeps which rank that was, in words too', () => {
  const after = { ...RUN.ranks[1], rank: 0, status: 'failed_after', after: 1 };
  const run = parseBundle({ ...RUN, ranks: [after, RUN.ranks[1]] });
  assert.equal(run.ranks[0].status, 'failed_after');
  assert.equal(run.ranks[0].after, 1);
  assert.equal(statusWords(run.ranks[0]), 'failed after rank 1');
  assert.equal(statusWords(run.ranks[1]), 'failed');
  const older = { ...RUN.ranks[1] }; // a record from before the field: null
  delete older.after;
  assert.equal(parseBundle({ ...RUN, ranks: [older] }).ranks[0].after, null);
});

test('parseBundle: anything malformed gets a neutral value, never a throw', () => {
  for (const junk of [null, undefined, 42, 'run', [], [1, 2]]) {
    const run = parseBundle(junk);
    assert.equal(run.version, 1);
    assert.equal(run.status, 'running');
    assert.deepEqual(run.ranks, []);
    assert.equal(run.error, null);
    assert.equal(run.nprocs, 0);
  }
  const run = parseBundle({
    nprocs: 'four', duration: Infinity, started_at: NaN, error: 'x',
    ranks: [null, 'x', { pid: '12', status: 7, elided_lines: -1 }, { rank: 5 }],
  });
  // non-objects dropped; a rank without a number is numbered by its position among the kept ones
  assert.deepEqual(run.ranks.map(r => r.rank), [0, 5]);
  assert.equal(run.ranks[0].pid, null);
  assert.equal(run.ranks[0].status, 'running');
  assert.equal(run.ranks[0].elided_lines, -1);
  assert.equal(run.nprocs, 2); // from the ranks
  assert.equal(run.duration, null);
  assert.equal(run.started_at, null);
  assert.equal(run.error, null);
});

test('parseBundle: a version 1 bundle carries each rank output as chunks', () => {
  const img = { kind: 'data', mime: 'image/png', value: 'iVBOR' };
  const run = parseBundle({ version: 1, ranks: [{ rank: 0, output: [['stdout', 'a\n'], ['display', img], ['x'], 'y', [3, 4]] }] });
  assert.deepEqual(run.ranks[0].output, [['stdout', 'a\n'], ['display', img], ['stdout', '']]);
});

test('parseItem: the three kinds, coerced; anything else is not an item', () => {
  assert.deepEqual(parseItem({ mime: 'image/png', value: 'iVBOR', meta: { width: 64 } }), {
    kind: 'data', id: null, mime: 'image/png', value: 'iVBOR', text: '', meta: { width: 64 }, wait: false,
  });
  assert.equal(parseItem({ kind: 'update', id: 'fig' }).id, 'fig');
  assert.equal(parseItem({ kind: 'clear', wait: true }).wait, true);
  assert.equal(parseItem({ kind: 'other' }), null);
  assert.equal(parseItem([]), null);
  assert.equal(parseItem('x'), null);
  assert.equal(parseItem({ id: 3, mime: {}, meta: [] }).mime, 'text/plain');
});

test('decodeWidgetMessage: output and replay, else nothing', () => {
  const out = decodeWidgetMessage({ type: 'output', chunks: [[0, 'stdout', 'a\n']], elided: { 0: 3 } });
  assert.deepEqual(out, { type: 'output', chunks: [[0, 'stdout', 'a\n']], elided: { 0: 3 } });
  assert.deepEqual(decodeWidgetMessage({ type: 'output', chunks: 'x' }), null);
  assert.deepEqual(decodeWidgetMessage({ type: 'replay', tails: { 0: [['stdout', 'b\n']] } }), {
    type: 'replay', tails: { 0: [['stdout', 'b\n']] }, order: null, elided: {},
  });
  assert.deepEqual(decodeWidgetMessage({ type: 'replay', tails: [1], elided: null }), { type: 'replay', tails: {}, order: null, elided: {} });
  assert.deepEqual(decodeWidgetMessage({ type: 'replay', tails: {}, order: '1*2,0', elided: {} }).order, [1, 1, 0]);
  assert.equal(decodeWidgetMessage({ type: 'stop' }), null);
  assert.equal(decodeWidgetMessage(null), null);
});

test('parseOrder: runs of one rank back to one rank per chunk; anything malformed is no order', () => {
  assert.deepEqual(parseOrder('1*3,0,2'), [1, 1, 1, 0, 2]);
  assert.deepEqual(parseOrder('12*2,3'), [12, 12, 3]);
  assert.deepEqual(parseOrder(''), []);
  for (const bad of [undefined, null, 3, '1*', '*2', '1,,2', 'a', '1*2*3', ' 1', '-1']) {
    assert.equal(parseOrder(bad), null, String(bad));
  }
  assert.equal(parseOrder('0*2000000'), null); // more chunks than any tail holds
});

test('applyWidgetMessage: a replay with its order merges the ranks as they printed', () => {
  const out = new LiveOutput();
  applyWidgetMessage(out, { type: 'replay', tails: { 0: [['stdout', 'a\n']], 1: [['stdout', 'b\nc\n']] }, order: '1,0', elided: {} });
  assert.deepEqual(out.merged().map(e => [e.rank, entryText(e)]), [[1, 'b'], [1, 'c'], [0, 'a']]);
});

test('applyWidgetMessage: output is queued and drawn later, a replay replaces everything at once', () => {
  const out = new LiveOutput();
  applyWidgetMessage(out, { type: 'output', chunks: [[0, 'stdout', 'queued\n']], elided: {} });
  assert.equal(out.queued, 1);
  assert.deepEqual(out.entries(0), []);
  applyWidgetMessage(out, { type: 'replay', tails: { 1: [['stdout', 'kept\n']] }, elided: { 1: 7 } });
  assert.equal(out.queued, 0); // what was queued is older than the tails
  assert.deepEqual(out.ranks(), [1]);
  assert.deepEqual(out.entries(1).map(entryText), ['kept']);
  assert.equal(out.elided(1), 7);
  applyWidgetMessage(out, 'junk');
  assert.deepEqual(out.entries(1).map(entryText), ['kept']);
});

test('decodeState: only the traits a state update has, in a usable form', () => {
  assert.deepEqual(decodeState({ header: { run_id: 'r' }, ranks: [], error: null }), {
    header: { run_id: 'r' }, ranks: [], error: null,
  });
  assert.deepEqual(decodeState({ header: null, ranks: {} }), {});
  assert.deepEqual(decodeState({ error: undefined }), { error: null });
  assert.deepEqual(decodeState('x'), {});
});

test('decodeWidgetComm: a state update or a custom message', () => {
  assert.deepEqual(decodeWidgetComm({ method: 'update', state: { ranks: [] } }), { method: 'update', state: { ranks: [] } });
  assert.deepEqual(decodeWidgetComm({ method: 'update' }), { method: 'update', state: {} });
  assert.deepEqual(decodeWidgetComm({ method: 'custom', content: { type: 'output' } }), {
    method: 'custom', content: { type: 'output' },
  });
  assert.equal(decodeWidgetComm({ method: 'echo_update' }), null);
});

test('parseLiveInfo: needs a model id or a display id', () => {
  const info = { run_id: 'r', model_id: 'm', display_id: 'd', started_at: 1.5, nprocs: 4, log_dir: '/l' };
  assert.deepEqual(parseLiveInfo(info), info);
  assert.deepEqual(parseLiveInfo({ display_id: 'd', nprocs: 'x' }), {
    run_id: '', model_id: '', display_id: 'd', started_at: null, nprocs: null, log_dir: undefined,
  });
  assert.equal(parseLiveInfo({ run_id: 'r' }), null);
  assert.equal(parseLiveInfo(null), null);
});

test('parseStatus: a status message over the last one', () => {
  const first = parseStatus({ run_id: 'r', status: 'running', nprocs: 4, running: [0, 1, 2, 3] });
  assert.deepEqual(first, { run_id: 'r', status: 'running', nprocs: 4, running: [0, 1, 2, 3] });
  assert.deepEqual(parseStatus({ running: [1, 'x', 3] }, first), { run_id: 'r', status: 'running', nprocs: 4, running: [1, 3] });
  assert.deepEqual(parseStatus({ status: 'failed' }, first).running, [0, 1, 2, 3]);
  assert.deepEqual(parseStatus(null), { run_id: '', status: 'running', nprocs: 0, running: null });
  assert.equal(parseStatus({ running: [0, 1] }).nprocs, 2);
});

const iopub = (msg_type, content, parent_header = {}) => ({ header: { msg_type }, parent_header, content });

test('displayUpdate: the live display replaced, and only that display', () => {
  const msg = iopub('update_display_data', { data: { 'text/plain': 'x' }, metadata: {}, transient: { display_id: 'd' } });
  assert.deepEqual(displayUpdate(msg, 'd'), { data: { 'text/plain': 'x' }, metadata: {} });
  assert.equal(displayUpdate(msg, 'other'), null);
  assert.equal(displayUpdate(msg, ''), null);
  assert.equal(displayUpdate(msg, undefined), null);
  assert.equal(displayUpdate(iopub('display_data', msg.content), 'd'), null);
});

test('stopHeard: what shows that the kernel heard Stop', () => {
  const heard = msg => stopHeard(msg, 'model', 'disp', 'stop-msg');
  assert.ok(heard(iopub('status', { execution_state: 'idle' }, { msg_id: 'stop-msg' })));
  assert.ok(!heard(iopub('status', { execution_state: 'busy' }, { msg_id: 'stop-msg' })));
  assert.ok(!heard(iopub('status', { execution_state: 'idle' }, { msg_id: 'other' })));
  assert.ok(!stopHeard(iopub('status', { execution_state: 'idle' }, { msg_id: '' }), 'model', 'disp', ''));
  const update = stopping => iopub('comm_msg', { comm_id: 'model', data: { method: 'update', state: { header: { stopping } } } });
  assert.ok(heard(update(true)));
  assert.ok(!heard(update(false)));
  assert.ok(heard(iopub('comm_close', { comm_id: 'model' })));
  assert.ok(!heard(iopub('comm_close', { comm_id: 'other' })));
  assert.ok(heard(iopub('update_display_data', { transient: { display_id: 'disp' } })));
  assert.ok(!stopHeard(iopub('update_display_data', { transient: { display_id: '' } }), 'model', '', ''));
  assert.ok(!heard(iopub('stream', { name: 'stdout', text: 'x' })));
});

test('ChunkQueue: taken in order within a budget; text beyond a rank keeps is elided, displays stay', () => {
  const q = new ChunkQueue(2);
  q.push([[0, 'stdout', 'a\n'], [0, 'display', { kind: 'clear' }], [1, 'stdout', 'b\n'], 'junk', [0, 'stdout']], { 0: 4, 1: 0 });
  assert.equal(q.length, 3);
  assert.deepEqual(q.takeElided(), { 0: 4 });
  assert.deepEqual(q.takeElided(), {});
  const seen = [];
  assert.equal(q.take(Infinity, c => seen.push(c[2])), 3);
  assert.deepEqual(seen, ['a\n', { kind: 'clear' }, 'b\n']);
  assert.equal(q.length, 0);
  // over 4 limits of queued lines: each rank's older text goes, counted as elided
  q.push([[0, 'stdout', 'old 1\nold 2\n'], [0, 'display', { kind: 'data' }], [0, 'stdout', 'x\ny\n'], [1, 'stdout', '1\n2\n3\n4\n5\n']]);
  const kept = [];
  q.take(Infinity, c => kept.push([c[0], c[2]]));
  assert.deepEqual(kept, [[0, { kind: 'data' }], [0, 'x\ny\n'], [1, '1\n2\n3\n4\n5\n']]);
  assert.deepEqual(q.takeElided(), { 0: 2 });
  q.push([[0, 'stdout', 'z\n']], { 0: 1 });
  q.clear();
  assert.equal(q.length, 0);
  assert.deepEqual(q.takeElided(), {});
});

test('formatDuration', () => {
  assert.equal(formatDuration(null), '');
  assert.equal(formatDuration(0.844), '0.84 s');
  assert.equal(formatDuration(12.34), '12.3 s');
  assert.equal(formatDuration(125), '2 min 05 s');
  assert.equal(formatDuration(3720), '1 h 02 min');
});

test('a run stopped while hung keeps its verdict, and each rank where it was', () => {
  const verdict = 'rank 1 never entered barrier #1 (it is at Cell In[2], line 4: time.sleep(300)); rank 0 waited in it';
  const run = parseBundle({
    run_id: 'r',
    status: 'timeout',
    error: { rank: null, summary: 'SpawnTimeoutError: the run timed out after 10 s', stopped_by: null, verdict },
    ranks: [{ rank: 1, status: 'stopped', signal: 'SIGTERM', note: 'has not entered barrier #1 (Cell In[2], line 4: time.sleep(300))' }]
  });
  assert.equal(run.error.verdict, verdict);
  assert.equal(run.ranks[0].note, 'has not entered barrier #1 (Cell In[2], line 4: time.sleep(300))');
  assert.equal(parseBundle({ error: { summary: 'x', verdict: 3 } }).error.verdict, null); // not a string: none
});

test('a stopped run says what stopped it', () => {
  const run = parseBundle({ run_id: 'r', status: 'stopped', ranks: [], error: { rank: null, summary: 'stopped', stopped_by: '%spawn stop' } });
  assert.equal(run.error.stopped_by, '%spawn stop');
});
