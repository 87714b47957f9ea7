/**
 * The pieces of the run view as DOM: header, banner, one status chip per rank (tabs), pane heads,
 * output lines and display items.  Stateless builders; `view.ts` and `pane.ts` put them together.
 * Every piece of worker text reaches the DOM through `textContent`/text nodes only.
 */

import type { Entry } from './entry';
import { formatDuration } from './format';
import { IRankInfo, IRunBundle } from './messages';
import { richNode } from './rich';
import { ILine, ITextStyle } from './text';

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

/** What the banner says of a run the user stopped with its Stop button. */
export const STOPPED_BY_USER = 'stopped by you (Stop)';

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

/** One entry of a rank's flow: a line, or a display item drawn by `rich.ts`. */
export function entryNode(e: Entry, prefixed: boolean): HTMLElement {
  const prefix = prefixed ? rankPrefix(e.rank) : undefined;
  if (e.kind === 'line') {
    const node = lineNode(e.line, prefix);
    node.hidden = !isVisible(e.line);
    return node;
  }
  const div = h('div', { class: 'nbs-Display' });
  if (prefix) {
    div.appendChild(prefix);
  }
  div.appendChild(richNode(e.item));
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
  if (run.world) {
    addMeta('world', run.world_cell ? `${run.world} · cell ${run.world_cell}` : run.world, 'nbs-mod-mono');
  }
  if (run.program) {
    addMeta('program', run.program, 'nbs-mod-mono');
  } else {
    addMeta('start', run.start_method);
    addMeta('backend', run.backend);
  }
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
  const err = run.status === 'stopped' && !run.error ? { rank: null, summary: '', traceback: '' } : run.error;
  if (!err || !(err.summary || err.traceback || run.status === 'stopped')) {
    return [];
  }
  const errRank = err.rank;
  const errRankKnown = errRank !== null && run.status !== 'stopped' && run.ranks.some(r => r.rank === errRank);
  const text =
    run.status === 'stopped' ? STOPPED_BY_USER : oneLine(err.summary) || RUN_STATUS_LABEL[run.status] || run.status;
  const banner = h(
    'div',
    { class: 'nbs-Banner', role: 'alert' },
    h('span', { class: 'nbs-Banner-icon', 'aria-hidden': 'true' }, '!'),
    h('span', { class: 'nbs-Banner-text' }, errRankKnown ? h('strong', {}, `rank ${errRank}: `) : null, text)
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
  const note = r.status === 'running' && r.note ? r.note : null;
  const detail =
    r.status === 'failed'
      ? r.summary ?? (r.exit_code !== null ? `exit ${r.exit_code}` : 'failed')
      : r.status === 'stopped'
        ? r.signal ?? 'stopped'
        : r.status === 'done'
          ? formatDuration(r.duration)
          : note
            ? note.split(/; | \(/)[0] // "waiting in barrier #3 for 25 s", "has not entered barrier #3"
            : 'running';
  const title = [
    `rank ${r.rank}: ${r.status}`,
    note,
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
  if (note && r.prompt) {
    chip.classList.add('nbs-mod-prompt'); // at a breakpoint or input(): the kernel's stdin (or %spawn debug) answers
    chip.setAttribute('data-prompt', r.prompt);
  } else if (note) {
    chip.classList.add('nbs-mod-waiting'); // the run looks hung: this rank waits, or others wait for it
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
    h('span', { class: 'nbs-Pane-title' }, rank.node ? `rank ${rank.rank} · ${rank.node}` : `rank ${rank.rank}`),
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

/** Whether a line is worth a row: not an empty, still-open line (the text after a final "\n"). */
export function isVisible(line: ILine): boolean {
  return line.complete || line.segments.length > 0;
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

