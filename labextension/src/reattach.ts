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
 * - follows the widget's comm messages on the kernel's iopub (state updates and the custom
 *   `output`/`replay` messages) and asks the kernel, on a subshell of its own, for the widget's
 *   state (`request_state`) and the kept tail (`{type: "replay"}`); once it has the run's header
 *   the placeholder becomes the live view (its Stop button works too);
 * - when the `update_display_data` for the live display's id arrives, draws the frozen run and
 *   puts that bundle into the output's model, so the notebook saves the snapshot;
 * - when the kernel is gone, restarted, or answers nothing about the run, says that the run's
 *   end was not recorded (and where its logs are) instead of waiting forever.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { Panel, Widget } from '@lumino/widgets';

import { IRunBundle, RUN_MIME_TYPE, parseBundle, record } from './bundle';
import { ILiveSource, LiveOutput, LiveView, formatElapsed } from './live';
import { StopGuard, deleteSubshell } from './stopguard';

export const LIVE_MIME_TYPE = 'application/vnd.nbspawn.live+json';
export const WIDGET_VIEW_MIME_TYPE = 'application/vnd.jupyter.widget-view+json';
/** Beats the widget-view renderer (`@jupyter-widgets/jupyterlab-manager` registers it at -10). */
export const LIVE_RANK = -20;

/** How long the widget may show "Loading widget..." before the placeholder replaces it. */
const LOADING_MS = 1000;
/** How long a widget view that did start may take to draw the run. */
const DRAWING_MS = 6000;
/** How long the kernel may leave our questions about the run unanswered. */
const ANSWER_MS = 5000;

/** The part of a notebook's rendermime registry used here (`@jupyterlab/rendermime`). */
export interface IRendermime {
  createRenderer(mimeType: string): IRenderMime.IRenderer;
  addFactory(factory: IRenderMime.IRendererFactory, rank?: number): void;
}

/** What the live display says about its run. */
export interface ILiveInfo {
  run_id: string;
  model_id: string;
  display_id: string;
  started_at: number | null;
  nprocs: number | null;
  log_dir?: string;
}

export function parseLiveInfo(data: unknown): ILiveInfo | null {
  const d = record(data);
  const str = (v: unknown) => (typeof v === 'string' ? v : '');
  const num = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
  if (!str(d.model_id) && !str(d.display_id)) {
    return null;
  }
  return {
    run_id: str(d.run_id),
    model_id: str(d.model_id),
    display_id: str(d.display_id),
    started_at: num(d.started_at),
    nprocs: num(d.nprocs),
    log_dir: str(d.log_dir) || undefined
  };
}

/** A new subshell of `kernel` (JEP 91), or null if it has none (no answer in `ANSWER_MS`). */
async function createSubshell(kernel: Kernel.IKernelConnection): Promise<string | null> {
  let future: Kernel.IControlFuture | null = null;
  let timer = 0;
  try {
    const msg = KernelMessage.createMessage({
      msgType: 'create_subshell_request',
      channel: 'control',
      username: kernel.username,
      session: kernel.clientId,
      content: {}
    });
    future = kernel.sendControlMessage(msg, true, true);
    const timeout = new Promise<null>(resolve => (timer = window.setTimeout(() => resolve(null), ANSWER_MS + 3000)));
    const reply = await Promise.race([future.done, timeout]);
    const id = record(reply?.content).subshell_id;
    return typeof id === 'string' && id ? id : null;
  } catch {
    return null;
  } finally {
    window.clearTimeout(timer);
    if (future && !future.isDisposed) {
      future.dispose();
    }
  }
}

/** The run as the widget's comm messages tell it: state updates and output. */
class ReattachSource implements ILiveSource {
  readonly output = new LiveOutput();
  stopRequested = false;
  header: Record<string, unknown> | null = null;
  ranks: unknown[] = [];
  error: unknown = null;

  constructor(
    private _info: ILiveInfo,
    private _send: (content: unknown) => void
  ) {}

  run(): IRunBundle {
    return parseBundle({ ...(this.header ?? {}), error: this.error ?? null, ranks: this.ranks });
  }

  get stopAcknowledged(): boolean {
    return this.header?.stopping === true;
  }

  startedAt(): number | null {
    // the kernel's epoch start: a synced `elapsed` may be seconds old when request_state answers
    const started = typeof this.header?.started_at === 'number' ? this.header.started_at : this._info.started_at;
    return started === null ? null : performance.now() - (Date.now() - started * 1000);
  }

  stop(): void {
    this.stopRequested = true;
    this._send({ type: 'stop' });
  }

