/**
 * Output waiting to be parsed.  A message handler only queues what arrived (its whole work);
 * `LiveOutput.drain` parses it, a frame's budget at a time.  A rank's queued text beyond what its
 * flow can keep is dropped unparsed and counted as elided.  No DOM.
 */

import type { Chunks } from './messages';

type Chunk = readonly [number, string, unknown];

/** Queued lines (of every rank), in flow limits, past which old queued text is dropped (`push`). */
const QUEUE_BOUND_LIMITS = 4;

export function newlines(text: string): number {
  let n = 0;
  for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1)) {
    n++;
  }
  return n;
}

export class ChunkQueue {
  /** `limit`: lines a rank's flow keeps (text beyond the newest `limit` queued lines is dropped). */
  constructor(readonly limit: number) {}

  /** Chunks queued and not yet parsed. */
  get length(): number {
    return this._queue.length - this._head;
  }

  /** Queue `[rank, stream, data]` chunks (malformed ones skipped) and lines the kernel left out. */
  push(chunks: Chunks, elided: Record<string, number> = {}): void {
    for (const [key, n] of Object.entries(elided ?? {})) {
      if (typeof n === 'number' && n > 0) {
        this._elided[key] = (this._elided[key] ?? 0) + n;
      }
    }
    for (const c of Array.isArray(chunks) ? chunks : []) {
      if (Array.isArray(c) && c.length >= 3) {
        this._queue.push(c as unknown as Chunk);
        if (typeof c[2] === 'string') {
          this._lines += newlines(c[2]);
        }
      }
    }
    if (this._lines > Math.max(this._bound, QUEUE_BOUND_LIMITS * this.limit)) {
      this._boundQueue();
    }
  }

  /** Lines elided since the last call, by rank (the kernel's, and those dropped here). */
  takeElided(): Record<string, number> {
    const elided = this._elided;
    this._elided = {};
    return elided;
  }

  /**
   * Hand queued chunks to `parse`, in order, for at most `budgetMs` (checked every few chunks).
   * Returns how many were taken.
   */
  take(budgetMs: number, parse: (c: Chunk) => void): number {
    const q = this._queue;
    const end = performance.now() + budgetMs;
    const start = this._head;
    let i = start;
    while (i < q.length) {
      const c = q[i++];
      if (typeof c[2] === 'string') {
        this._lines -= newlines(c[2]);
      }
      parse(c);
      if ((i & 7) === 0 && performance.now() > end) {
        break;
      }
    }
    if (i >= q.length) {
      this._queue = [];
      this._head = 0;
      this._lines = 0;
    } else {
      this._head = i;
    }
    return i - start;
  }

  /**
   * Drop the queued text (of every rank), counted as elided; display items stay (an update or a
   * clear must not be lost).  A run being stopped: its end is drawn next, not what led up to it.
   */
  dropText(): void {
    const q = this._queue;
    const keep: Chunk[] = [];
    for (let i = this._head; i < q.length; i++) {
      const c = q[i];
      const [rank, , data] = c;
      if (typeof data !== 'string') {
        keep.push(c);
      } else if (typeof rank === 'number') {
        const n = newlines(data);
        if (n > 0) {
          this._elided[String(rank)] = (this._elided[String(rank)] ?? 0) + n;
        }
      }
    }
    this._queue = keep;
    this._head = 0;
    this._lines = 0;
  }

  /** Forget everything queued (a replay replaces it). */
  clear(): void {
    this._queue = [];
    this._head = 0;
    this._lines = 0;
    this._elided = {};
  }

  /** Drop each rank's queued text older than its newest `limit` queued lines; count it as elided. */
  private _boundQueue(): void {
    const q = this._queue;
    const seen = new Map<number, number>();
    const keep: Chunk[] = [];
    let lines = 0;
    for (let i = q.length - 1; i >= this._head; i--) {
      const c = q[i];
      const [rank, , data] = c;
      if (typeof data !== 'string') {
        keep.push(c); // display items stay (an update or a clear must not be lost)
        continue;
      }
      const n = newlines(data);
      const had = seen.get(rank) ?? 0;
      if (had >= this.limit && typeof rank === 'number') {
        this._elided[String(rank)] = (this._elided[String(rank)] ?? 0) + n;
        continue;
      }
      seen.set(rank, had + n);
      lines += n;
      keep.push(c);
    }
    this._queue = keep.reverse();
    this._head = 0;
    this._lines = lines;
    this._bound = 2 * lines;
  }

  private _queue: Chunk[] = [];
  private _head = 0;
  private _lines = 0;
  private _bound = 0;
  private _elided: Record<string, number> = {};
}
