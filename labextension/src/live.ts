/**
 * The live run view: the same DOM as the frozen view (`render.ts`), updated in place as output and
 * rank statuses arrive, with an elapsed-time counter and a Stop button in the header.
 *
 * `LiveOutput` holds what the browser keeps of each rank (at most `TAIL_LINES` lines, the kernel's
 * own bound; older lines are counted as elided) and tells its views what changed; `LiveView` draws
 * one view of it.  Only the selected pane is in the DOM, and only changed lines are redrawn.
 */

import { IRankInfo, IRunBundle, defaultSelection } from './bundle';
import {
  attachTabKeys,
  buildBanner,
  buildChip,
  buildHeader,
  buildMergedTab,
  elidedNode,
  emptyOutput,
  h,
  isVisible,
  lineNode,
  markSelected,
  mergedHead,
  metaEntry,
  paneHead,
  rankPrefix,
  tracebackBox
} from './render';
import { ILine, TerminalText } from './text';

/** Lines kept per rank, as in the kernel (`nbspawn._bundle.TAIL_LINES`). */
export const TAIL_LINES = 2000;

/** What one batch of output changed. */
export interface ILiveUpdate {
  /** Everything was replaced (a replay): redraw from scratch. */
  reset: boolean;
  /** New lines, in arrival order. */
  added: Array<[number, ILine]>;
  /** Lines that were still open and may have changed (a progress bar redrawn with `\r`). */
  changed: Array<[number, ILine]>;
  /** Lines that fell out of the kept tail. */
  dropped: Set<ILine>;
  /** Ranks whose elided-line count changed. */
  elided: Set<number>;
}

interface IRankOutput {
  text: TerminalText;
  /** Lines a later chunk may still change: each stream's current line. */
  open: Set<ILine>;
  elided: number;
}

function emptyUpdate(reset = false): ILiveUpdate {
  return { reset, added: [], changed: [], dropped: new Set(), elided: new Set() };
}

/** Every rank's output as the browser keeps it, bounded. */
export class LiveOutput {
  constructor(readonly limit = TAIL_LINES) {}

  /** Lines of one rank, oldest first. */
  lines(rank: number): readonly ILine[] {
    return this._ranks.get(rank)?.text.lines ?? [];
  }

  /** Lines of every rank in arrival order. */
  merged(): Array<[number, ILine]> {
    return this._order.filter(([, l]) => !this._dropped.has(l));
  }

  /** Lines of this rank not kept (by the kernel's bound, its message cap, or this one). */
  elided(rank: number): number {
    return this._ranks.get(rank)?.elided ?? 0;
  }

  ranks(): number[] {
    return [...this._ranks.keys()].sort((a, b) => a - b);
  }

  isDropped(line: ILine): boolean {
    return this._dropped.has(line);
  }

  /** Listen to changes; returns the unsubscribe function. */
  subscribe(fn: (u: ILiveUpdate) => void): () => void {
    this._listeners.add(fn);
    return () => this._listeners.delete(fn);
  }

  /** New output: `[rank, stream, text]` chunks in arrival order, and lines the kernel left out. */
  append(chunks: ReadonlyArray<readonly [number, string, string]>, elided: Record<string, number> = {}): void {
    const u = emptyUpdate();
    const changed = new Map<ILine, number>();
    this._addElided(elided, u);
    for (const [rank, stream, text] of chunks) {
      this._write(rank, stream, text, u, changed);
    }
    this._trim(u);
    for (const [line, rank] of changed) {
      if (!this._dropped.has(line)) {
        u.changed.push([rank, line]);
      }
    }
    this._emit(u);
  }

  /** Replace everything with the kernel's tails (its answer to a replay request). */
  reset(
    tails: Record<string, ReadonlyArray<readonly [string, string]>>,
    elided: Record<string, number> = {}
  ): void {
    this._ranks.clear();
    this._order = [];
    this._dropped = new WeakSet();
    const u = emptyUpdate(true);
    const changed = new Map<ILine, number>();
    this._addElided(elided, u);
    for (const [key, chunks] of Object.entries(tails ?? {})) {
      const rank = Number(key);
      if (!Number.isInteger(rank) || !Array.isArray(chunks)) {
        continue;
      }
      this._rank(rank);
      for (const c of chunks) {
        if (Array.isArray(c) && typeof c[1] === 'string') {
          this._write(rank, typeof c[0] === 'string' ? c[0] : 'stdout', c[1], u, changed);
        }
      }
    }
    this._trim(u);
    this._emit(emptyUpdate(true));
  }

  private _rank(rank: number): IRankOutput {
    let r = this._ranks.get(rank);
    if (!r) {
      r = { text: new TerminalText(), open: new Set(), elided: 0 };
      this._ranks.set(rank, r);
    }
    return r;
  }

