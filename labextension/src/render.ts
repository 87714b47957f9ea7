/**
 * The run view: header, one status chip per rank (tabs), the selected rank's pane or the merged
 * view.  Every piece of worker text reaches the DOM through `textContent`/text nodes only.
 */

import {
  IRankInfo,
  IRunBundle,
  defaultSelection,
  formatDuration
} from './bundle';
import { ILine, ITextStyle, TerminalText } from './text';

type Child = Node | string | null | undefined | false;

/** Create an element; string children become text nodes (never parsed as HTML). */
export function h(
  tag: string,
  attrs: Record<string, string | undefined> = {},
  ...children: Child[]
): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined) {
      el.setAttribute(k, v);
    }
  }
  for (const c of children) {
    if (c !== null && c !== undefined && c !== false) {
      el.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    }
  }
  return el;
}

export const RUN_STATUS_LABEL: Record<string, string> = {
  running: 'running',
  succeeded: 'succeeded',
  failed: 'failed',
  timeout: 'timed out',
  interrupted: 'interrupted',
  stopped: 'stopped'
};

const RANK_ICON: Record<string, string> = {
  done: '\u2713', // ✓
  failed: '\u2715', // ✕
  stopped: '\u25a0', // ■
  running: '' // spinner drawn in CSS
};

/** Distinct hues for the first ranks, none of them red (red is for errors). */
const RANK_HUES = [212, 140, 275, 32, 186, 318, 80, 245, 160, 292];

/** A colour per rank; past the table, hues step by the golden angle so neighbours differ. */
export function rankHue(rank: number): number {
  if (rank < RANK_HUES.length) {
    return RANK_HUES[rank];
  }
  const h = Math.round((rank * 137.508 + 200) % 360);
  return h < 15 || h > 345 ? (h + 30) % 360 : h; // skip red
}

/** xterm's 256-colour palette, indices 16-255 (0-15 are themed CSS classes). */
function palette256(n: number): string {
  if (n < 232) {
    const i = n - 16;
    const steps = [0, 95, 135, 175, 215, 255];
    const r = steps[Math.floor(i / 36)];
    const g = steps[Math.floor(i / 6) % 6];
    const b = steps[i % 6];
    return `rgb(${r}, ${g}, ${b})`;
  }
  const v = 8 + (n - 232) * 10;
  return `rgb(${v}, ${v}, ${v})`;
}

function applyColour(el: HTMLElement, which: 'fg' | 'bg', c: number | string | undefined): void {
  if (c === undefined) {
    return;
  }
  if (typeof c === 'number' && c < 16) {
    el.classList.add(`nbs-${which}-${c}`);
    return;
  }
  const css = typeof c === 'number' ? palette256(c) : /^#[0-9a-f]{6}$/.test(c) ? c : '';
  if (css) {
    if (which === 'fg') {
      el.style.color = css;
    } else {
      el.style.backgroundColor = css;
    }
  }
}

/** One styled run of text as a span (or a bare text node when unstyled). */
function styledNode(text: string, style: ITextStyle): Node {
  if (Object.keys(style).length === 0) {
    return document.createTextNode(text);
  }
  const span = document.createElement('span');
  span.textContent = text;
  let { fg, bg } = style;
  if (style.inverse) {
    [fg, bg] = [bg, fg];
    span.classList.add('nbs-inverse');
    if (fg === undefined) {
      span.classList.add('nbs-inverse-fg');
    }
    if (bg === undefined) {
      span.classList.add('nbs-inverse-bg');
    }
  }
  applyColour(span, 'fg', fg);
  applyColour(span, 'bg', bg);
  if (style.bold) {
    span.classList.add('nbs-bold');
  }
  if (style.dim) {
    span.classList.add('nbs-dim');
  }
  if (style.italic) {
    span.classList.add('nbs-italic');
  }
  if (style.underline || style.strike) {
    span.style.textDecorationLine = [
      style.underline ? 'underline' : '',
      style.strike ? 'line-through' : ''
    ]
      .join(' ')
      .trim();
  }
  return span;
}

