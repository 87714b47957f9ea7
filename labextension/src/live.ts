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
  entryNode,
  h,
  markSelected,
  mergedHead,
  metaEntry,
  paneHead,
  tracebackBox
} from './render';
import { IDisplayItem, WIDGET_MIME, parseItem, widgetRunning } from './rich';
import { ILine, TerminalText, isBar } from './text';

export type { IDisplayItem } from './rich';

/** Lines (and display items) kept per rank, as in the kernel (`nbspawn.views._bundle.TAIL_LINES`). */
export const TAIL_LINES = 2000;

/** A line of a rank's output, in its flow or (a progress bar being redrawn) at the bottom. */
export interface ILineEntry {
  readonly kind: 'line';
  readonly rank: number;
  readonly line: ILine;
  /** Position in the run's arrival order; a bar that lands gets a new one. */
  seq: number;
  /** Bumped whenever what it shows may have changed. */
  version: number;
  /** In the flow (not dropped, cleared or floating at the bottom as a bar). */
  inFlow: boolean;
}

/** Something a rank displayed (an image, HTML, a widget), in its flow. */
export interface IDisplayEntry {
  readonly kind: 'display';
  readonly rank: number;
  item: IDisplayItem;
  seq: number;
  version: number;
  inFlow: boolean;
  /** An `update` reached it (a widget bar being driven). */
  updated: boolean;
}

export type Entry = ILineEntry | IDisplayEntry;

/** What one batch of output changed. */
export interface ILiveUpdate {
  /** Everything was replaced (a replay): redraw from scratch. */
  reset: boolean;
  /** Entries placed at the end of the flow, in order (new ones, and bars that landed). */
  added: Entry[];
  /** Entries whose content may have changed (in the flow or at the bottom). */
  changed: Set<Entry>;
  /** Entries that left the flow (dropped, cleared, or floated to the bottom as a bar). */
  removed: Set<Entry>;
  /** Ranks whose bottom bars changed (a bar appeared, was redrawn, or landed). */
  bars: Set<number>;
  /** Ranks whose elided count changed. */
  elided: Set<number>;
  /** Ranks whose output was cleared (`clear_output`). */
  cleared: Set<number>;
}

interface IRankOutput {
  text: TerminalText;
  /** The flow, oldest first. */
  flow: Entry[];
  /** Bars being redrawn, in the order they became bars. */
  bars: Entry[];
  /** Lines a later chunk may still change: each stream's current line. */
  open: Map<ILine, ILineEntry>;
  /** Display entries by display id, for `update`. */
  ids: Map<string, IDisplayEntry[]>;
  elided: number;
  /** `clear_output(wait=True)` seen: clear when the next output arrives. */
  clearPending: boolean;
}

/** Parsing time per animation frame for queued output; the rest waits for the next frame. */
export const FRAME_BUDGET_MS = 8;
/** Queued lines (of every rank), in flow limits, past which old queued text is dropped (`enqueue`). */
const QUEUE_BOUND_LIMITS = 4;

function newlines(text: string): number {
  let n = 0;
  for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1)) {
    n++;
  }
  return n;
}

function emptyUpdate(reset = false): ILiveUpdate {
  return {
    reset,
    added: [],
    changed: new Set(),
    removed: new Set(),
    bars: new Set(),
    elided: new Set(),
    cleared: new Set()
  };
}

/** Whether an entry is floating at the bottom now (a bar being redrawn). */
export function entryIsBar(e: Entry): boolean {
  if (e.kind === 'line') {
    return isBar(e.line) && e.line.segments.some(s => s.text.trim() !== '');
  }
  return e.updated && e.item.mime === WIDGET_MIME && widgetRunning(e.item.value);
}

/** The text of a line entry (tests, plain views). */
export function entryText(e: Entry): string {
  return e.kind === 'line' ? e.line.segments.map(s => s.text).join('') : `[${e.item.mime}]`;
}

/**
 * Every rank's output as the browser keeps it, bounded: per rank a flow of lines and display items
 * in the order the rank wrote them, and the progress bars being redrawn, which live at the bottom
 * (as a terminal shows a `tqdm` bar under the lines `tqdm.write` printed) until they complete and
 * land at the end of the flow.
 */
export class LiveOutput {
  constructor(readonly limit = TAIL_LINES) {}

  /** The flow of one rank, oldest first. */
  entries(rank: number): readonly Entry[] {
    return this._ranks.get(rank)?.flow ?? [];
  }

  /** The bars of one rank being redrawn (shown below its flow). */
  bars(rank: number): readonly Entry[] {
    return this._ranks.get(rank)?.bars ?? [];
  }

  /** What a rank's pane shows as text lines: the flow's lines, then the bars. */
  lines(rank: number): ILine[] {
    const r = this._ranks.get(rank);
    if (!r) {
      return [];
    }
    return [...r.flow, ...r.bars].filter((e): e is ILineEntry => e.kind === 'line').map(e => e.line);
  }

  /** Every rank's flow in arrival order. */
  merged(): Entry[] {
    this._compact();
    return this._order.slice();
  }

  /** Every rank's bars, by rank. */
  mergedBars(): Entry[] {
    return this.ranks().flatMap(r => this.bars(r));
  }