  private _addElided(elided: Record<string, number>, u: ILiveUpdate): void {
    for (const [key, n] of Object.entries(elided ?? {})) {
      const rank = Number(key);
      if (Number.isInteger(rank) && typeof n === 'number' && n > 0) {
        this._rank(rank).elided += n;
        u.elided.add(rank);
      }
    }
  }

  private _write(rank: number, stream: string, text: string, u: ILiveUpdate, changed: Map<ILine, number>): void {
    if (!Number.isInteger(rank) || typeof text !== 'string' || !text) {
      return;
    }
    const r = this._rank(rank);
    const lines = r.text.lines;
    const before = lines.length;
    for (const line of r.open) {
      changed.set(line, rank);
    }
    r.text.write(stream === 'stderr' ? 'stderr' : 'stdout', text);
    for (let i = before; i < lines.length; i++) {
      u.added.push([rank, lines[i]]);
      this._order.push([rank, lines[i]]);
      r.open.add(lines[i]);
      changed.delete(lines[i]);
    }
    for (const line of r.open) {
      if (line.complete) {
        r.open.delete(line);
      }
    }
    this._touched.add(rank);
  }

  private _trim(u: ILiveUpdate): void {
    for (const rank of this._touched) {
      const r = this._ranks.get(rank)!;
      const excess = r.text.lines.length - this.limit;
      if (excess > 0) {
        for (const line of r.text.lines.splice(0, excess)) {
          this._dropped.add(line);
          u.dropped.add(line);
          r.open.delete(line);
        }
        r.elided += excess;
        u.elided.add(rank);
      }
    }
    this._touched.clear();
    if (this._order.length > 2 * Math.max(1, this._ranks.size) * this.limit + 1000) {
      this._order = this._order.filter(([, l]) => !this._dropped.has(l));
    }
  }

  private _emit(u: ILiveUpdate): void {
    for (const fn of this._listeners) {
      fn(u);
    }
  }

  private _ranks = new Map<number, IRankOutput>();
  private _order: Array<[number, ILine]> = [];
  private _dropped = new WeakSet<ILine>();
  private _touched = new Set<number>();
  private _listeners = new Set<(u: ILiveUpdate) => void>();
}

/** What a live view needs from its model. */
export interface ILiveSource {
  /** The run without output: header, rank records, error. */
  run(): IRunBundle;
  readonly output: LiveOutput;
  /** `performance.now()` at which the run started, by the kernel's last word on elapsed time. */
  startedAt(): number | null;
  /** Stop was clicked (in any view of this run). */
  readonly stopRequested: boolean;
  /** The kernel said it is stopping the run. */
  readonly stopAcknowledged: boolean;
  stop(): void;
}

const ACTIVE = new Set(['starting', 'running']);
/** How long Stop may go unanswered before the view says the frontend may be holding it back. */
const STOP_UNANSWERED_MS = 4000;

/** `7 s`, `1 min 05 s`, `1 h 02 min`: a clock that ticks once a second. */
export function formatElapsed(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  }
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
}

/** One view of a live run, drawn into `host`. */
export class LiveView {
  constructor(host: HTMLElement, src: ILiveSource) {
    this._src = src;
    this._root = h('div', { class: 'nbs-Run nbs-mod-live' });
    this._tabs = h('div', { class: 'nbs-Tabs', role: 'tablist', 'aria-label': 'Ranks' });
    this._host = h('div', { class: 'nbs-Pane-host', role: 'tabpanel' });
    this._clock = h('span', { class: 'nbs-Meta-value nbs-Clock' });
    this._stopBtn = h(
      'button',
      { class: 'nbs-Stop', type: 'button', title: 'Stop every rank (as an interrupt would)' },
      h('span', { class: 'nbs-Stop-icon', 'aria-hidden': 'true' }),
      h('span', { class: 'nbs-Stop-label' }, 'Stop')
    ) as HTMLButtonElement;
    this._stopBtn.addEventListener('click', () => {
      // again if the kernel has not answered (a frontend may have held the first one back)
      if (!this._src.stopAcknowledged) {
        this._src.stop();
        this._stopClickedAt = Date.now();
        this._stopHintShown = false;
        this.refresh();
      }
    });
    this._root.append(this._tabs, this._host);
    host.textContent = '';
    host.appendChild(this._root);
    attachTabKeys(this._tabs, sel => this._pick(sel));
    this._unsubscribe = src.output.subscribe(u => this._onOutput(u));
    this._timer = window.setInterval(() => this._tick(), 1000);
    this.refresh();
  }