  /** A widget state update (`{method: "update", state}`): true if it changed anything. */
  update(state: Record<string, unknown>): boolean {
    let changed = false;
    if ('header' in state && state.header && typeof state.header === 'object') {
      this.header = record(state.header);
      changed = true;
    }
    if ('ranks' in state && Array.isArray(state.ranks)) {
      this.ranks = state.ranks;
      changed = true;
    }
    if ('error' in state) {
      this.error = state.error ?? null;
      changed = true;
    }
    return changed;
  }

  /** A custom message of the widget (`{type: "output" | "replay", ...}`), as widget.ts reads it. */
  custom(msg: unknown): void {
    const m = record(msg);
    if (m.type === 'output' && Array.isArray(m.chunks)) {
      // only queued here: parsed in animation frames, a budget at a time
      this.output.feed(m.chunks as [number, string, unknown][], record(m.elided) as Record<string, number>);
    } else if (m.type === 'replay') {
      this.output.reset(
        record(m.tails) as Record<string, [string, unknown][]>,
        record(m.elided) as Record<string, number>
      );
    }
  }
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
    // the live view's Stop (the widget's, or ours), seen before the view's own handler: StopGuard
    this.node.addEventListener('pointerover', this._onStopHover, true);
    this.node.addEventListener('click', this._onStopClick, true);
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

  // -- Stop that always arrives (stopguard.ts) ---------------------------------------------------

  private _stopKernel(): Kernel.IKernelConnection | null {
    const kernel = this._kernel ?? this._session?.session?.kernel ?? null;
    return kernel && !kernel.isDisposed && kernel.status !== 'dead' ? kernel : null;
  }

  /** A subshell for Stop, asked for as soon as the pointer is on the button (a click may come). */
  private _stopShell(kernel: Kernel.IKernelConnection): Promise<string | null> {
    if (this._stopShellKernel !== kernel || this._stopShellId === null) {
      this._dropStopShell();
      this._stopShellKernel = kernel;
      this._stopShellId = createSubshell(kernel);
    }
    return this._stopShellId;
  }

  private _dropStopShell(): void {
    const kernel = this._stopShellKernel;
    const pending = this._stopShellId;
    this._stopShellKernel = null;
    this._stopShellId = null;
    if (kernel && pending) {
      void pending.then(id => deleteSubshell(kernel, id));
    }
  }

  private _isStop(ev: Event): boolean {
    const btn = (ev.target as Element | null)?.closest?.('.nbs-Stop') as HTMLButtonElement | null;
    return (
      !!btn &&
      !btn.disabled &&
      (this._mode === 'delegate' || this._mode === 'live') &&
      !!this._info?.model_id &&
      !btn.closest('.nbs-Run:not(.nbs-mod-live)')
    );
  }

  private _onStopHover = (ev: Event): void => {
    const kernel = this._isStop(ev) ? this._stopKernel() : null;
    if (kernel) {
      void this._stopShell(kernel);
    }
  };