  /** How many entries the flow of `rank` (or of every rank) holds. */
  count(rank: number | 'merged'): number {
    if (rank === 'merged') {
      let n = 0;
      for (const r of this._ranks.values()) {
        n += r.flow.length;
      }
      return n;
    }
    return this._ranks.get(rank)?.flow.length ?? 0;
  }

  /** Lines of this rank not kept (by the kernel's bound, its message cap, or this one). */
  elided(rank: number): number {
    return this._ranks.get(rank)?.elided ?? 0;
  }

  ranks(): number[] {
    return [...this._ranks.keys()].sort((a, b) => a - b);
  }

  /** Listen to changes; returns the unsubscribe function. */
  subscribe(fn: (u: ILiveUpdate) => void): () => void {
    this._listeners.add(fn);
    return () => this._listeners.delete(fn);
  }

  /**
   * New output: `[rank, stream, text]` and `[rank, "display", item]` chunks in arrival order,
   * and lines the kernel left out.
   */
  append(chunks: ReadonlyArray<readonly [number, string, unknown]>, elided: Record<string, number> = {}): void {
    this.enqueue(chunks, elided);
    this.drain();
  }

  /**
   * New output, only queued (a message handler's whole work): `drain` parses it, a frame's budget
   * at a time (`feed` schedules that).  A rank's queued text beyond what its flow can keep (the
   * newest `limit` lines) is dropped unparsed and counted as elided.
   */
  enqueue(chunks: ReadonlyArray<readonly [number, string, unknown]>, elided: Record<string, number> = {}): void {
    for (const [key, n] of Object.entries(elided ?? {})) {
      if (typeof n === 'number' && n > 0) {
        this._qElided[key] = (this._qElided[key] ?? 0) + n;
      }
    }
    for (const c of Array.isArray(chunks) ? chunks : []) {
      if (Array.isArray(c) && c.length >= 3) {
        this._queue.push(c as unknown as readonly [number, string, unknown]);
        if (typeof c[2] === 'string') {
          this._qLines += newlines(c[2]);
        }
      }
    }
    if (this._qLines > Math.max(this._qBound, QUEUE_BOUND_LIMITS * this.limit)) {
      this._boundQueue();
    }
  }

  /** `enqueue`, then `drain` in animation frames (`FRAME_BUDGET_MS` each) until nothing is queued. */
  feed(chunks: ReadonlyArray<readonly [number, string, unknown]>, elided: Record<string, number> = {}): void {
    this.enqueue(chunks, elided);
    this._schedule();
  }

  /** Chunks queued and not yet parsed. */
  get queued(): number {
    return this._queue.length - this._qHead;
  }

  /**
   * Parse queued chunks for at most `budgetMs` (checked every few chunks), then tell the views
   * once.  Returns whether chunks are left.
   */
  drain(budgetMs = Number.POSITIVE_INFINITY): boolean {
    const u = emptyUpdate();
    this._addElided(this._qElided, u);
    this._qElided = {};
    const q = this._queue;
    const end = performance.now() + budgetMs;
    const start = this._qHead;
    let i = start;
    while (i < q.length) {
      const c = q[i++];
      if (typeof c[2] === 'string') {
        this._qLines -= newlines(c[2]);
      }
      this._chunk(c[0], c[1], c[2], u);
      if ((i & 7) === 0 && performance.now() > end) {
        break;
      }
    }
    if (i >= q.length) {
      this._queue = [];
      this._qHead = 0;
      this._qLines = 0;
    } else {
      this._qHead = i;
    }
    if (i > start || u.elided.size) {
      this._trim(u);
      this._emit(u);
    }
    return this.queued > 0;
  }

  private _schedule(): void {
    if (this._drainScheduled) {
      return;
    }
    this._drainScheduled = true;
    const run = () => {
      this._drainScheduled = false;
      if (this.drain(FRAME_BUDGET_MS)) {
        this._schedule();
      }
    };
    if (typeof requestAnimationFrame === 'function') {
      requestAnimationFrame(run);
    } else {
      setTimeout(run, 0);
    }
  }

  /** Drop each rank's queued text older than its newest `limit` queued lines; count it as elided. */
  private _boundQueue(): void {
    const q = this._queue;
    const seen = new Map<number, number>();
    const keep: Array<readonly [number, string, unknown]> = [];
    let lines = 0;
    for (let i = q.length - 1; i >= this._qHead; i--) {
      const c = q[i];
      const [rank, , data] = c;
      if (typeof data !== 'string') {
        keep.push(c); // display items stay (an update or a clear must not be lost)
        continue;
      }
      const n = newlines(data);
      const had = seen.get(rank) ?? 0;
      if (had >= this.limit && typeof rank === 'number') {
        this._qElided[String(rank)] = (this._qElided[String(rank)] ?? 0) + n;
        continue;
      }
      seen.set(rank, had + n);
      lines += n;
      keep.push(c);
    }
    this._queue = keep.reverse();
    this._qHead = 0;
    this._qLines = lines;
    this._qBound = 2 * lines;
  }