  /** Redraw everything but the output lines: header, banner, chips, the pane's head. */
  refresh(): void {
    if (this._disposed) {
      return;
    }
    const run = this._src.run();
    this._run = run;
    this._root.setAttribute('data-status', run.status);
    const active = ACTIVE.has(run.status);
    this._updateClock();
    const header = buildHeader(run, {
      meta: active ? [metaEntry('elapsed', this._clock)] : [],
      actions: active ? [this._stopButton()] : []
    });
    if (this._header) {
      this._header.replaceWith(header);
    } else {
      this._root.prepend(header);
    }
    this._header = header;
    for (const node of this._banner) {
      node.remove();
    }
    this._banner = buildBanner(run);
    header.after(...this._banner);

    // tabs
    this._tabs.textContent = '';
    this._tabs.classList.toggle('nbs-mod-compact', run.ranks.length > 16);
    if (run.ranks.length > 1) {
      const merged = buildMergedTab();
      merged.addEventListener('click', () => this._pick('merged'));
      this._tabs.appendChild(merged);
    }
    for (const r of run.ranks) {
      const chip = buildChip(r, run);
      chip.addEventListener('click', () => this._pick(r.rank));
      this._tabs.appendChild(chip);
    }

    // the selection: the default first, the failed rank's pane as soon as one fails
    const failed = run.ranks.some(r => r.status === 'failed');
    let sel = this._selected;
    if (sel === null || !this._valid(sel)) {
      sel = defaultSelection(run);
    }
    if (failed && !this._failureShown) {
      this._failureShown = true;
      sel = defaultSelection(run);
    }
    if (sel !== this._selected) {
      this._select(sel);
    } else {
      markSelected(this._tabs, sel);
      this._refreshPaneHead();
    }
  }

  dispose(): void {
    this._disposed = true;
    this._unsubscribe();
    window.clearInterval(this._timer);
  }

  // -- selection -------------------------------------------------------------------------------

  private _valid(sel: number | 'merged'): boolean {
    const ranks = this._run?.ranks ?? [];
    return sel === 'merged' ? ranks.length > 1 : ranks.some(r => r.rank === sel);
  }

  private _pick(sel: number | 'merged'): void {
    if (this._valid(sel)) {
      this._select(sel);
    }
  }

  private _rankInfo(rank: number): IRankInfo | undefined {
    return this._run?.ranks.find(r => r.rank === rank);
  }

  /** Build the selected pane from what is kept. */
  private _select(sel: number | 'merged'): void {
    this._selected = sel;
    markSelected(this._tabs, sel);
    this._nodes.clear();
    this._markers.clear();
    this._host.textContent = '';
    this._host.setAttribute('data-selected', String(sel));
    const merged = sel === 'merged';
    this._out = h('pre', { class: merged ? 'nbs-Output nbs-mod-merged' : 'nbs-Output', tabindex: '0' });
    this._pane = h('div', { class: 'nbs-Pane', 'data-rank': String(sel) });
    this._host.appendChild(this._pane);
    this._refreshPaneHead();
    const out = this._out;
    const output = this._src.output;
    if (merged) {
      for (const [rank, line] of output.merged()) {
        out.appendChild(this._lineNode(rank, line));
      }
    } else {
      for (const line of output.lines(sel)) {
        out.appendChild(this._lineNode(sel, line));
      }
    }
    this._refreshMarkers();
    requestAnimationFrame(() => (out.scrollTop = out.scrollHeight));
  }

  /** The pane's head (and a failed rank's traceback) from the latest rank records. */
  private _refreshPaneHead(): void {
    const pane = this._pane;
    const out = this._out;
    if (!pane || !out || this._run === null) {
      return;
    }
    const sel = this._selected;
    const parts: Array<HTMLElement | null> = [];
    if (sel === 'merged') {
      pane.removeAttribute('data-status');
      parts.push(mergedHead('in arrival order; each rank in its own order'));
    } else if (sel !== null) {
      const info = this._rankInfo(sel);
      if (!info) {
        return;
      }
      pane.setAttribute('data-status', info.status);
      parts.push(paneHead(info), tracebackBox(info, this._run));
      parts.push(h('div', { class: 'nbs-Section-label' }, 'output'));
    }
    pane.textContent = '';
    for (const p of parts) {
      if (p) {
        pane.appendChild(p);
      }
    }
    pane.appendChild(out);
    // the elision markers name the log file, known from the rank records
    this._refreshMarkers();
  }

  // -- output ----------------------------------------------------------------------------------

  private _lineNode(rank: number, line: ILine): HTMLElement {
    const node = lineNode(line, this._selected === 'merged' ? rankPrefix(rank) : undefined);
    node.hidden = !isVisible(line);
    this._nodes.set(line, node);
    return node;
  }

