/**
 * A `%%spawn` cell's live output on a page that was reloaded (or opened in a second tab) mid-run.
 *
 * The live display's bundle carries, beside the widget view, `application/vnd.nbspawn.live+json`
 * (`{run_id, model_id, display_id, started_at, nprocs}`, docs/run-bundle.md §3).  This renderer
 * wins over the widget-view renderer and normally just shows the live widget (it delegates to
 * it).  But a page loaded while the kernel's main shell runs the cell cannot get the widget's
 * model (the widget manager's `comm_info_request` waits for the cell to end, and then the model
 * is gone), and does not know the cell's display id, so the run's end would never appear.  Then
 * this renderer:
 *
 * - shows "nbspawn run <id> — running for N s; reattaching…", never an error;
 * - follows the run through the kernel's messages (`RunFollower`, follow.ts); once it has the
 *   run's header the placeholder becomes the live view (its Stop button works too);
 * - when the `update_display_data` for the live display's id arrives, draws the frozen run and
 *   puts that bundle into the output's model, so the notebook saves the snapshot;
 * - when the kernel is gone, restarted, or answers nothing about the run, says that the run's
 *   end was not recorded (and where its logs are) instead of waiting forever.
 *
 * Its Stop clicks (the widget's or its own view's) are followed by `StopClicks` (stopguard.ts).
 *
 * The notebook file need not hold the live display: the kernel remembers each cell's latest run
 * (`nbspawn/views/_active.py`), and `CellRuns` asks for them when a notebook connects to its
 * kernel: a cell whose run is still going gets its live display (drawn here, reattaching), a cell
 * whose run ended since the file was saved gets the frozen run.  A run that this renderer follows
 * and that ends unseen is looked up there too before it is said to be lost.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { Panel, Widget } from '@lumino/widgets';

import { RunFollower } from './follow';
import { formatElapsed } from './format';
import { askActive, usable } from './kernel';
import {
  ILiveInfo,
  LIVE_MIME_TYPE,
  RUN_MIME_TYPE,
  WIDGET_VIEW_MIME_TYPE,
  displayUpdate,
  parseLiveInfo
} from './messages';
import { StopClicks } from './stopguard';
import { LiveView } from './view';

/** Beats the widget-view renderer (`@jupyter-widgets/jupyterlab-manager` registers it at -10). */
export const LIVE_RANK = -20;

/** How long the widget may show "Loading widget..." before the placeholder replaces it. */
const LOADING_MS = 1000;
/** How long a widget view that did start may take to draw the run. */
const DRAWING_MS = 6000;
/** The part of a notebook's rendermime registry used here (`@jupyterlab/rendermime`). */
export interface IRendermime {
  createRenderer(mimeType: string): IRenderMime.IRenderer;
  addFactory(factory: IRenderMime.IRendererFactory, rank?: number): void;
}

type Mode = 'delegate' | 'waiting' | 'live' | 'frozen' | 'lost';

/**
 * The renderer of `application/vnd.nbspawn.live+json` in one notebook: the widget while it can
 * be shown, else a placeholder that reattaches to the run through the kernel's messages.
 */
export class ReattachRenderer extends Panel implements IRenderMime.IRenderer {
  constructor(
    options: IRenderMime.IRendererOptions,
    private _rendermime: IRendermime,
    private _session: ISessionContext | null
  ) {
    super();
    this.addClass('nbs-Reattach');
    this._own = new Widget();
    this._own.addClass('nbs-Reattach-own');
    this._own.hide();
    this.addWidget(this._own);
    // the live view's Stop (the widget's, or ours), seen before the view's own handler
    this._stop = new StopClicks(this.node, () => {
      const info = this._info;
      if ((this._mode !== 'delegate' && this._mode !== 'live') || !info) {
        return null;
      }
      const kernel = this._follower?.kernel ?? this._session?.session?.kernel ?? null;
      return { kernel, modelId: info.model_id, displayId: info.display_id };
    });
  }

