/**
 * The top of the run view: the header (status badge, rank counts, start method, backend, time, run
 * id, logs, and the live view's extras) and the banner naming a failed run's root cause.
 * Stateless builders; `view.ts` puts them together and rebuilds them when their data changes.
 */

import { h } from './dom';
import { formatBytes, formatDuration, stoppedByUser } from './format';
import { IGpuRecord, IRunBundle } from './messages';

export const RUN_STATUS_LABEL: Record<string, string> = {
  running: 'running',
  succeeded: 'succeeded',
  failed: 'failed',
  timeout: 'timed out',
  interrupted: 'interrupted',
  stopped: 'stopped'
};

/** What the banner says of a run the user stopped with its Stop button. */
export const STOPPED_BY_USER = stoppedByUser(null);

/** `n word`, with an s unless n is 1. */
export function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/** A small "copy" button that puts `text` on the clipboard. */
function copyButton(text: string, label: string): HTMLElement {
  const btn = h(
    'button',
    { class: 'nbs-Copy', type: 'button', title: `Copy ${label}`, 'aria-label': `Copy ${label}` },
    'copy'
  );
  btn.addEventListener('click', ev => {
    ev.stopPropagation();
    void navigator.clipboard?.writeText(text).then(
      () => {
        btn.textContent = 'copied';
        window.setTimeout(() => (btn.textContent = 'copy'), 1200);
      },
      () => undefined
    );
  });
  return btn;
}

/** A labelled path (the run's log directory) in full, with a button that copies it. */
function pathLine(label: string, path: string | null): HTMLElement | null {
  if (!path) {
    return null;
  }
  return h(
    'span',
    { class: 'nbs-Path' },
    h('span', { class: 'nbs-Path-label' }, label),
    h('code', { class: 'nbs-Path-value', title: path }, path),
    copyButton(path, label)
  );
}

/** Extras of a live run's header (the widget): shown instead of "took", and buttons. */
export interface IHeaderExtras {
  /** Meta entries inserted after "backend" (the live view's elapsed-time counter). */
  meta?: Node[];
  /** Controls at the end of the header's first row (the live view's Stop button). */
  actions?: Node[];
}

/** One GPU's entry of the header: its label, its words, and the warning that is about it (or its name) as its title. */
export interface IHeaderGpu {
  label: string;
  words: string;
  warned: boolean;
  title: string;
}

/**
 * Everything the header draws, in the words it draws them: `buildHeader` takes nothing else, so the
 * live view, which redraws the header when these change (`view.ts`), cannot miss a drawn field (the
 * hand-kept key it replaced had the GPUs' figures, the world and the program missing).
 */
export interface IHeaderFacts {
  status: string;
  nprocs: number;
  /** "1 failed · 3 after it": ranks that failed once the first had are counted apart from it. */
  counts: string;
  world: string;
  program: string;
  start: string;
  backend: string;
  took: string;
  memory: string;
  /** The warning about the host's memory (a GPU's is on that GPU's entry). */
  memoryWarning: string;
  gpus: IHeaderGpu[];
  runId: string;
  logDir: string;
}

/** What the header of `run` draws (`buildHeader`). */
export function headerFacts(run: IRunBundle): IHeaderFacts {
  const counts = new Map<string, number>();
  for (const r of run.ranks) {
    counts.set(r.status, (counts.get(r.status) ?? 0) + 1);
  }
  // the warning is drawn on what it is about: a GPU's ("GPU 0 is nearly full: ...") or the host's memory
  const warnedGpu = (run.gpus ?? []).find(g => run.memory_warning?.startsWith(`${g.gpu} `));
  return {
    status: run.status,
    nprocs: run.nprocs,
    counts: ['failed', 'failed_after', 'stopped', 'running', 'done']
      .filter(s => counts.get(s))
      .map(s => `${counts.get(s)} ${s === 'failed_after' ? 'after it' : s}`)
      .join(' · '),
    world: run.world ? (run.world_cell ? `${run.world} · cell ${run.world_cell}` : run.world) : '',
    program: run.program ?? '',
    start: run.start_method,
    backend: run.backend,
    took: formatDuration(run.duration),
    memory: memoryWords(run),
    memoryWarning: (warnedGpu ? null : run.memory_warning) ?? '',
    gpus: (run.gpus ?? []).map(gpu => {
      const warned = gpu === warnedGpu && !!run.memory_warning;
      return { label: gpu.gpu, words: gpuTotalWords(run, gpu), warned, title: (warned && run.memory_warning) || gpu.name };
    }),
    runId: run.run_id,
    logDir: run.log_dir
  };
}