  private _onOutput(u: ILiveUpdate): void {
    if (this._disposed || this._selected === null || !this._out) {
      return;
    }
    if (u.reset) {
      this._select(this._selected);
      return;
    }
    const out = this._out;
    const stick = out.scrollTop + out.clientHeight >= out.scrollHeight - 8;
    const sel = this._selected;
    const mine = (rank: number) => sel === 'merged' || sel === rank;
    for (const line of u.dropped) {
      this._nodes.get(line)?.remove();
      this._nodes.delete(line);
    }
    for (const [rank, line] of u.changed) {
      const old = this._nodes.get(line);
      if (old && mine(rank)) {
        old.replaceWith(this._lineNode(rank, line));
      }
    }
    const output = this._src.output;
    const fresh = document.createDocumentFragment();
    for (const [rank, line] of u.added) {
      if (mine(rank) && !output.isDropped(line)) {
        fresh.appendChild(this._lineNode(rank, line));
      }
    }
    out.appendChild(fresh);
    if ([...u.elided].some(mine) || out.classList.contains('nbs-mod-empty')) {
      this._refreshMarkers();
    }
    if (stick) {
      out.scrollTop = out.scrollHeight;
    }
  }

  /** `N lines elided` markers first in the output (one per rank in the merged view), or "no output". */
  private _refreshMarkers(): void {
    const out = this._out;
    const sel = this._selected;
    if (!out || sel === null) {
      return;
    }
    for (const m of this._markers.values()) {
      m.remove();
    }
    this._markers.clear();
    const output = this._src.output;
    const ranks = sel === 'merged' ? (this._run?.ranks.map(r => r.rank) ?? output.ranks()) : [sel];
    const markers: HTMLElement[] = [];
    for (const rank of ranks) {
      const n = output.elided(rank);
      if (n > 0) {
        const m = elidedNode(rank, n, this._rankInfo(rank)?.stdout_path ?? null, sel === 'merged');
        this._markers.set(rank, m);
        markers.push(m);
      }
    }
    out.querySelector(':scope > .nbs-Empty')?.remove();
    out.prepend(...markers);
    const empty = this._nodes.size === 0 && markers.length === 0;
    out.classList.toggle('nbs-mod-empty', empty);
    if (empty) {
      out.appendChild(emptyOutput());
    }
  }

  // -- header controls -------------------------------------------------------------------------

  private _stopButton(): HTMLElement {
    const btn = this._stopBtn;
    const requested = this._src.stopRequested;
    btn.disabled = requested;
    btn.classList.toggle('nbs-mod-stopping', requested);
    btn.querySelector('.nbs-Stop-label')!.textContent = requested ? 'Stopping\u2026' : 'Stop';
    const nodes = [btn];
    const unanswered =
      requested &&
      !this._src.stopAcknowledged &&
      this._stopClickedAt !== null &&
      Date.now() - this._stopClickedAt > STOP_UNANSWERED_MS;
    this._stopHintShown = unanswered;
    if (unanswered) {
      btn.disabled = false; // let it be tried again
      btn.querySelector('.nbs-Stop-label')!.textContent = 'Stop';
      return h(
        'span',
        { class: 'nbs-Stop-wrap' },
        h(
          'span',
          { class: 'nbs-Stop-hint', role: 'note' },
          'the kernel has not received Stop (this frontend may hold widget messages while a cell runs): use Interrupt'
        ),
        ...nodes
      );
    }
    return btn;
  }

  private _updateClock(): void {
    const start = this._src.startedAt();
    const run = this._run;
    if (start !== null && run && ACTIVE.has(run.status)) {
      this._clock.textContent = formatElapsed((performance.now() - start) / 1000);
    }
  }

  private _tick(): void {
    this._updateClock();
    const run = this._run;
    // Stop unanswered for a while: say so (once)
    if (
      run &&
      ACTIVE.has(run.status) &&
      this._src.stopRequested &&
      !this._src.stopAcknowledged &&
      !this._stopHintShown &&
      this._stopClickedAt !== null &&
      Date.now() - this._stopClickedAt > STOP_UNANSWERED_MS
    ) {
      this.refresh();
    }
  }

  private _src: ILiveSource;
  private _root: HTMLElement;
  private _header: HTMLElement | null = null;
  private _banner: HTMLElement[] = [];
  private _tabs: HTMLElement;
  private _host: HTMLElement;
  private _pane: HTMLElement | null = null;
  private _out: HTMLElement | null = null;
  private _clock: HTMLElement;
  private _stopBtn: HTMLButtonElement;
  private _stopClickedAt: number | null = null;
  private _stopHintShown = false;
  private _run: IRunBundle | null = null;
  private _selected: number | 'merged' | null = null;
  private _failureShown = false;
  private _nodes = new Map<ILine, HTMLElement>();
  private _markers = new Map<number, HTMLElement>();
  private _unsubscribe: () => void;
  private _timer: number;
  private _disposed = false;
}
