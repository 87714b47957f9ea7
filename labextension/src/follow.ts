/**
 * Following a run through the kernel's messages alone, for a page that cannot get the live
 * widget's model (reloaded, or opened in a second tab, while the cell runs; see reattach.ts).
 *
 * The widget's comm messages on iopub (state updates, and the custom `output`/`replay` messages)
 * feed a `ReattachSource`, which a `LiveView` draws; the widget's state (`request_state`) and the
 * kept tail (`{type: "replay"}`) are asked for on a subshell of our own (the main shell is busy
 * running the cell).  The run's end is the `update_display_data` of the live display's id.
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';

import { ANSWER_MS, commMessage, createSubshell, deleteSubshell } from './kernel';
import {
  ILiveInfo,
  IRunBundle,
  WidgetCommData,
  WidgetRequest,
  decodeState,
  decodeWidgetComm,
  decodeWidgetMessage,
  displayUpdate,
  parseBundle,
  record
} from './messages';
import { ILiveSource, LiveOutput, applyWidgetMessage } from './output';

/** The run as the widget's comm messages tell it: state updates and output. */
export class ReattachSource implements ILiveSource {
  readonly output = new LiveOutput();
  stopRequested = false;
  header: Record<string, unknown> | null = null;
  ranks: unknown[] = [];
  error: unknown = null;
  whereText: string | null = null;

  constructor(
    private _info: ILiveInfo,
    private _send: (content: WidgetRequest) => void
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

  /** The Where button, as the widget's: the answer is a `where` message to every page (`custom`). */
  where(): void {
    this.whereText = '';
    this._send({ type: 'where' });
  }

  /** A widget state update (`{method: "update", state}`): true if it changed anything. */
  update(state: Record<string, unknown>): boolean {
    const u = decodeState(state);
    if (u.header) {
      this.header = u.header;
    }
    if (u.ranks) {
      this.ranks = u.ranks;
    }
    if ('error' in u) {
      this.error = u.error ?? null;
    }
    return Object.keys(u).length > 0;
  }

  /** A custom message of the widget (`{type: "output" | "replay" | "where", ...}`), as widget.ts reads
   * it: true if the view's chrome changed (a Where answer). */
  custom(msg: unknown): boolean {
    const m = decodeWidgetMessage(msg);
    if (m?.type === 'where') {
      this.whereText = m.text;
      return true;
    }
    applyWidgetMessage(this.output, msg);
    return false;
  }
}

/** What a `RunFollower` tells the renderer it follows the run for. */
export interface IFollowHost {
  /** Gets `data-subshell`: `own` once our subshell exists, `none` where the kernel has none. */
  readonly node: HTMLElement;
  /** The widget's state changed (`source.header` is set once it is known). */
  onState(): void;
  /** The run ended: the live display's update, the frozen run's bundle. */
  onEnd(data: Record<string, unknown>, metadata: Record<string, unknown>): void;
  /** The run cannot be followed any more (the kernel died, restarted, or does not know it). */
  onLost(why: string): void;
}

/** One run followed through a session's kernel until it is disposed. */
export class RunFollower {
  readonly source: ReattachSource;

  constructor(
    private _info: ILiveInfo,
    private _session: ISessionContext | null,
    private _host: IFollowHost
  ) {
    this.source = new ReattachSource(_info, content => this._sendComm({ method: 'custom', content }));
  }

  /** The kernel followed, once attached. */
  get kernel(): Kernel.IKernelConnection | null {
    return this._kernel;
  }

  /** Attach to the session's kernel (when it is ready) and ask for the run. */
  start(): void {
    void this._follow();
  }

  /** Once a second: whether the kernel still knows the run (asked again after a quiet while). */
  tick(): void {
    if (this._disposed || !this._kernel || this._asking) {
      return;
    }
    const now = Date.now();
    const unanswered = this._heardAt < this._askedAt;
    // a subshell answers at once, busy main shell or not; the main shell only when idle
    const answerable = this._subshell !== null || this._kernel.status !== 'busy';
    if (this._closedAt && now - this._closedAt > 2000) {
      this._host.onLost('the widget closed without the run’s end');
    } else if (unanswered && answerable && now - this._askedAt > ANSWER_MS) {
      this._host.onLost('the kernel does not know this run');
    } else if (!unanswered && answerable && now - this._heardAt > ANSWER_MS) {
      // a quiet run, or one that ended unseen: is the widget still there?
      this._askedAt = now;
      this._sendComm({ method: 'request_state' });
    }
  }