/** The header: status badge, rank count and per-status counts, then start method, backend, time, run id, logs. */
export function buildHeader(facts: IHeaderFacts, extras: IHeaderExtras = {}): HTMLElement {
  const meta = h('div', { class: 'nbs-Header-meta' });
  const addMeta = (label: string, value: string, cls = '') => {
    if (value) {
      meta.appendChild(metaEntry(label, value, cls));
    }
  };
  addMeta('world', facts.world, 'nbs-mod-mono');
  if (facts.program) {
    addMeta('program', facts.program, 'nbs-mod-mono');
  } else {
    addMeta('start', facts.start);
    addMeta('backend', facts.backend);
  }
  for (const node of extras.meta ?? []) {
    meta.appendChild(node);
  }
  addMeta('took', facts.took);
  if (facts.memory) {
    meta.appendChild(metaEntry('memory', facts.memory, facts.memoryWarning ? 'nbs-mod-warn' : ''));
    if (facts.memoryWarning) {
      meta.lastElementChild?.setAttribute('title', facts.memoryWarning);
    }
  }
  for (const gpu of facts.gpus) {
    meta.appendChild(metaEntry(gpu.label, gpu.words, gpu.warned ? 'nbs-mod-warn' : ''));
    if (gpu.title) {
      meta.lastElementChild?.setAttribute('title', gpu.title);
    }
  }
  addMeta('run', facts.runId, 'nbs-mod-mono');
  const logs = pathLine('logs', facts.logDir);
  if (logs) {
    logs.classList.add('nbs-Meta');
    meta.appendChild(logs);
  }
  const actions = extras.actions?.length
    ? h('span', { class: 'nbs-Header-actions' }, ...extras.actions)
    : null;
  return h(
    'div',
    { class: 'nbs-Header' },
    h(
      'div',
      { class: 'nbs-Header-main' },
      h('span', { class: 'nbs-Badge', 'data-status': facts.status }, RUN_STATUS_LABEL[facts.status] ?? facts.status),
      h('span', { class: 'nbs-Header-title' }, plural(facts.nprocs, 'rank')),
      facts.counts ? h('span', { class: 'nbs-Header-counts' }, facts.counts) : null,
      actions
    ),
    meta
  );
}

/** One `label value` entry of the header's second row. */
export function metaEntry(label: string, value: string | Node, cls = ''): HTMLElement {
  return h(
    'span',
    { class: `nbs-Meta ${cls}`.trim() },
    h('span', { class: 'nbs-Meta-label' }, label),
    typeof value === 'string' ? h('span', { class: 'nbs-Meta-value' }, value) : value
  );
}

/** The first line of a summary (an exception's message may run on). */
function oneLine(text: string): string {
  const line = text.split('\n').find(l => l.trim()) ?? '';
  return line.length > 240 ? line.slice(0, 239) + '\u2026' : line;
}

/**
 * A run-level error: one line naming the root cause, which selects that rank's pane (where its
 * traceback is); for a timeout, an interrupt or a stop with no rank to blame, the details.
 */
export function buildBanner(run: IRunBundle, pick?: (rank: number) => void): HTMLElement[] {
  const err =
    run.status === 'stopped' && !run.error
      ? { rank: null, summary: '', traceback: '', stopped_by: null, verdict: null, cause: null }
      : run.error;
  if (!err || !(err.summary || err.traceback || run.status === 'stopped')) {
    return [];
  }
  const errRank = err.rank;
  const errRankKnown = errRank !== null && run.status !== 'stopped' && run.ranks.some(r => r.rank === errRank);
  // a hang's verdict says why it was stopped; what stopped it is the badge (and the title)
  const stopped =
    run.status === 'stopped' ? stoppedByUser(err.stopped_by) : oneLine(err.summary) || RUN_STATUS_LABEL[run.status] || run.status;
  const text = err.verdict ? `Hang: ${oneLine(err.verdict)}` : stopped;
  const banner = h(
    'div',
    { class: err.verdict ? 'nbs-Banner nbs-mod-hang' : 'nbs-Banner', role: 'alert', title: err.verdict ? stopped : undefined },
    h('span', { class: 'nbs-Banner-icon', 'aria-hidden': 'true' }, '!'),
    // a peer's skipped collective: the summary names the ranks itself ("rank 1 never entered ...; rank 0 waited")
    h('span', { class: 'nbs-Banner-text' }, errRankKnown && !err.cause ? h('strong', {}, `rank ${errRank}: `) : null, text)
  );
  if (errRankKnown && pick) {
    banner.classList.add('nbs-mod-link');
    banner.title = `Show rank ${errRank} and its traceback`;
    banner.addEventListener('click', () => pick(errRank));
  }
  const nodes = [banner];
  if (!errRankKnown && err.traceback) {
    nodes.push(
      h(
        'details',
        { class: 'nbs-RunTraceback' },
        h('summary', {}, 'details'),
        h('pre', { class: 'nbs-Traceback-text' }, err.traceback)
      )
    );
  }
  return nodes;
}

/** A GPU's line: "ranks 7.1 GB of 15.8 GB" while they run (reserved by their torch now), "peak 7.1 GB of 15.8 GB" once ended. */
export function gpuTotalWords(run: IRunBundle, gpu: IGpuRecord): string {
  const live = run.ranks.some(r => r.status === 'running' && typeof r.gpu_reserved === 'number');
  const of = gpu.total ? ` of ${formatBytes(gpu.total)}` : '';
  return `${live ? 'ranks' : 'peak'} ${formatBytes(gpu.reserved)}${of}`;
}

/**
 * The ranks' memory against what there is: "ranks 4.8 GB · 6.1 GB of 12.7 GB in use" while it runs
 * (what they hold now), "peak 5.1 GB of 12.7 GB" once ended; '' when nothing was sampled.
 */
export function memoryWords(run: IRunBundle): string {
  const live = run.ranks.some(r => r.status === 'running' && r.rss);
  const held = run.ranks.reduce((sum, r) => sum + ((live ? r.rss : r.peak_rss) ?? 0), 0);
  if (!held) {
    return '';
  }
  const of = run.memory ? ` of ${formatBytes(run.memory.total)}${run.memory.source === 'container' ? ' (container)' : ''}` : '';
  return live
    ? `ranks ${formatBytes(held)}${run.memory ? ` · ${formatBytes(run.memory.used)}${of} in use` : ''}`
    : `peak ${formatBytes(held)}${of}`;
}