  /** Replace everything with the kernel's tails (its answer to a replay request). */
  reset(
    tails: Record<string, ReadonlyArray<readonly [string, unknown]>> | null | undefined,
    elided: Record<string, number> | null | undefined = {}
  ): void {
    this._ranks.clear();
    this._order = [];
    // what was queued is older than the tails
    this._queue = [];
    this._qHead = 0;
    this._qLines = 0;
    this._qElided = {};
    const u = emptyUpdate(true);
    this._addElided(elided ?? {}, u);
    for (const [key, chunks] of Object.entries(tails ?? {})) {
      const rank = Number(key);
      if (!Number.isInteger(rank) || !Array.isArray(chunks)) {
        continue;
      }
      this._rank(rank);
      for (const c of chunks) {
        if (Array.isArray(c) && c.length >= 2) {
          this._chunk(rank, c[0], c[1], u);
        }
      }
    }
    this._trim(u);
    this._emit(emptyUpdate(true));
  }

  /**
   * Order the merged flow by position instead of arrival: every rank's n-th entry together (a saved
   * run has no cross-rank timing; this keeps lock-step logs such as epochs aligned).
   */
  interleave(): void {
    const ranks = this.ranks().map(r => this._ranks.get(r)!);
    const longest = Math.max(0, ...ranks.map(r => r.flow.length));
    this._order = [];
    this._seq = 0;
    for (let i = 0; i < longest; i++) {
      for (const r of ranks) {
        const e = r.flow[i];
        if (e) {
          e.seq = this._seq++;
          this._order.push(e);
        }
      }
    }
    this._stale = 0;
  }

