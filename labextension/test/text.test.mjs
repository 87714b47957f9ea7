// Unit tests of the pure text module (lib/text.js, built by `npm run build:lib`): node --test test/
import assert from 'node:assert/strict';
import test from 'node:test';

import { TerminalText, applySGR, plainText, renderChunks } from '../lib/text.js';

const txt = lines => lines.map(l => l.segments.map(s => s.text).join(''));

test('carriage return keeps the latest state of a progress line', () => {
  assert.equal(plainText('  3%|▎   | 3/100\r  4%|▍   | 4/100\r100%|████| 100/100\n'), '100%|████| 100/100\n');
  // a trailing \r leaves the line as it is
  assert.deepEqual(txt(renderChunks([['stdout', ' 50%\r']])), [' 50%']);
  // the update may arrive in another chunk
  assert.deepEqual(txt(renderChunks([['stdout', ' 50%\r'], ['stdout', ' 60%\r'], ['stdout', '100%\ndone\n']])), ['100%', 'done']);
});

test('backspace erases, also right after a carriage return', () => {
  assert.equal(plainText('abc\b\bX'), 'aX');
  assert.equal(plainText('abc\r\bX'), 'X');
  assert.equal(plainText('\b\bok'), 'ok');
});

test('streams have their own line and their own colours', () => {
  const lines = renderChunks([
    ['stdout', 'progress 1\r'],
    ['stderr', '\x1b[31mwarn'],
    ['stdout', 'progress 2\r'],
    ['stderr', 'ing\x1b[0m\n'],
    ['stdout', 'progress 3\n'],
  ]);
  assert.deepEqual(txt(lines), ['progress 3', 'warning']);
  assert.equal(lines[0].stream, 'stdout');
  assert.equal(lines[1].stream, 'stderr');
  assert.deepEqual(lines[1].segments, [{ text: 'warning', style: { fg: 1 } }]);
});

test('SGR: 16, 256 and true colours, attributes, resets', () => {
  assert.deepEqual(applySGR({}, '1;32'), { bold: true, fg: 2 });
  assert.deepEqual(applySGR({}, '38;5;208;48;2;1;2;255'), { fg: 208, bg: '#0102ff' });
  assert.deepEqual(applySGR({ fg: 3, bold: true }, '22'), { fg: 3 });
  assert.deepEqual(applySGR({ fg: 3 }, ''), {});
  assert.deepEqual(applySGR({}, '94;101'), { fg: 12, bg: 9 });
  // colon forms: T.416's colour-space slot before r, g, b (issue 30), the slot left out, 256 colours
  assert.deepEqual(applySGR({}, '38:2::10:20:30'), { fg: '#0a141e' });
  assert.deepEqual(applySGR({}, '38:2:7:10:20:30'), { fg: '#0a141e' });
  assert.deepEqual(applySGR({}, '38:2:10:20:30'), { fg: '#0a141e' });
  assert.deepEqual(applySGR({}, '48:5:208'), { bg: 208 });
  assert.deepEqual(applySGR({}, '38:2::10:20:30;1'), { fg: '#0a141e', bold: true });
  assert.deepEqual(applySGR({ underline: true }, '4:0'), {});
  assert.deepEqual(applySGR({}, '4:3'), { underline: true });
  // what the saved snapshot's data-sgr holds (nbspawn.views._sgr.sgr_params) reads back whole
  assert.deepEqual(applySGR({}, '1;4;9;38;2;10;20;30;48;5;250'), {
    bold: true, underline: true, strike: true, fg: '#0a141e', bg: 250
  });
  assert.deepEqual(applySGR({ fg: '#0a141e', bold: true }, '22'), { fg: '#0a141e' });
  assert.deepEqual(applySGR({ fg: 208 }, '39'), {});
  const t = new TerminalText();
  t.write('stdout', 'a\x1b[1mb\x1b[0mc\n');
  assert.deepEqual(t.lines[0].segments.map(s => [s.text, s.style]), [['a', {}], ['b', { bold: true }], ['c', {}]]);
});

test('other escape sequences are dropped, split sequences are joined', () => {
  assert.equal(plainText('\x1b]0;title\x07a\x1b[2Ab\x1b(Bc\x07'), 'abc');
  const lines = renderChunks([['stdout', 'x\x1b['], ['stdout', '32my\n']]);
  assert.deepEqual(lines[0].segments, [{ text: 'x', style: {} }, { text: 'y', style: { fg: 2 } }]);
  // rich-style redraw: \r then erase-line
  assert.equal(plainText('old text\r\x1b[2Knew\n'), 'new\n');
});

test('markup is just text', () => {
  assert.equal(plainText('<script>alert(1)</script>\n'), '<script>alert(1)</script>\n');
});

test('a line drawn over is a bar while it is open', async () => {
  const { isBar } = await import('../lib/text.js');
  const [first] = renderChunks([['stderr', '\r 10%']]);
  assert.equal(isBar(first), false); // drawn once: a line like any other
  const [redrawn] = renderChunks([['stderr', '\r 10%\r 20%']]);
  assert.equal(isBar(redrawn), true);
  const [done] = renderChunks([['stderr', '\r 10%\r100%\n']]);
  assert.equal(isBar(done), false);
  assert.equal(done.redrawn, true);
  const [erased] = renderChunks([['stdout', 'old\x1b[2Knew']]);
  assert.equal(isBar(erased), true);
});