  /** Stop following: disconnect from the kernel and the session, delete our subshell. */
  dispose(): void {
    this._disposed = true;
    if (this._kernel) {
      this._kernel.iopubMessage.disconnect(this._onIOPub, this);
      this._kernel.statusChanged.disconnect(this._onStatus, this);
    }
    this._session?.kernelChanged.disconnect(this._onKernelChanged, this);
    this._kernel = null;
    this._dropSubshell();
  }

  private async _follow(): Promise<void> {
    const session = this._session;
    if (!session) {
      this._host.onLost('no kernel session');
      return;
    }
    try {
      await session.ready;
    } catch {
      // judged below
    }
    if (this._disposed) {
      return;
    }
    session.kernelChanged.connect(this._onKernelChanged, this);
    const kernel = session.session?.kernel ?? null;
    if (!kernel || kernel.isDisposed || kernel.status === 'dead') {
      this._host.onLost('the kernel is gone');
      return;
    }
    this._kernel = kernel;
    kernel.iopubMessage.connect(this._onIOPub, this);
    kernel.statusChanged.connect(this._onStatus, this);
    void this._ask(kernel);
  }

  /**
   * The widget's state and the kept tail, asked on a subshell of our own: the main shell is busy
   * running the cell (`kernel.ts`'s `subshellRequest` tells why it goes on the control channel directly).
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
    if (this._disposed || this._kernel !== kernel) {
      this._dropSubshell();
      return;
    }
    this._host.node.setAttribute('data-subshell', this._subshell === null ? 'none' : 'own');
    this._askedAt = Date.now();
    this._sendComm({ method: 'request_state' });
    this._sendComm({ method: 'custom', content: { type: 'replay' } });
  }

  private _sendComm(data: WidgetCommData): void {
    const kernel = this._kernel;
    if (!kernel || kernel.isDisposed || !this._info.model_id) {
      return;
    }
    try {
      kernel.sendShellMessage(commMessage(kernel, this._info.model_id, data, this._subshell), false, true);
    } catch {
      // the kernel went away: statusChanged tells
    }
  }

  private _onIOPub(_: Kernel.IKernelConnection, msg: KernelMessage.IIOPubMessage): void {
    const type = msg.header.msg_type;
    const content = record(msg.content);
    if (type === 'comm_msg') {
      if (content.comm_id !== this._info.model_id) {
        return;
      }
      this._heardAt = Date.now();
      const comm = decodeWidgetComm(content.data);
      if (comm?.method === 'update') {
        if (this.source.update(comm.state)) {
          this._host.onState();
        }
      } else if (comm?.method === 'custom') {
        if (this.source.custom(comm.content)) {
          this._host.onState();
        }
      }
    } else if (type === 'update_display_data') {
      const end = displayUpdate(msg, this._info.display_id);
      if (end) {
        this._host.onEnd(end.data, end.metadata);
      }
    } else if (type === 'comm_close') {
      if (content.comm_id === this._info.model_id) {
        this._closedAt = Date.now(); // the end's update_display_data came just before, if any
      }
    }
  }

  private _onStatus(kernel: Kernel.IKernelConnection): void {
    if (kernel.status === 'dead' || kernel.status === 'restarting' || kernel.status === 'autorestarting') {
      this._host.onLost(kernel.status === 'dead' ? 'the kernel died' : 'the kernel restarted');
    }
  }

  private _onKernelChanged(): void {
    this._host.onLost('the kernel changed');
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

  private _kernel: Kernel.IKernelConnection | null = null;
  private _subshell: string | null = null;
  private _subshellKernel: Kernel.IKernelConnection | null = null;
  private _heardAt = 0;
  private _askedAt = 0;
  private _closedAt = 0;
  private _asking = false;
  private _disposed = false;
}
