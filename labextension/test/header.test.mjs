// Unit tests of the live view's redraw keys (src/header.ts and src/pane.ts bundled by esbuild into lib/bundled/;
// headerFacts and rankKey need no DOM): what the header and a rank's chip draw is what the view keys their redraws on
import assert from 'node:assert/strict';
import test from 'node:test';

import { headerFacts } from '../lib/bundled/header.mjs';

/** A live 2-rank run on one 16 GB GPU: the ranks' host memory steady, their torch holding `reserved` there. */
function liveRun(reserved, warning = null) {
  return {
    version: 2, run_id: '20261203-110000-abcdef', nprocs: 2, start_method: 'forkserver', program: null, backend: 'nccl',
    log_dir: '/tmp/logs', started_at: 0, duration: null, status: 'running', world: null, world_cell: null, error: null,
    output_in: '', memory: { total: 16e9, used: 6e9, source: 'machine' }, memory_warning: warning,
    gpus: [{ gpu: 'GPU 0', name: 'Tesla T4', total: 16e9, reserved }],
    ranks: [0, 1].map(rank => ({ rank, status: 'running', rss: 2e9, gpu_reserved: reserved / 2 })),
  };
}

test("a GPU's figure that changes while nothing else does changes the header's facts", () => {
  // the live view's hand-kept key had left the GPUs out: such a change alone would not have redrawn it
  const before = headerFacts(liveRun(3e9));
  const after = headerFacts(liveRun(7e9));
  assert.equal(before.memory, after.memory);
  assert.deepEqual(before.gpus.map(g => g.words), ['ranks 3.0 GB of 16.0 GB']);
  assert.deepEqual(after.gpus.map(g => g.words), ['ranks 7.0 GB of 16.0 GB']);
  assert.notEqual(JSON.stringify(before), JSON.stringify(after));
});

test("a warning is drawn on what it is about: a GPU's on that GPU, the host's on the memory", () => {
  const gpu = headerFacts(liveRun(15e9, 'GPU 0 is nearly full: the ranks reserved 15.0 GB of its 16.0 GB'));
  assert.deepEqual(
    gpu.gpus.map(g => [g.warned, g.title]),
    [[true, 'GPU 0 is nearly full: the ranks reserved 15.0 GB of its 16.0 GB']],
  );
  assert.equal(gpu.memoryWarning, '');
  const host = headerFacts(liveRun(3e9, 'memory is running out: 14.0 GB of the machine\'s 16.0 GB in use'));
  assert.deepEqual(host.gpus.map(g => [g.warned, g.title]), [[false, 'Tesla T4']]);
  assert.match(host.memoryWarning, /^memory is running out/);
});

test('the counts, the world and a program are in the words the header draws', () => {
  const run = liveRun(0);
  run.ranks[1].status = 'failed';
  run.world = 'w';
  run.world_cell = 3;
  run.program = 'train.py --lr 0.1';
  const facts = headerFacts(run);
  assert.equal(facts.counts, '1 failed · 1 running');
  assert.equal(facts.world, 'w · cell 3');
  assert.equal(facts.program, 'train.py --lr 0.1');
});

test("a rank's chip key: what the chip draws changes it, what the pane's body draws apart does not", async () => {
  const { rankKey } = await import('../lib/bundled/pane.mjs');
  const run = liveRun(3e9);
  const rank = { ...run.ranks[1], output: [], elided_lines: 0 };
  const key = rankKey(rank, run);
  // a flood: more output, more lines elided, every update
  assert.equal(rankKey({ ...rank, output: [['stdout', 'x\n']], elided_lines: 5000 }, run), key);
  // the chip's "after rank 0"
  assert.notEqual(rankKey({ ...rank, status: 'failed_after', after: 0 }, run), rankKey({ ...rank, status: 'failed_after', after: null }, run));
  // the root cause's mark
  assert.notEqual(rankKey(rank, { ...run, error: { rank: 1 } }), key);
});