  get mode(): Mode {
    return this._mode;
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this._model = model;
    const info = parseLiveInfo(model.data[LIVE_MIME_TYPE]);
    if (this._info && info && this._info.display_id === info.display_id && this._delegate) {
      return this._delegate.renderModel(model); // the same live display again
    }
    this._reset();
    this._info = info;
    if (!info) {
      return;
    }
    this.node.setAttribute('data-run-id', info.run_id);
    if (model.data[WIDGET_VIEW_MIME_TYPE] !== undefined && model.trusted) {
      try {
        this._delegate = this._rendermime.createRenderer(WIDGET_VIEW_MIME_TYPE);
      } catch {
        this._delegate = null; // no widget manager in this frontend
      }
    }
    if (!this._delegate) {
      this._fallBack();
      return;
    }
    this._mode = 'delegate';
    this.insertWidget(0, this._delegate);
    // at once, until the widget draws the run (at once on the page that runs the cell; on a page
    // loaded mid-run, never) or this page reattaches: which run, and for how long, not a blank
    this._delegate.hide();
    this._own.show();
    this._drawPlaceholder();
    this._ticker = window.setInterval(() => this._tick(), 1000);
    this._watchEnd();
    this._watchDelegate();
    try {
      await this._delegate.renderModel(model);
    } catch {
      this._fallBack();
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._reset();
    super.dispose();
  }

  // -- the widget --------------------------------------------------------------------------------

  /** The delegate's state: shows the run, failed, or not yet known. */
  private _delegateState(): 'shown' | 'failed' | 'loading' | 'drawing' {
    const node = this._delegate?.node;
    if (!node) {
      return 'failed';
    }
    if (node.querySelector('.nbs-Run')) {
      return 'shown';
    }
    const text = (node.textContent ?? '').trim();
    if (text.startsWith('Error displaying widget')) {
      return 'failed';
    }
    if (text === '' && !node.firstElementChild) {
      return 'loading';
    }
    return text.startsWith('Loading widget') ? 'loading' : 'drawing';
  }

  private _watchDelegate(): void {
    const node = this._delegate!.node;
    const since = Date.now();
    const check = () => {
      if (this.isDisposed || this._mode === 'frozen') {
        return;
      }
      const state = this._delegateState();
      if (state === 'shown') {
        this._backToDelegate(); // the placeholder (and whatever this page followed) goes
        // the widget shows the run: stop watching its subtree, which a flood rewrites every frame
        this._observer?.disconnect();
        this._observer = null;
        if (this._delegateTimer !== null) {
          window.clearInterval(this._delegateTimer);
          this._delegateTimer = null;
        }
        return;
      }
      if (this._mode !== 'delegate') {
        return;
      }
      const waited = Date.now() - since;
      if (state === 'failed' || (state === 'loading' && waited >= LOADING_MS) || waited >= DRAWING_MS) {
        this._fallBack();
      }
    };
    this._observer = new MutationObserver(check);
    this._observer.observe(node, { childList: true, subtree: true, characterData: true });
    this._delegateTimer = window.setInterval(check, 250);
  }

  /**
   * While the widget may still show: the run's end, if it comes before the widget shows or fails
   * (a page loaded in the run's last second), so that a fallback after it freezes at once.  A page
   * whose output area ran the cell replaces this output itself.
   */
  private _watchEnd(): void {
    const session = this._session;
    const connect = () => {
      const kernel = session?.session?.kernel ?? null;
      if (kernel && !this.isDisposed && this._endKernel === null && this._mode === 'delegate') {
        this._endKernel = kernel;
        kernel.iopubMessage.connect(this._onEnd, this);
      }
    };
    if (session?.session?.kernel) {
      connect();
    } else {
      void session?.ready.then(connect, () => undefined);
    }
  }

  private _onEnd(_: Kernel.IKernelConnection, msg: KernelMessage.IIOPubMessage): void {
    const end = displayUpdate(msg, this._info?.display_id);
    if (end) {
      this._ended = end;
    }
  }

  private _unwatchEnd(): void {
    this._endKernel?.iopubMessage.disconnect(this._onEnd, this);
    this._endKernel = null;
  }

  /** The widget drew the run after all: it is the live view, this page follows nothing itself. */
  private _backToDelegate(): void {
    this._follower?.dispose();
    this._follower = null;
    if (this._ticker !== null) {
      window.clearInterval(this._ticker);
      this._ticker = null;
    }
    this._view?.dispose();
    this._view = null;
    this._own.hide();
    // gone, not only hidden: a stale "running for N s" (a status role) is no text of this output's
    this._own.node.querySelector('.nbs-Reattach-placeholder')?.remove();
    this._delegate?.show();
    this._mode = 'delegate';
    this.node.setAttribute('data-mode', 'delegate');
  }

  // -- reattaching ------------------------------------------------------------------------------

  private _fallBack(): void {
    if (this._mode !== 'delegate' && this._mode !== 'waiting') {
      return;
    }
    this._unwatchEnd();
    this._delegate?.hide();
    this._own.show();
    this._setMode('waiting');
    if (this._ended) {
      this._freeze(this._ended.data, this._ended.metadata); // it ended before the widget failed
      return;
    }
    if (!this._follower) {
      this._follower = new RunFollower(this._info!, this._session, {
        node: this.node,
        onState: () => this._onState(),
        onEnd: (data, metadata) => this._freeze(data, metadata),
        onLost: why => this._lose(why)
      });
      this._drawPlaceholder();
      if (this._ticker === null) {
        this._ticker = window.setInterval(() => this._tick(), 1000);
      }
      this._follower.start();
    }
  }

  private _setMode(mode: Mode): void {
    this._mode = mode;
    this.node.setAttribute('data-mode', mode);
  }

  private _onState(): void {
    const source = this._follower!.source;
    if (this._mode === 'waiting' && source.header) {
      this._setMode('live');
      this._own.node.textContent = '';
      this._view = new LiveView(this._own.node, source);
    } else if (this._view) {
      this._view.refresh();
    }
  }

  /** Once a second: the placeholder's clock, and whether the kernel still knows the run. */
  private _tick(): void {
    if (this.isDisposed) {
      return;
    }
    if (this._mode === 'waiting' || this._mode === 'delegate') {
      this._drawPlaceholder(); // the widget has not drawn the run yet, or never will
    }
    if (this._mode === 'waiting' || this._mode === 'live') {
      this._follower?.tick();
    }
  }

  private _drawPlaceholder(): void {
    const info = this._info!;
    const started = this._follower?.source.header?.started_at ?? info.started_at;
    const secs = typeof started === 'number' ? Date.now() / 1000 - started : null;
    const ranks = info.nprocs ? `${info.nprocs} rank${info.nprocs === 1 ? '' : 's'}, ` : '';
    const text =
      `nbspawn run ${info.run_id} — ${ranks}running` +
      (secs !== null ? ` for ${formatElapsed(secs)}` : '') +
      (this._mode === 'waiting' ? '; reattaching…' : ''); // not before this page follows the run itself
    let box = this._own.node.querySelector<HTMLElement>('.nbs-Reattach-placeholder');
    if (!box) {
      this._own.node.textContent = '';
      box = document.createElement('div');
      box.className = 'nbs-Reattach-placeholder';
      box.setAttribute('role', 'status');
      box.style.cssText =
        'padding: 6px 10px; border-left: 3px solid var(--jp-brand-color1, #1976d2); ' +
        'font-family: var(--jp-code-font-family, monospace); font-size: var(--jp-code-font-size, 13px); ' +
        'color: var(--jp-ui-font-color1, #222); background: var(--jp-layout-color2, #eee);';
      this._own.node.appendChild(box);
    }
    if (box.textContent !== text) {
      box.textContent = text;
    }
  }

  /** The run ended: draw its snapshot and put it in the output, so the notebook saves it. */
  private _freeze(data: Record<string, unknown>, metadata: Record<string, unknown>): void {
    // the kernel's update_display_data: JSON, as a mime model holds it
    const bundle = data as IRenderMime.IMimeModel['data'];
    const meta = metadata as IRenderMime.IMimeModel['metadata'];
    if (this._mode === 'frozen' || this._mode === 'delegate') {
      return; // a page showing the widget gets the update from its own cell's execution
    }
    this._setMode('frozen');
    this._stopFollowing();
    this._view?.dispose();
    this._view = null;
    this._own.node.textContent = '';
    if (data[RUN_MIME_TYPE] !== undefined) {
      try {
        const renderer = this._rendermime.createRenderer(RUN_MIME_TYPE);
        this._frozen = renderer;
        this._own.node.appendChild(renderer.node);
        void renderer.renderModel({
          trusted: true,
          data: bundle,
          metadata: meta,
          setData: () => undefined
        });
      } catch {
        const plain = data['text/plain'];
        this._own.node.textContent = typeof plain === 'string' ? plain : '';
      }
    }
    // the output area draws the frozen bundle in this output's place (this renderer goes)
    this._model?.setData({ data: bundle, metadata: meta });
  }

  private _lose(why: string): void {
    if ((this._mode !== 'waiting' && this._mode !== 'live') || this._lookingUp) {
      return;
    }
    const info = this._info!;
    const kernel = this._follower?.kernel ?? null;
    if (!this._lookedUp && usable(kernel) && LOOK_UP.includes(why)) {
      // the run may have ended unseen (before this page followed it): the kernel may keep its end
      this._lookingUp = true;
      void askActive(kernel, { only: [info.run_id] }).then(runs => {
        this._lookingUp = false;
        this._lookedUp = true;
        if (this.isDisposed || this._info !== info) {
          return;
        }
        const frozen = runs?.find(r => r.run_id === info.run_id && r.frozen)?.frozen;
        if (frozen) {
          this._freeze(frozen, {});
        } else {
          this._lose(why);
        }
      });
      return;
    }
    const header = this._follower?.source.header;
    const logDir =
      (typeof header?.log_dir === 'string' && header.log_dir) ||
      info.log_dir ||
      `…/${info.run_id}/`;
    this._setMode('lost');
    this.node.setAttribute('data-why', why);
    this._stopFollowing();
    const note = document.createElement('div');
    note.className = 'nbs-Reattach-lost';
    note.style.cssText =
      'padding: 6px 10px; border-left: 3px solid var(--jp-warn-color1, #f57c00); ' +
      'font-family: var(--jp-ui-font-family, sans-serif); color: var(--jp-ui-font-color1, #222);';
    note.textContent =
      `nbspawn run ${info.run_id}: this run's live view was saved while it ran; ` +
      `its end was not recorded (logs: ${logDir}).`;
    // what was seen of the run stays, under the note
    this._own.node.querySelector('.nbs-Reattach-placeholder')?.remove();
    this._own.node.insertBefore(note, this._own.node.firstChild);
    if (this._view) {
      if (why === 'the kernel died' || why === 'the kernel restarted') {
        this._view.endClock(performance.now()); // the run ended with its kernel, now
      }
      this._view.dispose();
      this._view = null;
      this._own.node.querySelector('.nbs-Run')?.classList.remove('nbs-mod-live');
      this._own.node.querySelectorAll('.nbs-Stop').forEach(b => b.remove()); // nothing to stop now
    }
  }

  private _stopFollowing(): void {
    this._follower?.dispose();
    this._unwatchEnd();
    if (this._ticker !== null) {
      window.clearInterval(this._ticker);
      this._ticker = null;
    }
    this._observer?.disconnect();
    this._observer = null;
    if (this._delegateTimer !== null) {
      window.clearInterval(this._delegateTimer);
      this._delegateTimer = null;
    }
  }

  private _reset(): void {
    this._stop.reset();
    this._stopFollowing();
    this._view?.dispose();
    this._view = null;
    this._frozen?.dispose();
    this._frozen = null;
    if (this._delegate) {
      this._delegate.dispose();
      this._delegate = null;
    }
    this._follower = null;
    this._own.node.textContent = '';
    this._own.hide();
    this._mode = 'delegate';
    this._ended = null;
    this._lookedUp = false;
  }

  private _own: Widget;
  private _model: IRenderMime.IMimeModel | null = null;
  private _info: ILiveInfo | null = null;
  private _delegate: IRenderMime.IRenderer | null = null;
  private _frozen: IRenderMime.IRenderer | null = null;
  private _mode: Mode = 'delegate';
  private _follower: RunFollower | null = null;
  private _view: LiveView | null = null;
  private _stop: StopClicks;
  private _observer: MutationObserver | null = null;
  private _delegateTimer: number | null = null;
  private _ticker: number | null = null;
  private _endKernel: Kernel.IKernelConnection | null = null;
  private _ended: { data: Record<string, unknown>; metadata: Record<string, unknown> } | null = null;
  private _lookingUp = false;
  private _lookedUp = false;
}

/** `RunFollower`'s reasons after which the kernel's remembered end of the run is looked up. */
const LOOK_UP = ['the kernel does not know this run', 'the widget closed without the run’s end'];

/** The factory for one notebook: its rendermime (for the widget and run renderers) and kernel. */
export function reattachFactory(
  rendermime: IRendermime,
  session: ISessionContext | null
): IRenderMime.IRendererFactory {
  return {
    // draws only text of its own, the widget only in trusted outputs (as the widget renderer)
    safe: true,
    mimeTypes: [LIVE_MIME_TYPE],
    defaultRank: LIVE_RANK,
    createRenderer: options => new ReattachRenderer(options, rendermime, session)
  };
}
