/**
 * The pane of one selected tab (a rank, or every rank merged) in a run view: its head (the rank's
 * status line and traceback), its output window and the bars at its bottom, drawn from the output
 * model.  Output is drawn once per animation frame, however many messages arrived; only the newest
 * `WINDOW` entries are in the DOM (older kept ones one click away), except while the user reads above
 * the newest lines: then none is taken out above what they read.
 */

import { h } from './dom';
import { Entry, ILiveUpdate, emptyUpdate } from './entry';
import { elidedNode, emptyOutput, entryNode } from './lines';
import { IRankInfo, IRunBundle } from './messages';
import { LiveOutput } from './output';
import { mergedHead, paneHead, tracebackBox } from './panehead';

/** A tab: a rank, or every rank merged. */
export type Sel = number | 'merged';

/** Entries of a pane in the DOM at first (the newest); "show earlier" adds `MORE` at a time. */
export const WINDOW = 200;
const MORE = 1000;
/**
 * While the user reads above the newest lines, the window grows instead of losing its oldest
 * entries (taking them out moved the lines being read away once a rank printed past `WINDOW`),
 * up to this many; it shrinks back to `WINDOW` once the pane follows its output again.  (The model
 * keeps `TAIL_LINES` a rank: lines older than that leave it, and the pane, the rank's log has them.)
 */
const READING_MAX = 5 * MORE;
/** Updates held for one frame beyond which the next frame redraws the pane from the model. */
const PENDING_MAX = 20000;
/** Output is drawn at most once per this many ms (a flood's frames would each redraw the window). */
const MIN_DRAW_MS = 50;
/** More bars than this at the bottom of the merged view: they scroll with the output. */
const STICKY_BARS_MAX = 6;

/**
 * What a rank's chip and pane head are drawn from (`tabs.buildChip`, `panehead.paneHead`): its whole
 * record but what the pane's body draws apart (its output, and how many of its lines were elided,
 * which grows with every update of a flood), and whether it is the run's root cause; they are redrawn
 * when it changes. A hand-kept list of fields here had left out one the chip draws (`after`, "after
 * rank 2") and, before, the ranks' costs.
 */
export function rankKey(r: IRankInfo, run: IRunBundle): string {
  return JSON.stringify([{ ...r, output: undefined, elided_lines: undefined }, run.error?.rank === r.rank]);
}

export class Pane {
  /** Build the pane of `sel` into `host` (emptied) from what `output` keeps. */
  constructor(
    private _host: HTMLElement,
    private _output: LiveOutput,
    private _sel: Sel,
    private _run: IRunBundle,
    private _live: boolean
  ) {
    const sel = _sel;
    this._host.textContent = '';
    this._host.setAttribute('data-selected', String(sel));
    const merged = sel === 'merged';
    this._out = h('pre', { class: merged ? 'nbs-Output nbs-mod-merged' : 'nbs-Output', tabindex: '0' });
    if (merged) {
      const widest = Math.max(0, ..._run.ranks.map(r => r.rank));
      this._out.style.setProperty('--nbs-prefix-w', `${`[rank${widest}]`.length}ch`);
    }
    this._earlier = h('div', { class: 'nbs-Earlier' });
    this._flow = h('div', { class: 'nbs-Flow' });
    this._bars = h('div', { class: 'nbs-Bars' });
    this._out.append(this._earlier, this._flow, this._bars);
    const out = this._out;
    // A scroll event comes a frame after the scroll: by then more output (or a frame sized once
    // loaded) may have grown the pane below where it scrolled itself, which is no reason to stop
    // following. Only the user scrolling up, above where the pane last put itself, stops it; the
    // bottom, reached by any means, starts it again.
    out.addEventListener(
      'scroll',
      () => {
        if (out.scrollTop + out.clientHeight >= out.scrollHeight - 8) {
          this._stick = true;
        } else if (out.scrollTop < this._autoTop - 1) {
          this._stick = false;
        }
      },
      { passive: true }
    );
    // an image laid out only once decoded (no size in its metadata) grows the output after the
    // scroll to the bottom: keep the bottom in view (load does not bubble: caught on the way down)
    out.addEventListener(
      'load',
      () => {
        if (this._stick) {
          this._toBottom();
        }
      },
      true
    );
    // HTML a rank displays is sized once its frame has loaded, after the load above (a frame's own
    // listener runs after this capturing one), and again as its content changes: whatever grows the
    // output, a pane at its bottom stays there
    if (typeof ResizeObserver !== 'undefined') {
      new ResizeObserver(() => {
        if (this._stick) {
          this._toBottom();
        }
      }).observe(this._flow);
    }
    this._head = h('div', { class: 'nbs-Pane-top' });
    this._root = h('div', { class: 'nbs-Pane', 'data-rank': String(sel) }, this._head, out);
    this._host.appendChild(this._root);
    this.refreshHead();
    this._build();
    requestAnimationFrame(() => this._toBottom());
  }