export function lineNode(line: ILine, prefix?: HTMLElement): HTMLElement {
  const div = h('div', { class: 'nbs-Line' });
  if (line.stream === 'stderr') {
    div.classList.add('nbs-stderr');
  }
  if (prefix) {
    div.appendChild(prefix);
  }
  const body = h('span', { class: 'nbs-Line-text' });
  for (const seg of line.segments) {
    body.appendChild(styledNode(seg.text, seg.style));
  }
  div.appendChild(body);
  return div;
}

export function rankPrefix(rank: number): HTMLElement {
  const el = h('span', { class: 'nbs-Prefix' }, `[rank${rank}]`);
  el.style.setProperty('--nbs-rank-hue', String(rankHue(rank)));
  return el;
}

export function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/** Lines of a rank, cached: the merged view and the rank pane share them. */
const linesCache = new WeakMap<IRankInfo, ILine[]>();
function rankLines(rank: IRankInfo): ILine[] {
  let lines = linesCache.get(rank);
  if (!lines) {
    lines = new TerminalText().writeAll(rank.output).lines;
    linesCache.set(rank, lines);
  }
  return lines;
}

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

/** A log file as a compact button: its name; the full path in the tooltip, copied on click. */
function fileButton(path: string | null): HTMLElement | null {
  if (!path) {
    return null;
  }
  const name = path.split('/').pop() || path;
  const btn = h(
    'button',
    { class: 'nbs-File', type: 'button', title: `${path}\n(click to copy the path)` },
    h('span', { class: 'nbs-File-icon', 'aria-hidden': 'true' }),
    h('span', { class: 'nbs-File-name' }, name)
  );
  const label = btn.querySelector('.nbs-File-name')!;
  btn.addEventListener('click', () => {
    void navigator.clipboard?.writeText(path).then(
      () => {
        label.textContent = 'path copied';
        window.setTimeout(() => (label.textContent = name), 1200);
      },
      () => undefined
    );
  });
  return btn;
}

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