  private _onStopClick = (ev: Event): void => {
    const kernel = this._isStop(ev) ? this._stopKernel() : null;
    if (!kernel || this._stopGuard) {
      return;
    }
    this.node.setAttribute('data-stop', 'waiting');
    const guard: StopGuard = new StopGuard(
      kernel,
      this._info!.model_id,
      this._info!.display_id,
      this._stopShell(kernel),
      outcome => {
        if (this._stopGuard === guard) {
          this._stopGuard = null;
        }
        if (!this.isDisposed) {
          this.node.setAttribute('data-stop', outcome);
        }
      }
    );
    this._stopGuard = guard;
  };

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
        if (this._mode !== 'delegate') {
          this._backToDelegate();
        }
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
    if (msg.header.msg_type === 'update_display_data') {
      const content = msg.content as KernelMessage.IUpdateDisplayDataMsg['content'];
      const transient = record((content as { transient?: unknown }).transient);
      if (this._info?.display_id && transient.display_id === this._info.display_id) {
        this._ended = { data: record(content.data), metadata: record(content.metadata) };
      }
    }
  }

  private _unwatchEnd(): void {
    this._endKernel?.iopubMessage.disconnect(this._onEnd, this);
    this._endKernel = null;
  }

  /** The widget drew the run after all: it is the live view, this page follows nothing itself. */
  private _backToDelegate(): void {
    this._unfollow();
    if (this._ticker !== null) {
      window.clearInterval(this._ticker);
      this._ticker = null;
    }
    this._view?.dispose();
    this._view = null;
    this._source = null;
    this._own.hide();
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
    if (!this._source) {
      this._source = new ReattachSource(this._info!, content => this._sendCustom(content));
      this._drawPlaceholder();
      this._ticker = window.setInterval(() => this._tick(), 1000);
      void this._follow();
    }
  }

  private _setMode(mode: Mode): void {
    this._mode = mode;
    this.node.setAttribute('data-mode', mode);
  }

  private async _follow(): Promise<void> {
    const session = this._session;
    if (!session) {
      this._lose('no kernel session');
      return;
    }
    try {
      await session.ready;
    } catch {
      // judged below
    }
    if (this.isDisposed || this._mode !== 'waiting') {
      return;
    }
    session.kernelChanged.connect(this._onKernelChanged, this);
    const kernel = session.session?.kernel ?? null;
    if (!kernel || kernel.isDisposed || kernel.status === 'dead') {
      this._lose('the kernel is gone');
      return;
    }
    this._attach(kernel);
  }

  private _attach(kernel: Kernel.IKernelConnection): void {
    this._kernel = kernel;
    kernel.iopubMessage.connect(this._onIOPub, this);
    kernel.statusChanged.connect(this._onStatus, this);
    void this._ask(kernel);
  }

  /**
   * The widget's state and the kept tail, asked on a subshell of our own: the main shell is busy
   * running the cell.  A page connected mid-run has no `kernel_info_reply` yet (that request waits
   * for the main shell), so the services do not know that the kernel has subshells: the
   * `create_subshell_request` goes on the control channel directly, and no answer means none.
   */
  private async _ask(kernel: Kernel.IKernelConnection): Promise<void> {
    this._asking = true;
    if (this._subshell === null) {
      const id = await createSubshell(kernel);
      if (id !== null) {
        this._subshell = id;
        this._subshellKernel = kernel;
      }
    }
    this._asking = false;
    if (this.isDisposed || this._kernel !== kernel || this._mode === 'frozen' || this._mode === 'lost') {
      this._dropSubshell();
      return;
    }
    this.node.setAttribute('data-subshell', this._subshell === null ? 'none' : 'own');
    this._askedAt = Date.now();
    this._sendComm({ method: 'request_state' });
    this._sendComm({ method: 'custom', content: { type: 'replay' } });
  }

  private _sendCustom(content: unknown): void {
    this._sendComm({ method: 'custom', content });
  }

  private _sendComm(data: Record<string, unknown>): void {
    const kernel = this._kernel;
    const info = this._info;
    if (!kernel || kernel.isDisposed || !info?.model_id) {
      return;
    }
    const msg = KernelMessage.createMessage({
      msgType: 'comm_msg',
      channel: 'shell',
      username: kernel.username,
      session: kernel.clientId,
      subshellId: this._subshell,
      content: { comm_id: info.model_id, data: data as any }
    });
    try {
      kernel.sendShellMessage(msg, false, true);
    } catch {
      // the kernel went away: statusChanged tells
    }
  }

  private _onIOPub(_: Kernel.IKernelConnection, msg: KernelMessage.IIOPubMessage): void {
    const type = msg.header.msg_type;
    if (type === 'comm_msg') {
      const content = msg.content as KernelMessage.ICommMsgMsg['content'];
      if (content.comm_id !== this._info?.model_id) {
        return;
      }
      this._heardAt = Date.now();
      const data = record(content.data);
      if (data.method === 'update') {
        if (this._source!.update(record(data.state))) {
          this._onState();
        }
      } else if (data.method === 'custom') {
        this._source!.custom(data.content);
      }
    } else if (type === 'update_display_data') {
      const content = msg.content as KernelMessage.IUpdateDisplayDataMsg['content'];
      const transient = record((content as { transient?: unknown }).transient);
      if (transient.display_id === this._info?.display_id && this._info?.display_id) {
        this._freeze(record(content.data), record(content.metadata));
      }
    } else if (type === 'comm_close') {
      const content = msg.content as KernelMessage.ICommCloseMsg['content'];
      if (content.comm_id === this._info?.model_id) {
        this._closedAt = Date.now(); // the end's update_display_data came just before, if any
      }
    }
  }

  private _onState(): void {
    const source = this._source!;
    if (this._mode === 'waiting' && source.header) {
      this._setMode('live');
      this._own.node.textContent = '';
      this._view = new LiveView(this._own.node, source);
    } else if (this._view) {
      this._view.refresh();
    }
  }

  private _onStatus(kernel: Kernel.IKernelConnection): void {
    if (kernel.status === 'dead' || kernel.status === 'restarting' || kernel.status === 'autorestarting') {
      this._lose(kernel.status === 'dead' ? 'the kernel died' : 'the kernel restarted');
    }
  }

  private _onKernelChanged(): void {
    if (this._mode === 'waiting' || this._mode === 'live') {
      this._lose('the kernel changed');
    }
  }

  /** Once a second: the placeholder's clock, and whether the kernel still knows the run. */
  private _tick(): void {
    if (this.isDisposed) {
      return;
    }
    if (this._mode === 'waiting') {
      this._drawPlaceholder();
    }
    if ((this._mode !== 'waiting' && this._mode !== 'live') || !this._kernel || this._asking) {
      return;
    }
    const now = Date.now();
    const unanswered = this._heardAt < this._askedAt;
    // a subshell answers at once, busy main shell or not; the main shell only when idle
    const answerable = this._subshell !== null || this._kernel.status !== 'busy';
    if (this._closedAt && now - this._closedAt > 2000) {
      this._lose('the widget closed without the run’s end');
    } else if (unanswered && answerable && now - this._askedAt > ANSWER_MS) {
      this._lose('the kernel does not know this run');
    } else if (!unanswered && answerable && now - this._heardAt > ANSWER_MS) {
      // a quiet run, or one that ended unseen: is the widget still there?
      this._askedAt = now;
      this._sendComm({ method: 'request_state' });
    }
  }

  private _drawPlaceholder(): void {
    const info = this._info!;
    const started = this._source?.header?.started_at ?? info.started_at;
    const secs = typeof started === 'number' ? Date.now() / 1000 - started : null;
    const ranks = info.nprocs ? `${info.nprocs} rank${info.nprocs === 1 ? '' : 's'}, ` : '';
    const text =
      `nbspawn run ${info.run_id} — ${ranks}running` +
      (secs !== null ? ` for ${formatElapsed(secs)}` : '') +
      '; reattaching…';
    let box = this._own.node.querySelector('.nbs-Reattach-placeholder') as HTMLElement | null;
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
          data: data as any,
          metadata: metadata as any,
          setData: () => undefined
        });
      } catch {
        this._own.node.textContent = String(data['text/plain'] ?? '');
      }
    }
    // the output area draws the frozen bundle in this output's place (this renderer goes)
    this._model?.setData({ data: data as any, metadata: metadata as any });
  }

  private _lose(why: string): void {
    if (this._mode !== 'waiting' && this._mode !== 'live') {
      return;
    }
    const info = this._info!;
    const logDir =
      (typeof this._source?.header?.log_dir === 'string' && this._source.header.log_dir) ||
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
      this._view.dispose();
      this._view = null;
      this._own.node.querySelector('.nbs-Run')?.classList.remove('nbs-mod-live');
      this._own.node.querySelectorAll('.nbs-Stop').forEach(b => b.remove()); // nothing to stop now
    }
  }

  private _stopFollowing(): void {
    this._unfollow();
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

  private _unfollow(): void {
    if (this._kernel) {
      this._kernel.iopubMessage.disconnect(this._onIOPub, this);
      this._kernel.statusChanged.disconnect(this._onStatus, this);
    }
    this._session?.kernelChanged.disconnect(this._onKernelChanged, this);
    this._kernel = null;
    this._dropSubshell();
  }

  private _dropSubshell(): void {
    const kernel = this._subshellKernel;
    const id = this._subshell;
    this._subshell = null;
    this._subshellKernel = null;
    if (kernel) {
      deleteSubshell(kernel, id);
    }
  }

  private _reset(): void {
    this._stopGuard?.dispose();
    this._stopGuard = null;
    this._dropStopShell();
    this._stopFollowing();
    this._view?.dispose();
    this._view = null;
    this._frozen?.dispose();
    this._frozen = null;
    if (this._delegate) {
      this._delegate.dispose();
      this._delegate = null;
    }
    this._source = null;
    this._own.node.textContent = '';
    this._own.hide();
    this._mode = 'delegate';
    this._heardAt = 0;
    this._askedAt = 0;
    this._closedAt = 0;
    this._ended = null;
  }

  private _own: Widget;
  private _model: IRenderMime.IMimeModel | null = null;
  private _info: ILiveInfo | null = null;
  private _delegate: IRenderMime.IRenderer | null = null;
  private _frozen: IRenderMime.IRenderer | null = null;
  private _mode: Mode = 'delegate';
  private _source: ReattachSource | null = null;
  private _view: LiveView | null = null;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _subshell: string | null = null;
  private _subshellKernel: Kernel.IKernelConnection | null = null;
  private _observer: MutationObserver | null = null;
  private _delegateTimer: number | null = null;
  private _ticker: number | null = null;
  private _heardAt = 0;
  private _askedAt = 0;
  private _closedAt = 0;
  private _asking = false;
  private _endKernel: Kernel.IKernelConnection | null = null;
  private _ended: { data: Record<string, unknown>; metadata: Record<string, unknown> } | null = null;
  private _stopGuard: StopGuard | null = null;
  private _stopShellId: Promise<string | null> | null = null;
  private _stopShellKernel: Kernel.IKernelConnection | null = null;
}

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