  /** The latest run record (rank records for the head and the elision markers). */
  setRun(run: IRunBundle): void {
    this._run = run;
  }

  dispose(): void {
    this._disposed = true;
    if (this._frame !== null) {
      cancelAnimationFrame(this._frame);
      this._frame = null;
    }
  }

  /** The pane's head (and a failed rank's traceback) from the latest rank records, if they changed. */
  refreshHead(): void {
    const pane = this._root;
    const head = this._head;
    const sel = this._sel;
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
          this._live || this._output.byArrival
            ? 'in arrival order; each rank in its own order'
            : 'interleaved by line; each rank in its own order'
        )
      );
    } else {
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


  private _rankInfo(rank: number): IRankInfo | undefined {
    return this._run.ranks.find(r => r.rank === rank);
  }

  private _mine(rank: number): boolean {
    return this._sel === 'merged' || this._sel === rank;
  }

  // -- output ----------------------------------------------------------------------------------

  private _node(e: Entry): HTMLElement {
    const node = entryNode(e, this._sel === 'merged');
    if (e.kind === 'display' && e.item.mime.startsWith('image/') && !this._images) {
      // a pane with a figure is taller, so that a default-size figure is shown whole (style/base.css)
      this._images = true;
      this._out.classList.add('nbs-mod-images');
    }
    this._entryOf.set(node, e);
    this._version.set(node, e.version);
    return node;
  }

  /** The output changed: drawn at the next animation frame (at most every `MIN_DRAW_MS`). */
  update(u: ILiveUpdate): void {
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
      this._pending = { ...emptyUpdate(), reset: true, elided: p.elided };
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
    if (this._disposed) {
      this._pending = emptyUpdate();
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
    this._pending = emptyUpdate();
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
      const cap = this._stick
        ? this._cap
        : Math.max(this._cap, Math.min(READING_MAX, flow.childElementCount + added.length));
      if (added.length > cap) {
        added = added.slice(-cap);
      }
      this._removeFirst(flow.childElementCount + added.length - cap);
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
    // lines may have come into an empty pane (the bars and markers did not change): no placeholder
    this._drawEmpty();
    if (this._stick) {
      this._toBottom();
    }
  }

  /** Follow the output: scroll to the bottom, and remember where that put the pane. */
  private _toBottom(): void {
    const out = this._out;
    out.scrollTop = out.scrollHeight;
    this._autoTop = out.scrollTop;
  }

  /** The pane's flow (its newest `_cap` entries), bars and markers, from the model. */
  private _build(): void {
    const flow = this._flow;
    const sel = this._sel;
    const output = this._output;
    flow.textContent = '';
    this._nodes.clear();
    this._full = false;
    this._out.classList.remove('nbs-mod-full');
    const all = sel === 'merged' ? output.merged() : output.entries(sel);
    const frag = document.createDocumentFragment();
    for (let i = Math.max(0, all.length - this._cap); i < all.length; i++) {
      const node = this._node(all[i]);
      this._nodes.set(all[i], node);
      frag.appendChild(node);
    }
    flow.appendChild(frag);
    this._barNodes.clear();
    this._bars.textContent = '';
    this._drawBars();
    this._drawEarlier(true);
  }

  /** Take the `n` oldest entries out of the window, in one DOM operation. */
  private _removeFirst(n: number): void {
    const flow = this._flow;
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
    const sel = this._sel;
    const output = this._output;
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
    const sel = this._sel;
    const output = this._output;
    const ranks = sel === 'merged' ? this._run.ranks.map(r => r.rank) : [sel];
    const elided = ranks.map(r => output.elided(r));
    const hidden = Math.max(0, output.count(sel) - this._flow.childElementCount);
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
        const out = this._out;
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
    const empty =
      this._flow.childElementCount === 0 &&
      this._bars.childElementCount === 0 &&
      this._earlier.childElementCount === 0;
    if (empty !== out.classList.contains('nbs-mod-empty')) {
      out.classList.toggle('nbs-mod-empty', empty);
      if (empty) {
        out.appendChild(emptyOutput());
      } else {
        out.querySelector(':scope > .nbs-Empty')?.remove();
      }
    }
  }


  private _root: HTMLElement;
  private _head: HTMLElement;
  private _paneKey = '';
  private _out: HTMLElement;
  private _earlier: HTMLElement;
  private _earlierKey = '';
  private _flow: HTMLElement;
  private _bars: HTMLElement;
  private _stick = true;
  private _autoTop = 0; // where the pane last scrolled itself (following its output)
  private _cap = WINDOW;
  private _nodes = new Map<Entry, HTMLElement>();
  private _barNodes = new Map<Entry, HTMLElement>();
  private _entryOf = new WeakMap<Element, Entry>();
  private _version = new WeakMap<Element, number>();
  private _pending: ILiveUpdate = emptyUpdate();
  private _frame: number | null = null;
  private _drawnAt = -Infinity;
  private _full = false;
  private _images = false;
  private _disposed = false;
}
