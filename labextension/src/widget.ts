/**
 * The live `%%spawn` widget: an anywidget ES module, bundled by esbuild into one self-contained
 * file (`nbspawn/_static/widget.js`), so it runs in every frontend anywidget supports
 * (JupyterLab, Notebook 7, VS Code, Colab), with or without this package's labextension.
 *
 * Kernel side: `nbspawn/views/_widget.py`.  Protocol (typed in `messages.ts`):
 *
 * - synced traits: `header` (the run record of docs/run-bundle.md without `ranks`, plus `elapsed`
 *   seconds and `stopping`), `ranks` (rank records without `output`), `error`;
 * - kernel → browser: `{type: "output", chunks: [[rank, stream, text] | [rank, "display", item], ...],
 *   elided: {rank: n}}`, at most ten a second, and `{type: "replay", tails: {rank: [[stream, text] |
 *   ["display", item], ...]}, elided}`,
 *   everything the kernel kept, in answer to
 * - browser → kernel: `{type: "replay"}`, sent once per model when it is set up (a view opened late,
 *   or a page reloaded, catches up), `{type: "stop"}` (the Stop button), and `{type: "where"}` (the
 *   Where button), answered with `{type: "where", text}`: every rank's stack now, grouped.
 *
 * When the run ends the kernel replaces this widget's output with the frozen bundle
 * (`application/vnd.nbspawn.run+json`), drawn by the run renderer (`mime.ts`) with this same view (`view.ts`).
 */

import { keepDisplayTarget } from './classic';
import { IRunBundle, IWidgetState, WidgetRequest, decodeWidgetMessage, parseBundle, record } from './messages';
import { ILiveSource, LiveOutput, applyWidgetMessage } from './output';
import { LiveView } from './view';

/** Events of the model heard here: a synced trait changed, a custom message, the comm lost. */
type ModelEvent<T> = `change:${keyof T & string}` | 'msg:custom' | 'comm_live_update';

/**
 * The part of anywidget's model API used here (AFM), typed by its traits as anywidget's own
 * `AnyModel<T>` is.  A trait is `undefined` until the kernel's first state arrives, and a kernel of
 * another version may send other shapes: what is read is still decoded (`parseBundle`, `record`).
 */
interface IAnyModel<T> {
  get<K extends keyof T & string>(name: K): T[K] | undefined;
  on(event: ModelEvent<T>, callback: (...args: unknown[]) => void): void;
  off(event?: ModelEvent<T> | null, callback?: ((...args: unknown[]) => void) | null): void;
  send(content: WidgetRequest): void;
}

type WidgetModel = IAnyModel<IWidgetState>;

type Cleanup = () => void;

/** One run's model-level state, shared by all its views in this page. */
class LiveRun implements ILiveSource {
  readonly output = new LiveOutput();
  readonly views = new Set<LiveView>();
  stopRequested = false;
  whereText: string | null = null;

  constructor(private _model: WidgetModel) {
    this.syncClock();
  }

  run(): IRunBundle {
    const header = record(this._model.get('header'));
    const ranks = this._model.get('ranks');
    return parseBundle({
      ...header,
      error: this._model.get('error') ?? null,
      ranks: Array.isArray(ranks) ? ranks : []
    });
  }

  xrayHtml(): string | null {
    const html = this._model.get('xray_html');
    return typeof html === 'string' && html ? html : null;
  }

  get stopAcknowledged(): boolean {
    return record(this._model.get('header')).stopping === true;
  }

  startedAt(): number | null {
    return this._start;
  }

  /**
   * The run's start on this page's clock.  The kernel's `elapsed` is late by however long its message
   * took to arrive and be taken (seconds while a page loads its widgets), so where this page's clock
   * agrees with the kernel's (the same machine, or both synced: the kernel's start is then at most
   * `CLOCKS_AGREE_S` before `elapsed` says, never after) the kernel's own start time is used; else
   * `elapsed`, anchored to this page's clock (the two machines' clocks may differ).
   */
  syncClock(): void {
    const header = record(this._model.get('header'));
    const elapsed = header.elapsed;
    if (typeof elapsed === 'number' && Number.isFinite(elapsed)) {
      const started = header.started_at;
      const byEpoch = typeof started === 'number' ? Date.now() / 1000 - started : Number.NaN;
      const seconds = byEpoch >= elapsed && byEpoch - elapsed < CLOCKS_AGREE_S ? byEpoch : elapsed;
      this._start = performance.now() - seconds * 1000;
    }
  }

  stop(): void {
    this.stopRequested = true;
    this._model.send({ type: 'stop' });
    this.output.dropQueued(); // under a flood, drawing it would hold back the run's end
    this.refresh();
  }

  /**
   * The kernel said it is stopping the run: what was sent before it heard the Stop, and is not drawn
   * yet, is dropped (it sends only the newest lines from now on).
   */
  onStopping(): void {
    if (this.stopAcknowledged && !this._stoppingSeen) {
      this._stoppingSeen = true;
      this.output.dropQueued();
    }
  }

  where(): void {
    this.whereText = '';
    this._model.send({ type: 'where' });
    this.refresh();
  }

