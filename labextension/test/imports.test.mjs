// The modules of src/ form a DAG, and the pure ones stay pure: node --test test/
// (`node test/imports.test.mjs --print` prints the graph.)
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import test from 'node:test';

const SRC = new URL('../src/', import.meta.url);

/** Each module's imports: `./x` as `x`, packages as they are named. */
function graph() {
  const g = new Map();
  for (const file of readdirSync(SRC).filter(f => f.endsWith('.ts'))) {
    const text = readFileSync(new URL(file, SRC), 'utf8');
    const deps = new Set();
    for (const m of text.matchAll(/^(?:import|export)\b[^;]*?\bfrom\s+'([^']+)'/gms)) {
      deps.add(m[1].startsWith('./') ? m[1].slice(2) : m[1]);
    }
    g.set(file.replace(/\.ts$/, ''), deps);
  }
  return g;
}

const local = (g, name) => [...(g.get(name) ?? [])].filter(d => g.has(d));

/** Every module `name` reaches, itself included. */
function reach(g, name, seen = new Set()) {
  if (!seen.has(name)) {
    seen.add(name);
    for (const d of g.get(name) ?? []) {
      if (g.has(d)) {
        reach(g, d, seen);
      }
    }
  }
  return seen;
}

test('no module imports itself through others (no cycles)', () => {
  const g = graph();
  const state = new Map(); // 1: on the stack, 2: done
  const visit = (name, path) => {
    if (state.get(name) === 2) {
      return;
    }
    assert.notEqual(state.get(name), 1, `import cycle: ${[...path, name].join(' -> ')}`);
    state.set(name, 1);
    for (const d of local(g, name)) {
      visit(d, [...path, name]);
    }
    state.set(name, 2);
  };
  for (const name of g.keys()) {
    visit(name, []);
  }
});

test('the wire, the model and the text modules need no DOM module and no JupyterLab', () => {
  const g = graph();
  for (const name of ['messages', 'format', 'text', 'queue', 'entry', 'output']) {
    const reached = reach(g, name);
    for (const m of reached) {
      assert.ok(['messages', 'format', 'text', 'queue', 'entry', 'output'].includes(m), `${name} reaches ${m}`);
      const packages = [...g.get(m)].filter(d => !g.has(d));
      assert.deepEqual(packages, [], `${m} imports ${packages}`);
    }
  }
});

/** The stateless DOM builders of the run view's pieces (`view.ts` and `pane.ts` put them together). */
const BUILDERS = ['dom', 'lines', 'panehead', 'header', 'tabs'];

test('the DOM builders draw from the model, not from the view', () => {
  const g = graph();
  for (const name of BUILDERS) {
    assert.ok(g.has(name), `no module ${name}`);
    for (const up of ['view', 'pane', 'output', 'widget', 'mime', 'reattach']) {
      assert.ok(!reach(g, name).has(up), `${name} reaches ${up}`);
    }
  }
});

test('dom.ts (the element builder every piece uses) imports nothing', () => {
  assert.deepEqual([...graph().get('dom')], []);
});

test('the line and pane-head pieces know nothing of the header and tabs above them', () => {
  const g = graph();
  for (const name of ['lines', 'panehead']) {
    for (const up of ['header', 'tabs']) {
      assert.ok(!reach(g, name).has(up), `${name} reaches ${up}`);
    }
  }
});

test('the anywidget bundle (widget.ts) reaches no JupyterLab package', () => {
  const g = graph();
  for (const m of reach(g, 'widget')) {
    const packages = [...g.get(m)].filter(d => !g.has(d));
    assert.deepEqual(packages, [], `${m} (reached from widget) imports ${packages}`);
  }
});

if (process.argv.includes('--print')) {
  const g = graph();
  for (const [name, deps] of [...g].sort()) {
    console.log(`${name}: ${[...deps].sort((a, b) => Number(!g.has(a)) - Number(!g.has(b))).join(', ')}`);
  }
}