  private _rank(rank: number): IRankOutput {
    let r = this._ranks.get(rank);
    if (!r) {
      r = {
        text: new TerminalText(),
        flow: [],
        bars: [],
        open: new Map(),
        ids: new Map(),
        elided: 0,
        clearPending: false
      };
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

  private _chunk(rank: unknown, stream: unknown, data: unknown, u: ILiveUpdate): void {
    if (typeof rank !== 'number' || !Number.isInteger(rank)) {
      return;
    }
    if (stream === 'display') {
      const item = parseItem(data);
      if (item) {
        this._display(rank, item, u);
      }
    } else if (typeof data === 'string' && data) {
      this._write(rank, stream === 'stderr' ? 'stderr' : 'stdout', data, u);
    }
  }

  /** Put an entry at the end of the flow. */
  private _place(r: IRankOutput, e: Entry, u: ILiveUpdate): void {
    e.seq = this._seq++;
    e.inFlow = true;
    r.flow.push(e);
    this._order.push(e);
    u.added.push(e);
    this._touched.add(e.rank);
  }

  /** Take an entry out of the flow (it is dropped, cleared, or floats to the bottom). */
  private _unplace(r: IRankOutput, e: Entry, u: ILiveUpdate): void {
    if (!e.inFlow) {
      return;
    }
    e.inFlow = false;
    const i = r.flow.lastIndexOf(e);
    if (i >= 0) {
      r.flow.splice(i, 1);
    }
    this._stale++;
    u.removed.add(e);
  }

  /** After a change: a bar floats to the bottom, a finished one lands at the end of the flow. */
  private _settle(r: IRankOutput, e: Entry, u: ILiveUpdate): void {
    const bar = entryIsBar(e);
    const floating = r.bars.includes(e);
    if (bar && !floating) {
      this._unplace(r, e, u);
      r.bars.push(e);
      u.bars.add(e.rank);
    } else if (!bar && floating) {
      r.bars.splice(r.bars.indexOf(e), 1);
      u.bars.add(e.rank);
      this._place(r, e, u);
    } else if (floating) {
      u.bars.add(e.rank);
    }
  }

  private _clearNow(rank: number, r: IRankOutput, u: ILiveUpdate): void {
    for (const e of r.flow) {
      e.inFlow = false;
      u.removed.add(e);
      this._stale++;
    }
    r.flow = [];
    r.bars = [];
    r.open.clear();
    r.ids.clear();
    r.text = new TerminalText();
    r.clearPending = false;
    u.cleared.add(rank);
    u.bars.add(rank);
  }

  private _display(rank: number, item: IDisplayItem, u: ILiveUpdate): void {
    const r = this._rank(rank);
    if (item.kind === 'clear') {
      if (item.wait) {
        r.clearPending = true;
      } else {
        this._clearNow(rank, r, u);
      }
      return;
    }
    if (item.kind === 'update') {
      for (const e of (item.id !== null && r.ids.get(item.id)) || []) {
        e.item = { ...item, kind: 'data' };
        e.version++;
        e.updated = true;
        u.changed.add(e);
        this._settle(r, e, u);
      }
      return;
    }
    if (r.clearPending) {
      this._clearNow(rank, r, u);
    }
    const e: IDisplayEntry = { kind: 'display', rank, item, seq: 0, version: 0, inFlow: false, updated: false };
    this._place(r, e, u);
    if (item.id !== null) {
      const same = r.ids.get(item.id);
      if (same) {
        same.push(e);
      } else {
        r.ids.set(item.id, [e]);
      }
    }
  }

  private _write(rank: number, stream: string, text: string, u: ILiveUpdate): void {
    const r = this._rank(rank);
    if (r.clearPending) {
      this._clearNow(rank, r, u);
    }
    const lines = r.text.lines;
    const before = lines.length;
    r.text.write(stream, text);
    // this stream's open line may have changed: redrawn, completed (a bar lands), or become a bar
    for (const [line, e] of r.open) {
      if (line.stream !== stream) {
        continue;
      }
      e.version++;
      u.changed.add(e);
      if (line.complete) {
        r.open.delete(line);
      }
      this._settle(r, e, u);
    }
    for (let i = before; i < lines.length; i++) {
      const line = lines[i];
      const e: ILineEntry = { kind: 'line', rank, line, seq: 0, version: 0, inFlow: false };
      if (entryIsBar(e)) {
        r.bars.push(e);
        u.bars.add(rank);
      } else {
        this._place(r, e, u);
      }
      if (!line.complete) {
        r.open.set(line, e);
      }
    }
    lines.length = 0; // the flow holds them now; the terminal keeps its open lines itself
  }

  private _trim(u: ILiveUpdate): void {
    for (const rank of this._touched) {
      const r = this._ranks.get(rank)!;
      const excess = r.flow.length - this.limit;
      if (excess > 0) {
        let lines = 0;
        for (const e of r.flow.splice(0, excess)) {
          e.inFlow = false;
          this._stale++;
          u.removed.add(e);
          if (e.kind === 'line') {
            r.open.delete(e.line);
            lines++;
          } else if (e.item.id !== null) {
            const same = r.ids.get(e.item.id)?.filter(x => x !== e);
            if (same?.length) {
              r.ids.set(e.item.id, same);
            } else {
              r.ids.delete(e.item.id);
            }
          }
        }
        r.elided += lines;
        u.elided.add(rank);
      }
    }
    this._touched.clear();
    if (this._stale > 1000 && this._stale > this._order.length / 2) {
      this._compact();
    }
  }

  /** Forget merged-order slots of entries that left the flow or moved (a bar that landed). */
  private _compact(): void {
    if (this._stale === 0) {
      return;
    }
    const seen = new Set<Entry>();
    const kept: Entry[] = [];
    for (let i = this._order.length - 1; i >= 0; i--) {
      const e = this._order[i];
      if (e.inFlow && !seen.has(e)) {
        seen.add(e);
        kept.push(e);
      }
    }
    this._order = kept.reverse();
    this._stale = 0;
  }

  private _emit(u: ILiveUpdate): void {
    for (const fn of this._listeners) {
      fn(u);
    }
  }

  private _queue: Array<readonly [number, string, unknown]> = [];
  private _qHead = 0;
  private _qLines = 0;
  private _qBound = 0;
  private _qElided: Record<string, number> = {};
  private _drainScheduled = false;
  private _ranks = new Map<number, IRankOutput>();
  /** Every placement in order; an entry placed twice (a bar that landed) counts at its last one. */
  private _order: Entry[] = [];
  private _stale = 0;
  private _seq = 0;
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
/** Entries of a pane in the DOM at first (the newest); "show earlier" adds `MORE` at a time. */
export const WINDOW = 200;
const MORE = 1000;
/** Updates held for one frame beyond which the next frame redraws the pane from the model. */
const PENDING_MAX = 20000;
/** Output is drawn at most once per this many ms (a flood's frames would each redraw the window). */
const MIN_DRAW_MS = 50;
/** More bars than this at the bottom of the merged view: they scroll with the output. */
const STICKY_BARS_MAX = 6;

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

/** Options of a view. */
export interface ILiveViewOptions {
  /** Tab to show instead of the default (kept across re-renders of one output). */
  selected?: number | 'merged' | null;
  /** Called when the user picks a tab. */
  onSelect?: (sel: number | 'merged') => void;
  /** A live run (the default): elapsed time and Stop while it is active. False for a saved run. */
  live?: boolean;
}

/** Seconds since the kernel started the run are not known to a saved run: nothing to stop. */
class StaticSource implements ILiveSource {
  readonly output = new LiveOutput(Number.POSITIVE_INFINITY);
  readonly stopRequested = false;
  readonly stopAcknowledged = false;
  constructor(private _run: IRunBundle) {}
  run(): IRunBundle {
    return this._run;
  }
  startedAt(): number | null {
    return null;
  }
  stop(): void {
    // a saved run is over
  }
}

/**
 * A saved run into `host`: the same view as the live one, over the run's kept output.
 * `tails` are each rank's chunks (`[stream, text]` or `["display", item]`); without them, a
 * version 1 bundle's per-rank `output`.  Returns the view (dispose it with its host).
 */
export function renderRun(
  host: HTMLElement,
  run: IRunBundle,
  options: ILiveViewOptions & { tails?: Record<string, ReadonlyArray<readonly [string, unknown]>> } = {}
): LiveView {
  const src = new StaticSource(run);
  const tails: Record<string, ReadonlyArray<readonly [string, unknown]>> = options.tails ?? {};
  if (!options.tails) {
    for (const r of run.ranks) {
      tails[String(r.rank)] = r.output;
    }
  }
  const elided: Record<string, number> = {};
  for (const r of run.ranks) {
    elided[String(r.rank)] = r.elided_lines;
  }
  src.output.reset(tails, elided);
  src.output.interleave();
  return new LiveView(host, src, { ...options, live: false });
}

type Sel = number | 'merged';

interface IPending {
  reset: boolean;
  added: Entry[];
  changed: Set<Entry>;
  removed: Set<Entry>;
  bars: Set<number>;
  elided: Set<number>;
  cleared: Set<number>;
}

function noPending(): IPending {
  return {
    reset: false,
    added: [],
    changed: new Set(),
    removed: new Set(),
    bars: new Set(),
    elided: new Set(),
    cleared: new Set()
  };
}

function rankKey(r: IRankInfo, run: IRunBundle): string {
  return JSON.stringify([
    r.status,
    r.summary,
    r.duration,
    r.exit_code,
    r.signal,
    r.pid,
    r.traceback,
    r.stdout_path,
    r.stderr_path,
    r.node,
    run.error?.rank === r.rank
  ]);
}

/**
 * One view of a run, drawn into `host`.  Output is drawn once per animation frame, however many
 * messages arrived; only the newest `WINDOW` entries of the selected pane are in the DOM (older
 * kept ones one click away); header, banner and chips are rebuilt only where they changed.
 */
export class LiveView {
  constructor(host: HTMLElement, src: ILiveSource, options: ILiveViewOptions = {}) {
    this._src = src;
    this._live = options.live !== false;
    this._onSelect = options.onSelect;
    this._root = h('div', { class: this._live ? 'nbs-Run nbs-mod-live' : 'nbs-Run' });
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
        this._src.stop(); // first, before any drawing: the message leaves now
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
    if (options.selected !== undefined && options.selected !== null) {
      this._wanted = options.selected;
    }
    this.refresh();
  }

  /** Redraw what changed of everything but the output: header, banner, chips, the pane's head. */
  refresh(): void {
    if (this._disposed) {
      return;
    }
    const run = this._src.run();
    this._run = run;
    this._root.setAttribute('data-status', run.status);
    const active = this._live && ACTIVE.has(run.status);
    if (active && this._timer === null) {
      this._timer = window.setInterval(() => this._tick(), 1000);
    } else if (!active && this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
    this._updateClock();
    this._refreshHeader(run, active);
    this._refreshTabs(run);

    // the selection: the default first, the failed rank's pane as soon as one fails
    const failed = run.ranks.some(r => r.status === 'failed');
    let sel = this._selected;
    if (sel === null && this._wanted !== null && this._valid(this._wanted)) {
      sel = this._wanted;
      this._failureShown = failed;
    }
    if (sel === null || !this._valid(sel)) {
      sel = run.ranks.length ? defaultSelection(run) : null;
    }
    if (failed && !this._failureShown) {
      this._failureShown = true;
      if (this._live) {
        sel = defaultSelection(run);
      }
    }
    if (sel === null) {
      if (this._selected === null && !this._host.firstChild) {
        this._host.appendChild(h('div', { class: 'nbs-Empty' }, 'no rank has started'));
      }
    } else if (sel !== this._selected) {
      this._select(sel);
    } else {
      this._refreshPaneHead();
    }
  }

  dispose(): void {
    this._disposed = true;
    this._unsubscribe();
    if (this._timer !== null) {
      window.clearInterval(this._timer);
    }
    if (this._frame !== null) {
      cancelAnimationFrame(this._frame);
    }
  }

  /** Select a tab (a rank or `'merged'`), as a click on it would. */
  select(sel: Sel): void {
    this._pick(sel);
  }

  // -- chrome ----------------------------------------------------------------------------------

  private _refreshHeader(run: IRunBundle, active: boolean): void {
    const unanswered = this._stopUnanswered();
    const counts = run.ranks.map(r => r.status).sort();
    const key = JSON.stringify([
      run.status,
      run.nprocs,
      counts,
      run.start_method,
      run.backend,
      run.duration,
      run.run_id,
      run.log_dir,
      active,
      this._src.stopRequested,
      this._src.stopAcknowledged,
      unanswered
    ]);
    if (key !== this._headerKey) {
      this._headerKey = key;
      const header = buildHeader(run, {
        meta: active ? [metaEntry('elapsed', this._clock)] : [],
        actions: active ? [this._stopButton(unanswered)] : []
      });
      if (this._header) {
        this._header.replaceWith(header);
      } else {
        this._root.prepend(header);
      }
      this._header = header;
    }
    const bannerKey = JSON.stringify([run.status, run.error, run.ranks.map(r => r.rank)]);
    if (bannerKey !== this._bannerKey) {
      this._bannerKey = bannerKey;
      for (const node of this._banner) {
        node.remove();
      }
      this._banner = buildBanner(run, rank => this._pick(rank));
      this._header!.after(...this._banner);
    }
  }

  private _refreshTabs(run: IRunBundle): void {
    const ranks = run.ranks.map(r => r.rank);
    const layout = JSON.stringify(ranks);
    if (layout !== this._tabsLayout) {
      this._tabsLayout = layout;
      this._chips.clear();
      this._tabs.textContent = '';
      this._tabs.classList.toggle('nbs-mod-compact', ranks.length > 16);
      if (ranks.length > 1) {
        const merged = buildMergedTab();
        merged.addEventListener('click', () => this._pick('merged'));
        this._tabs.appendChild(merged);
      }
    }
    for (const r of run.ranks) {
      const key = rankKey(r, run);
      const had = this._chips.get(r.rank);
      if (had?.key === key) {
        continue;
      }
      const chip = buildChip(r, run);
      chip.addEventListener('click', () => this._pick(r.rank));
      if (had) {
        had.el.replaceWith(chip);
      } else {
        this._tabs.appendChild(chip);
      }
      this._chips.set(r.rank, { key, el: chip });
      if (this._selected !== null) {
        markSelected(this._tabs, this._selected);
      }
    }
  }

  // -- selection -------------------------------------------------------------------------------

  private _valid(sel: Sel): boolean {
    const ranks = this._run?.ranks ?? [];
    return sel === 'merged' ? ranks.length > 1 : ranks.some(r => r.rank === sel);
  }

  private _pick(sel: Sel): void {
    if (this._valid(sel)) {
      this._select(sel);
      this._onSelect?.(sel);
    }
  }

  private _rankInfo(rank: number): IRankInfo | undefined {
    return this._run?.ranks.find(r => r.rank === rank);
  }

  private _mine(rank: number): boolean {
    return this._selected === 'merged' || this._selected === rank;
  }

  /** Build the selected pane from what is kept. */
  private _select(sel: Sel): void {
    this._selected = sel;
    this._cap = WINDOW;
    markSelected(this._tabs, sel);
    this._host.textContent = '';
    this._host.setAttribute('data-selected', String(sel));
    const merged = sel === 'merged';
    this._paneKey = '';
    this._out = h('pre', { class: merged ? 'nbs-Output nbs-mod-merged' : 'nbs-Output', tabindex: '0' });
    if (merged) {
      const widest = Math.max(0, ...(this._run?.ranks.map(r => r.rank) ?? [0]));
      this._out.style.setProperty('--nbs-prefix-w', `${`[rank${widest}]`.length}ch`);
    }
    this._earlier = h('div', { class: 'nbs-Earlier' });
    this._flow = h('div', { class: 'nbs-Flow' });
    this._bars = h('div', { class: 'nbs-Bars' });
    this._out.append(this._earlier, this._flow, this._bars);
    this._stick = true;
    const out = this._out;
    out.addEventListener(
      'scroll',
      () => (this._stick = out.scrollTop + out.clientHeight >= out.scrollHeight - 8),
      { passive: true }
    );
    this._head = h('div', { class: 'nbs-Pane-top' });
    this._pane = h('div', { class: 'nbs-Pane', 'data-rank': String(sel) }, this._head, out);
    this._host.appendChild(this._pane);
    this._refreshPaneHead();
    this._build();
    requestAnimationFrame(() => (out.scrollTop = out.scrollHeight));
  }

  /** The pane's head (and a failed rank's traceback) from the latest rank records, if they changed. */
  private _refreshPaneHead(): void {
    const pane = this._pane;
    const head = this._head;
    if (!pane || !head || this._run === null) {
      return;
    }
    const sel = this._selected;
    const parts: Array<HTMLElement | null> = [];
    let key: string;
    if (sel === 'merged') {
      key = 'merged';
      if (key === this._paneKey) {
        return;
      }
      pane.removeAttribute('data-status');
      parts.push(
        mergedHead(
          this._live
            ? 'in arrival order; each rank in its own order'
            : 'interleaved by line; each rank in its own order'
        )
      );
    } else if (sel !== null) {
      const info = this._rankInfo(sel);
      if (!info) {
        return;
      }
      key = rankKey(info, this._run) + JSON.stringify(this._run.error);
      if (key === this._paneKey) {
        return;
      }
      pane.setAttribute('data-status', info.status);
      parts.push(paneHead(info), tracebackBox(info, this._run));
      parts.push(h('div', { class: 'nbs-Section-label' }, 'output'));
    } else {
      return;
    }
    this._paneKey = key;
    head.textContent = '';
    for (const p of parts) {
      if (p) {
        head.appendChild(p);
      }
    }
    // the elision markers name the log file, known from the rank records
    this._drawEarlier(true);
  }

  // -- output ----------------------------------------------------------------------------------

  private _node(e: Entry): HTMLElement {
    const node = entryNode(e, this._selected === 'merged');
    this._entryOf.set(node, e);
    this._version.set(node, e.version);
    return node;
  }

  private _onOutput(u: ILiveUpdate): void {
    if (this._disposed) {
      return;
    }
    const p = this._pending;
    if (u.reset) {
      p.reset = true;
    }
    if (!p.reset) {
      for (const e of u.added) {
        p.added.push(e);
      }
      for (const e of u.changed) {
        p.changed.add(e);
      }
      for (const e of u.removed) {
        p.removed.add(e);
      }
      for (const r of u.bars) {
        p.bars.add(r);
      }
      for (const r of u.cleared) {
        p.cleared.add(r);
      }
      if (p.added.length + p.changed.size + p.removed.size > PENDING_MAX) {
        p.reset = true; // a hidden page does not draw frames: start over from the model
      }
    }
    for (const r of u.elided) {
      p.elided.add(r);
    }
    if (p.reset) {
      this._pending = { ...noPending(), reset: true, elided: p.elided };
    }
    if (this._frame === null) {
      this._frame = requestAnimationFrame(() => this._flush());
    }
  }

  /** Draw what changed since the last frame: one batch of DOM writes, then one scroll. */
  private _flush(): void {
    this._frame = null;
    const flow = this._flow;
    const out = this._out;
    if (this._disposed || this._selected === null || !flow || !out) {
      this._pending = noPending();
      return;
    }
    // at most one draw per MIN_DRAW_MS: under a flood each draw replaces most of the window anyway
    const now = performance.now();
    if (!this._pending.reset && now - this._drawnAt < MIN_DRAW_MS) {
      this._frame = requestAnimationFrame(() => this._flush());
      return;
    }
    this._drawnAt = now;
    const p = this._pending;
    this._pending = noPending();
    // read before any write (the last frame's layout is still valid): once the pane is full it gets
    // a fixed height and strict containment, so its lines never relayout the notebook around it
    if (this._live && !this._full && out.scrollHeight > out.clientHeight + 1) {
      this._full = true;
      out.classList.add('nbs-mod-full');
    }
    if (p.reset || [...p.cleared].some(r => this._mine(r))) {
      this._build();
    } else {
      for (const e of p.removed) {
        const node = this._nodes.get(e);
        if (node) {
          node.remove();
          this._nodes.delete(e);
        }
      }
      for (const e of p.changed) {
        const node = this._nodes.get(e);
        if (node && e.inFlow && this._version.get(node) !== e.version) {
          const fresh = this._node(e);
          node.replaceWith(fresh);
          this._nodes.set(e, fresh);
        }
      }
      // only the newest `_cap` can be in the window: older ones are not even built
      let added = p.added.filter(e => e.inFlow && this._mine(e.rank) && !this._nodes.has(e));
      added.sort((a, b) => a.seq - b.seq);
      added = added.filter((e, i) => i === 0 || e !== added[i - 1]);
      if (added.length > this._cap) {
        added = added.slice(-this._cap);
      }
      this._removeFirst(flow.childElementCount + added.length - this._cap);
      const fresh = document.createDocumentFragment();
      for (const e of added) {
        const node = this._node(e);
        this._nodes.set(e, node);
        fresh.appendChild(node);
      }
      flow.appendChild(fresh);
      let bars = [...p.bars].some(r => this._mine(r));
      for (const e of p.changed) {
        bars ||= !e.inFlow && this._mine(e.rank);
      }
      if (bars) {
        this._drawBars();
      }
      this._drawEarlier(false);
    }
    if (this._stick) {
      out.scrollTop = out.scrollHeight;
    }
  }

  /** The pane's flow (its newest `_cap` entries), bars and markers, from the model. */
  private _build(): void {
    const flow = this._flow;
    const sel = this._selected;
    if (!flow || sel === null) {
      return;
    }
    const output = this._src.output;
    flow.textContent = '';
    this._nodes.clear();
    this._full = false;
    this._out?.classList.remove('nbs-mod-full');
    const all = sel === 'merged' ? output.merged() : output.entries(sel);
    const frag = document.createDocumentFragment();
    for (let i = Math.max(0, all.length - this._cap); i < all.length; i++) {
      const node = this._node(all[i]);
      this._nodes.set(all[i], node);
      frag.appendChild(node);
    }
    flow.appendChild(frag);
    this._barNodes.clear();
    this._bars!.textContent = '';
    this._drawBars();
    this._drawEarlier(true);
  }

  /** Take the `n` oldest entries out of the window, in one DOM operation. */
  private _removeFirst(n: number): void {
    const flow = this._flow!;
    if (n <= 0) {
      return;
    }
    const all = n >= flow.childElementCount;
    let last: Element | null = null;
    let node = flow.firstElementChild;
    for (let i = 0; i < n && node; i++, node = node.nextElementSibling) {
      const e = this._entryOf.get(node);
      if (e) {
        this._nodes.delete(e);
      }
      last = node;
    }
    if (all) {
      flow.textContent = '';
    } else if (last) {
      const range = document.createRange();
      range.setStartBefore(flow.firstElementChild!);
      range.setEndAfter(last);
      range.deleteContents();
    }
  }

  /** The bottom: each bar being redrawn (one per rank and stream, by rank in the merged view). */
  private _drawBars(): void {
    const bars = this._bars;
    const sel = this._selected;
    if (!bars || sel === null) {
      return;
    }
    const output = this._src.output;
    const want = sel === 'merged' ? output.mergedBars() : output.bars(sel);
    const keep = new Map<Entry, HTMLElement>();
    const nodes: HTMLElement[] = [];
    for (const e of want) {
      let node = this._barNodes.get(e);
      if (!node || this._version.get(node) !== e.version) {
        node = this._node(e);
        node.classList.add('nbs-mod-bar');
      }
      keep.set(e, node);
      nodes.push(node);
    }
    this._barNodes = keep;
    bars.replaceChildren(...nodes);
    bars.classList.toggle('nbs-mod-sticky', nodes.length > 0 && nodes.length <= STICKY_BARS_MAX);
    this._drawEmpty();
  }

  /** Before the flow: `N lines elided` per rank, and the kept entries not drawn (a button). */
  private _drawEarlier(force: boolean): void {
    const box = this._earlier;
    const sel = this._selected;
    if (!box || sel === null) {
      return;
    }
    const output = this._src.output;
    const ranks = sel === 'merged' ? (this._run?.ranks.map(r => r.rank) ?? output.ranks()) : [sel];
    const elided = ranks.map(r => output.elided(r));
    const hidden = Math.max(0, output.count(sel) - (this._flow?.childElementCount ?? 0));
    const key = JSON.stringify([elided, hidden, ranks.map(r => this._rankInfo(r)?.stdout_path ?? null)]);
    if (!force && key === this._earlierKey) {
      return;
    }
    this._earlierKey = key;
    const nodes: HTMLElement[] = [];
    ranks.forEach((rank, i) => {
      if (elided[i] > 0) {
        nodes.push(elidedNode(rank, elided[i], this._rankInfo(rank)?.stdout_path ?? null, sel === 'merged'));
      }
    });
    if (hidden > 0) {
      const more = Math.min(hidden, MORE);
      const label =
        more === hidden
          ? `show ${hidden} earlier ${hidden === 1 ? 'line' : 'lines'}`
          : `show ${more} earlier lines (${hidden} kept)`;
      const btn = h(
        'button',
        { class: 'nbs-More', type: 'button', title: 'Older kept output, drawn when asked for' },
        label
      );
      btn.addEventListener('click', () => {
        const out = this._out!;
        const fromBottom = out.scrollHeight - out.scrollTop;
        this._cap += MORE;
        this._build();
        out.scrollTop = out.scrollHeight - fromBottom; // keep what was in view where it was
      });
      nodes.push(btn);
    }
    box.replaceChildren(...nodes);
    this._drawEmpty();
  }

  private _drawEmpty(): void {
    const out = this._out;
    if (!out) {
      return;
    }
    const empty =
      (this._flow?.childElementCount ?? 0) === 0 &&
      (this._bars?.childElementCount ?? 0) === 0 &&
      (this._earlier?.childElementCount ?? 0) === 0;
    if (empty !== out.classList.contains('nbs-mod-empty')) {
      out.classList.toggle('nbs-mod-empty', empty);
      if (empty) {
        out.appendChild(emptyOutput());
      } else {
        out.querySelector(':scope > .nbs-Empty')?.remove();
      }
    }
  }

  // -- header controls -------------------------------------------------------------------------

  private _stopUnanswered(): boolean {
    return (
      this._src.stopRequested &&
      !this._src.stopAcknowledged &&
      this._stopClickedAt !== null &&
      Date.now() - this._stopClickedAt > STOP_UNANSWERED_MS
    );
  }

  private _stopButton(unanswered: boolean): HTMLElement {
    const btn = this._stopBtn;
    const requested = this._src.stopRequested;
    btn.disabled = requested;
    btn.classList.toggle('nbs-mod-stopping', requested);
    btn.querySelector('.nbs-Stop-label')!.textContent = requested ? 'Stopping\u2026' : 'Stop';
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
        btn
      );
    }
    return btn;
  }

  private _updateClock(): void {
    const start = this._src.startedAt();
    const run = this._run;
    if (start !== null && run && ACTIVE.has(run.status)) {
      const text = formatElapsed((performance.now() - start) / 1000);
      if (this._clock.textContent !== text) {
        this._clock.textContent = text;
      }
    }
  }

  private _tick(): void {
    this._updateClock();
    const run = this._run;
    // Stop unanswered for a while: say so (once)
    if (run && ACTIVE.has(run.status) && !this._stopHintShown && this._stopUnanswered()) {
      this.refresh();
    }
  }

  private _src: ILiveSource;
  private _live: boolean;
  private _onSelect?: (sel: Sel) => void;
  private _root: HTMLElement;
  private _header: HTMLElement | null = null;
  private _headerKey = '';
  private _banner: HTMLElement[] = [];
  private _bannerKey = '';
  private _tabs: HTMLElement;
  private _tabsLayout = '';
  private _chips = new Map<number, { key: string; el: HTMLElement }>();
  private _host: HTMLElement;
  private _pane: HTMLElement | null = null;
  private _head: HTMLElement | null = null;
  private _paneKey = '';
  private _out: HTMLElement | null = null;
  private _earlier: HTMLElement | null = null;
  private _earlierKey = '';
  private _flow: HTMLElement | null = null;
  private _bars: HTMLElement | null = null;
  private _stick = true;
  private _cap = WINDOW;
  private _clock: HTMLElement;
  private _stopBtn: HTMLButtonElement;
  private _stopClickedAt: number | null = null;
  private _stopHintShown = false;
  private _run: IRunBundle | null = null;
  private _selected: Sel | null = null;
  private _wanted: Sel | null = null;
  private _failureShown = false;
  private _nodes = new Map<Entry, HTMLElement>();
  private _barNodes = new Map<Entry, HTMLElement>();
  private _entryOf = new WeakMap<Element, Entry>();
  private _version = new WeakMap<Element, number>();
  private _pending: IPending = noPending();
  private _frame: number | null = null;
  private _drawnAt = -Infinity;
  private _full = false;
  private _unsubscribe: () => void;
  private _timer: number | null = null;
  private _disposed = false;
}