  onMessage(msg: unknown): void {
    const m = decodeWidgetMessage(msg);
    if (m?.type === 'where') {
      this.whereText = m.text;
      this.refresh();
      return;
    }
    applyWidgetMessage(this.output, msg);
  }

  /** Redraw the views' chrome once, however many traits changed together. */
  refresh(): void {
    if (this._pending) {
      return;
    }
    this._pending = true;
    void Promise.resolve().then(() => {
      this._pending = false;
      for (const view of this.views) {
        view.refresh();
      }
    });
  }

  /**
   * The kernel is gone (restarted, or dead): ipywidgets' manager takes every model's comm down, and
   * the run ended with its kernel.  Each view stops its clock, drops its buttons, and says so,
   * keeping what it showed of the run.
   */
  lose(): void {
    if (this.lost) {
      return;
    }
    this.lost = true;
    const ended = performance.now(); // the run ended with its kernel: now, as far as this page can tell
    for (const view of this.views) {
      view.endClock(ended); // not the clock's last tick, up to a second (or a busy page's while) before
      view.dispose();
    }
    for (const el of this.elements) {
      markLost(el);
    }
  }

  lost = false;
  readonly elements = new Set<HTMLElement>();
  private _stoppingSeen = false;
  private _start: number | null = null;
  private _pending = false;
}

/** How far this page's clock may be ahead of a synced `elapsed` and still be the kernel's (`syncClock`). */
const CLOCKS_AGREE_S = 10;

/** What a view whose kernel went away says: the run ended with it. */
export const KERNEL_LOST = 'kernel restarted: this run ended with it';

function markLost(el: HTMLElement): void {
  const run = el.querySelector('.nbs-Run');
  run?.classList.remove('nbs-mod-live');
  el.querySelectorAll('.nbs-Stop, .nbs-Stop-hint, .nbs-Where-button, .nbs-Where').forEach(b => b.remove());
  // the ranks were running when the kernel went: they ended with it (no spinner, no "running")
  el.querySelectorAll(".nbs-Chip[data-status='running']").forEach(chip => {
    chip.setAttribute('data-status', 'lost');
    const detail = chip.querySelector('.nbs-Chip-detail');
    if (detail) {
      detail.textContent = 'ended';
    }
  });
  el.querySelector('.nbs-Header-counts')?.remove();
  const badge = el.querySelector('.nbs-Badge');
  if (badge) {
    badge.textContent = 'ended';
    badge.setAttribute('data-status', 'lost');
  }
  if (!el.querySelector('.nbs-Lost')) {
    const note = document.createElement('div');
    note.className = 'nbs-Banner nbs-Lost';
    note.setAttribute('role', 'alert');
    note.textContent = KERNEL_LOST;
    const header = el.querySelector('.nbs-Header');
    if (header) {
      header.after(note);
    } else {
      el.prepend(note);
    }
  }
}

/**
 * Model-level state per run, found again by `render` (anywidget gives `initialize` and `render`
 * different model proxies, so the run id is the key).
 */
const runs = new Map<string, LiveRun>();

function runKey(model: WidgetModel): string {
  const id = record(model.get('header')).run_id;
  return typeof id === 'string' ? id : '';
}

function initialize({ model }: { model: WidgetModel }): Cleanup {
  const key = runKey(model);
  const live = new LiveRun(model);
  runs.set(key, live);
  const onMessage = (msg: unknown) => live.onMessage(msg);
  const onHeader = () => {
    live.syncClock();
    live.onStopping();
    live.refresh();
  };
  const onChange = () => live.refresh();
  // ipywidgets' manager sets comm_live false on every model as the kernel restarts or dies
  const onCommLive = () => live.lose();
  model.on('comm_live_update', onCommLive);
  model.on('msg:custom', onMessage);
  model.on('change:header', onHeader);
  model.on('change:ranks', onChange);
  model.on('change:error', onChange);
  model.on('change:xray_html', onChange);
  // whatever was sent before this model existed (a late view, a reloaded page): the kernel's tail
  model.send({ type: 'replay' });
  return () => {
    model.off('comm_live_update', onCommLive);
    model.off('msg:custom', onMessage);
    model.off('change:header', onHeader);
    model.off('change:ranks', onChange);
    model.off('change:error', onChange);
    model.off('change:xray_html', onChange);
    if (runs.get(key) === live) {
      runs.delete(key);
    }
  };
}

function render({ model, el }: { model: WidgetModel; el: HTMLElement }): Cleanup {
  let own: Cleanup | null = null;
  if (!runs.has(runKey(model))) {
    own = initialize({ model }); // a frontend that did not call initialize
  }
  const live = runs.get(runKey(model))!;
  el.classList.add('nbs-Widget');
  const view = new LiveView(el, live);
  live.views.add(view);
  live.elements.add(el);
  keepDisplayTarget(runKey(model), el); // the classic Notebook's record of which output the run's end replaces
  return () => {
    keepDisplayTarget(runKey(model)); // a view removed while its run goes on: the cell drawn again, maybe
    view.dispose();
    live.views.delete(view);
    live.elements.delete(el);
    own?.();
  };
}

export default { initialize, render };
