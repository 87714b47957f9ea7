/**
 * The live output model: what the browser keeps of each rank's output (at most `TAIL_LINES`
 * entries, the kernel's own bound; older lines are counted as elided), and what changed, for its
 * views.  No DOM: `LiveView` (view.ts) draws it.
 */

import { Entry, IDisplayEntry, ILineEntry, ILiveUpdate, emptyUpdate, entryIsBar } from './entry';
import { Chunks, IDisplayItem, IRunBundle, Tails, decodeWidgetMessage, parseItem } from './messages';
import { ChunkQueue } from './queue';
import { ILine, TerminalText } from './text';

export type { Entry, IDisplayEntry, ILineEntry, ILiveUpdate } from './entry';
export { entryIsBar, entryText } from './entry';

/** Lines (and display items) kept per rank, as in the kernel (`nbspawn.views._tail.TAIL_LINES`). */
export const TAIL_LINES = 2000;

/** Parsing time per animation frame for queued output; the rest waits for the next frame. */
export const FRAME_BUDGET_MS = 8;

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

/**
 * Every rank's output as the browser keeps it, bounded: per rank a flow of lines and display items
 * in the order the rank wrote them, and the progress bars being redrawn, which live at the bottom
 * (as a terminal shows a `tqdm` bar under the lines `tqdm.write` printed) until they complete and
 * land at the end of the flow.
 */
export class LiveOutput {
  constructor(readonly limit = TAIL_LINES) {
    this._queue = new ChunkQueue(limit);
  }

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
  append(chunks: Chunks, elided: Record<string, number> = {}): void {
    this.enqueue(chunks, elided);
    this.drain();
  }

  /**
   * New output, only queued (a message handler's whole work): `drain` parses it, a frame's budget
   * at a time (`feed` schedules that).  A rank's queued text beyond what its flow can keep (the
   * newest `limit` lines) is dropped unparsed and counted as elided.
   */
  enqueue(chunks: Chunks, elided: Record<string, number> = {}): void {
    this._queue.push(chunks, elided);
  }

  /** `enqueue`, then `drain` in animation frames (`FRAME_BUDGET_MS` each) until nothing is queued. */
  feed(chunks: Chunks, elided: Record<string, number> = {}): void {
    this.enqueue(chunks, elided);
    this._schedule();
  }

  /**
   * The run is being stopped: the text queued and not yet drawn is dropped, counted as elided (each
   * rank's pane says how many lines it does not show; the frozen view that follows has them).
   */
  dropQueued(): void {
    if (this._queue.length > 0) {
      this._queue.dropText();
      this.drain();
    }
  }

  /** Chunks queued and not yet parsed. */
  get queued(): number {
    return this._queue.length;
  }

  /**
   * Parse queued chunks for at most `budgetMs` (checked every few chunks), then tell the views
   * once.  Returns whether chunks are left.
   */
  drain(budgetMs = Number.POSITIVE_INFINITY): boolean {
    const u = emptyUpdate();
    this._addElided(this._queue.takeElided(), u);
    const parsed = this._queue.take(budgetMs, c => this._chunk(c[0], c[1], c[2], u));
    if (parsed > 0 || u.elided.size) {
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

  /**
   * Replace everything with the kernel's tails (its answer to a replay request, or a saved run's).
   * `order` says whose chunk came next (`parseOrder`): the merged flow is then in the order the
   * ranks printed; chunks it does not name follow, rank by rank.
   */
  reset(
    tails: Tails | null | undefined,
    elided: Record<string, number> | null | undefined = {},
    order: readonly number[] | null = null
  ): void {
    this._ranks.clear();
    this._order = [];
    this._seq = 0;
    // what was queued is older than the tails
    this._queue.clear();
    const u = emptyUpdate(true);
    this._addElided(elided ?? {}, u);
    const queues = new Map<number, ReadonlyArray<readonly [string, unknown]>>();
    for (const [key, chunks] of Object.entries(tails ?? {})) {
      const rank = Number(key);
      if (Number.isInteger(rank) && Array.isArray(chunks)) {
        this._rank(rank);
        queues.set(rank, chunks);
      }
    }
    const next = new Map<number, number>();
    const feed = (rank: number) => {
      const chunks = queues.get(rank);
      const i = next.get(rank) ?? 0;
      if (chunks && i < chunks.length) {
        next.set(rank, i + 1);
        const c = chunks[i];
        if (Array.isArray(c) && c.length >= 2) {
          this._chunk(rank, c[0], c[1], u);
        }
      }
    };
    for (const rank of order ?? []) {
      feed(rank);
    }
    for (const [rank, chunks] of queues) {
      while ((next.get(rank) ?? 0) < chunks.length) {
        feed(rank);
      }
    }
    this.byArrival = order !== null;
    this._trim(u);
    this._emit(emptyUpdate(true));
  }

  /**
   * Whether the merged flow is in the order the ranks printed: true for a live run and for tails
   * given with their order; false after `interleave`.
   */
  byArrival = true;

  /**
   * Order the merged flow by position instead of arrival: every rank's n-th entry together (a run
   * saved before bundles kept their order has no cross-rank timing; this keeps lock-step logs such
   * as epochs aligned).
   */
  interleave(): void {
    this.byArrival = false;
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

  private _queue: ChunkQueue;
  private _drainScheduled = false;
  private _ranks = new Map<number, IRankOutput>();
  /** Every placement in order; an entry placed twice (a bar that landed) counts at its last one. */
  private _order: Entry[] = [];
  private _stale = 0;
  private _seq = 0;
  private _touched = new Set<number>();
  private _listeners = new Set<(u: ILiveUpdate) => void>();
}

/** Apply a live widget's custom message from the kernel (`output` or `replay`) to `output`. */
export function applyWidgetMessage(output: LiveOutput, msg: unknown): void {
  const m = decodeWidgetMessage(msg);
  if (m?.type === 'output') {
    // only queued here: parsed in animation frames, a budget at a time
    output.feed(m.chunks, m.elided);
  } else if (m?.type === 'replay') {
    output.reset(m.tails, m.elided, m.order);
  }
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
  /** Ask where every rank is now (a source that can: the live widget); the answer is `whereText`. */
  where?(): void;
  /** The last answer: every rank's stack, grouped; `''` while asked, null if never asked. */
  readonly whereText?: string | null;
  /** The collectives X-ray's drawing (static HTML and SVG from the kernel), if there is one yet. */
  xrayHtml?(): string | null;
}