/** The header: status badge, rank count and per-status counts, then start method, backend, time, run id, logs. */
export function buildHeader(run: IRunBundle, extras: IHeaderExtras = {}): HTMLElement {
  const counts = new Map<string, number>();
  for (const r of run.ranks) {
    counts.set(r.status, (counts.get(r.status) ?? 0) + 1);
  }
  const countText = ['failed', 'stopped', 'running', 'done']
    .filter(s => counts.get(s))
    .map(s => `${counts.get(s)} ${s}`)
    .join(' · ');
  const meta = h('div', { class: 'nbs-Header-meta' });
  const addMeta = (label: string, value: string, cls = '') => {
    if (value) {
      meta.appendChild(metaEntry(label, value, cls));
    }
  };
  addMeta('start', run.start_method);
  addMeta('backend', run.backend);
  for (const node of extras.meta ?? []) {
    meta.appendChild(node);
  }
  addMeta('took', formatDuration(run.duration));
  addMeta('run', run.run_id, 'nbs-mod-mono');
  const logs = pathLine('logs', run.log_dir);
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
      h(
        'span',
        { class: 'nbs-Badge', 'data-status': run.status },
        RUN_STATUS_LABEL[run.status] ?? run.status
      ),
      h('span', { class: 'nbs-Header-title' }, plural(run.nprocs, 'rank')),
      countText ? h('span', { class: 'nbs-Header-counts' }, countText) : null,
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

/** A run-level error: a banner naming the root-cause rank, or (timeout, interrupt, stop) the details. */
export function buildBanner(run: IRunBundle): HTMLElement[] {
  const err = run.error;
  if (!err || !(err.summary || err.traceback)) {
    return [];
  }
  const errRankKnown = err.rank !== null && run.ranks.some(r => r.rank === err.rank);
  const nodes = [
    h(
      'div',
      { class: 'nbs-Banner', role: 'alert' },
      h('span', { class: 'nbs-Banner-icon', 'aria-hidden': 'true' }, '!'),
      h(
        'span',
        { class: 'nbs-Banner-text' },
        errRankKnown ? h('strong', {}, `rank ${err.rank}: `) : null,
        err.summary || RUN_STATUS_LABEL[run.status] || run.status
      )
    )
  ];
  if (!errRankKnown && err.traceback) {
    nodes.push(
      h(
        'details',
        { class: 'nbs-RunTraceback', open: '' },
        h('summary', {}, 'details'),
        h('pre', { class: 'nbs-Traceback-text' }, err.traceback)
      )
    );
  }
  return nodes;
}

/** The "merged" tab (every rank, prefixed lines). */
export function buildMergedTab(): HTMLElement {
  return h(
    'button',
    {
      class: 'nbs-Tab nbs-Tab-merged',
      type: 'button',
      role: 'tab',
      'data-tab': 'merged',
      title: 'Every rank, lines prefixed with [rank{r}]'
    },
    h('span', { class: 'nbs-Tab-icon', 'aria-hidden': 'true' }, '\u2261'),
    'merged'
  );
}

/** A rank's tab: its status chip (spinner, ✓ with duration, ✕ with the exception, ■ with the signal). */
export function buildChip(r: IRankInfo, run: IRunBundle): HTMLElement {
  const detail =
    r.status === 'failed'
      ? r.summary ?? (r.exit_code !== null ? `exit ${r.exit_code}` : 'failed')
      : r.status === 'stopped'
        ? r.signal ?? 'stopped'
        : r.status === 'done'
          ? formatDuration(r.duration)
          : 'running';
  const title = [
    `rank ${r.rank}: ${r.status}`,
    r.summary,
    r.duration !== null ? formatDuration(r.duration) : null,
    r.exit_code !== null ? `exit code ${r.exit_code}` : null
  ]
    .filter(Boolean)
    .join(' — ');
  const chip = h(
    'button',
    {
      class: 'nbs-Tab nbs-Chip',
      type: 'button',
      role: 'tab',
      'data-rank': String(r.rank),
      'data-status': r.status,
      title
    },
    h('span', { class: 'nbs-Chip-icon', 'aria-hidden': 'true' }, RANK_ICON[r.status] ?? ''),
    h('span', { class: 'nbs-Chip-rank' }, String(r.rank)),
    detail ? h('span', { class: 'nbs-Chip-detail' }, detail) : null
  );
  if (run.error && run.error.rank === r.rank) {
    chip.classList.add('nbs-mod-rootcause');
  }
  chip.style.setProperty('--nbs-rank-hue', String(rankHue(r.rank)));
  return chip;
}

/** Which tab a tab element stands for. */
export function tabKey(el: Element): number | 'merged' {
  const rank = el.getAttribute('data-rank');
  return rank === null ? 'merged' : Number(rank);
}

/** Arrow keys, Home and End move between the tabs of `tabs`. */
export function attachTabKeys(tabs: HTMLElement, pick: (sel: number | 'merged') => void): void {
  tabs.addEventListener('keydown', ev => {
    const els = [...tabs.querySelectorAll<HTMLElement>('.nbs-Tab')];
    const cur = els.findIndex(el => el.getAttribute('aria-selected') === 'true');
    let next = -1;
    if (ev.key === 'ArrowRight' || ev.key === 'ArrowDown') {
      next = (cur + 1) % els.length;
    } else if (ev.key === 'ArrowLeft' || ev.key === 'ArrowUp') {
      next = (cur - 1 + els.length) % els.length;
    } else if (ev.key === 'Home') {
      next = 0;
    } else if (ev.key === 'End') {
      next = els.length - 1;
    }
    if (next >= 0 && els.length) {
      ev.preventDefault();
      pick(tabKey(els[next]));
      // the tab may have been re-created by the pick
      tabs.querySelectorAll<HTMLElement>('.nbs-Tab')[next]?.focus();
    }
  });
}

/** Mark one tab selected (and focusable), the others not. */
export function markSelected(tabs: HTMLElement, sel: number | 'merged'): void {
  for (const el of tabs.querySelectorAll<HTMLElement>('.nbs-Tab')) {
    const on = tabKey(el) === sel;
    el.setAttribute('aria-selected', on ? 'true' : 'false');
    el.tabIndex = on ? 0 : -1;
    el.classList.toggle('nbs-mod-selected', on);
  }
}

/**
 * Build the whole view for a bundle into `host` (replacing its content).
 * Returns a function selecting a tab: a rank number or `'merged'`.
 */
export function renderRun(
  host: HTMLElement,
  run: IRunBundle,
  options: {
    /** Tab to show instead of the default (kept across re-renders of one output). */
    selected?: number | 'merged' | null;
    /** Called when the user picks a tab. */
    onSelect?: (sel: number | 'merged') => void;
  } = {}
): (sel: number | 'merged') => void {
  host.textContent = '';
  const root = h('div', { class: 'nbs-Run', 'data-status': run.status });
  host.appendChild(root);
  root.appendChild(buildHeader(run));
  for (const node of buildBanner(run)) {
    root.appendChild(node);
  }

  // ---- tabs --------------------------------------------------------------------------------
  const tabs = h('div', {
    class: 'nbs-Tabs',
    role: 'tablist',
    'aria-label': 'Ranks'
  });
  if (run.ranks.length > 16) {
    tabs.classList.add('nbs-mod-compact');
  }
  const pane = h('div', { class: 'nbs-Pane-host', role: 'tabpanel' });
  root.appendChild(tabs);
  root.appendChild(pane);

  const keys = new Set<number | 'merged'>();
  const select = (sel: number | 'merged') => {
    if (!keys.has(sel)) {
      return;
    }
    markSelected(tabs, sel);
    pane.textContent = '';
    pane.setAttribute('data-selected', String(sel));
    if (sel === 'merged') {
      pane.appendChild(mergedView(run));
    } else {
      const rank = run.ranks.find(r => r.rank === sel)!;
      pane.appendChild(rankPane(rank, run));
    }
    // show the newest output, as a terminal would; the traceback stays above the fold
    const out = pane.querySelector('.nbs-Output');
    if (out) {
      requestAnimationFrame(() => (out.scrollTop = out.scrollHeight));
    }
  };

  const pick = (sel: number | 'merged') => {
    select(sel);
    options.onSelect?.(sel);
  };

  if (run.ranks.length > 1) {
    const merged = buildMergedTab();
    merged.addEventListener('click', () => pick('merged'));
    tabs.appendChild(merged);
    keys.add('merged');
  }
  for (const r of run.ranks) {
    const chip = buildChip(r, run);
    chip.addEventListener('click', () => pick(r.rank));
    tabs.appendChild(chip);
    keys.add(r.rank);
  }
  attachTabKeys(tabs, pick);

  if (run.ranks.length === 0) {
    pane.appendChild(h('div', { class: 'nbs-Empty' }, 'no rank has started'));
  } else {
    const keep = options.selected;
    select(keep !== undefined && keep !== null && keys.has(keep) ? keep : defaultSelection(run));
  }
  return select;
}

/** `N lines elided — full log at PATH`, before a rank's output. */
export function elidedNode(
  rank: number,
  count: number,
  path: string | null,
  prefix = false
): HTMLElement {
  const where = path ?? 'the log directory';
  return h(
    'div',
    { class: 'nbs-Elided', 'data-rank': String(rank) },
    prefix ? rankPrefix(rank) : null,
    `${count} ${count === 1 ? 'line' : 'lines'} elided — full log at ${where}`
  );
}

function elidedMarker(rank: IRankInfo, prefix = false): HTMLElement | null {
  return rank.elided_lines > 0
    ? elidedNode(rank.rank, rank.elided_lines, rank.stdout_path, prefix)
    : null;
}

/** A rank pane's first row: title, facts (pid, status, exit code, signal, time), log files. */
export function paneHead(rank: IRankInfo): HTMLElement {
  const facts = [
    rank.pid !== null ? `pid ${rank.pid}` : null,
    rank.status,
    rank.exit_code !== null && rank.exit_code !== 0 ? `exit code ${rank.exit_code}` : null,
    rank.signal,
    rank.duration !== null ? formatDuration(rank.duration) : null
  ].filter(Boolean) as string[];
  return h(
    'div',
    { class: 'nbs-Pane-head' },
    h('span', { class: 'nbs-Pane-title' }, `rank ${rank.rank}`),
    h('span', { class: 'nbs-Pane-facts' }, facts.join(' · ')),
    h(
      'span',
      { class: 'nbs-Pane-files' },
      fileButton(rank.stdout_path),
      fileButton(rank.stderr_path)
    )
  );
}

/** A failed (or stopped) rank's traceback or stack, first thing in its pane; null if it has none. */
export function tracebackBox(rank: IRankInfo, run: IRunBundle): HTMLElement | null {
  const tb = rank.traceback ?? (run.error && run.error.rank === rank.rank ? run.error.traceback : null);
  if (!(tb || (rank.status === 'failed' && rank.summary))) {
    return null;
  }
  return h(
    'div',
    { class: 'nbs-Traceback' },
    h('div', { class: 'nbs-Traceback-summary' }, rank.summary ?? run.error?.summary ?? 'failed'),
    tb ? h('pre', { class: 'nbs-Traceback-text' }, tb) : null
  );
}

/** The placeholder of an output area with nothing in it. */
export function emptyOutput(): HTMLElement {
  return h('div', { class: 'nbs-Empty' }, 'no output');
}

function rankPane(rank: IRankInfo, run: IRunBundle): HTMLElement {
  const paneEl = h(
    'div',
    { class: 'nbs-Pane', 'data-rank': String(rank.rank), 'data-status': rank.status },
    paneHead(rank),
    tracebackBox(rank, run)
  );
  const lines = rankLines(rank);
  const out = h('pre', { class: 'nbs-Output', tabindex: '0' });
  const marker = elidedMarker(rank);
  if (marker) {
    out.appendChild(marker);
  }
  for (const line of visible(lines)) {
    out.appendChild(lineNode(line));
  }
  if (!lines.length && !marker) {
    out.classList.add('nbs-mod-empty');
    out.appendChild(emptyOutput());
  }
  paneEl.appendChild(h('div', { class: 'nbs-Section-label' }, 'output'));
  paneEl.appendChild(out);
  return paneEl;
}

/** Whether a line is worth a row: not an empty, still-open line (the text after a final "\n"). */
export function isVisible(line: ILine): boolean {
  return line.complete || line.segments.length > 0;
}

function visible(lines: ILine[]): ILine[] {
  return lines.filter(isVisible);
}

/** The merged pane's first row. */
export function mergedHead(facts: string): HTMLElement {
  return h(
    'div',
    { class: 'nbs-Pane-head' },
    h('span', { class: 'nbs-Pane-title' }, 'all ranks'),
    h('span', { class: 'nbs-Pane-facts' }, facts)
  );
}

/**
 * All ranks in one view.  The bundle has no cross-rank timing, so lines are interleaved by
 * position (each rank's n-th line together), which keeps lock-step logs (epochs) aligned;
 * each rank's own order is exact.
 */
function mergedView(run: IRunBundle): HTMLElement {
  const out = h('pre', { class: 'nbs-Output nbs-mod-merged', tabindex: '0' });
  for (const r of run.ranks) {
    const m = elidedMarker(r, true);
    if (m) {
      out.appendChild(m);
    }
  }
  const per = run.ranks.map(r => ({ rank: r.rank, lines: visible(rankLines(r)) }));
  const longest = Math.max(0, ...per.map(p => p.lines.length));
  for (let i = 0; i < longest; i++) {
    for (const p of per) {
      const line = p.lines[i];
      if (line) {
        out.appendChild(lineNode(line, rankPrefix(p.rank)));
      }
    }
  }
  if (!out.childNodes.length) {
    out.classList.add('nbs-mod-empty');
    out.appendChild(emptyOutput());
  }
  return h(
    'div',
    { class: 'nbs-Pane', 'data-rank': 'merged' },
    mergedHead('interleaved by line; each rank in its own order'),
    out
  );
}
