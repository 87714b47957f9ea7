/**
 * "nbspawn: 4 ranks running ■ Stop" in a notebook's toolbar, fed by the kernel's
 * `nbspawn.status` comm: opened at run start, one message per change, closed at the end
 * (`IRunStatus` in messages.ts).
 *
 *   open/msg data: {"run_id": "...", "status": "running", "nprocs": 4, "running": [0, 1, 2, 3]}
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { IRunStatus, STATUS_COMM_TARGET, parseStatus } from './messages';

export type { IRunStatus } from './messages';

type Listener = {
  /** `data`: a comm message's (`IRunStatus`, maybe partial); null: the comm closed. */
  update(commId: string, data: unknown): void;
  clear(): void;
};

/**
 * One comm target per kernel connection, shared by every view of that kernel (two views of a
 * notebook share a connection, and a connection has a single callback per target name).
 */
const listeners = new WeakMap<Kernel.IKernelConnection, Set<Listener>>();

function subscribe(kernel: Kernel.IKernelConnection, listener: Listener): () => void {
  let set = listeners.get(kernel);
  if (!set) {
    const subs = new Set<Listener>();
    set = subs;
    listeners.set(kernel, subs);
    const onOpen = (comm: Kernel.IComm, msg: KernelMessage.ICommOpenMsg) => {
      const id = comm.commId;
      subs.forEach(l => l.update(id, msg.content.data));
      comm.onMsg = m => subs.forEach(l => l.update(id, m.content.data));
      comm.onClose = () => subs.forEach(l => l.update(id, null));
    };
    if (kernel.handleComms) {
      kernel.registerCommTarget(STATUS_COMM_TARGET, onOpen);
    }
  }
  set.add(listener);
  return () => set.delete(listener);
}

/** The toolbar item of one notebook. Hidden unless a run is active in its kernel. */
export class RunStatusWidget extends Widget {
  constructor(sessionContext: ISessionContext) {
    super();
    this._session = sessionContext;
    this.addClass('nbs-Status');
    this.node.setAttribute('role', 'status');
    this.node.setAttribute('aria-live', 'polite');

    const dot = document.createElement('span');
    dot.className = 'nbs-Status-dot';
    dot.setAttribute('aria-hidden', 'true');
    this._label = document.createElement('span');
    this._label.className = 'nbs-Status-label';
    this._stop = document.createElement('button');
    this._stop.type = 'button';
    this._stop.className = 'nbs-Status-stop';
    this._stop.title = 'Stop the run (interrupts the kernel: every rank is stopped)';
    this._stop.addEventListener('click', () => this._onStop());
    this.node.append(dot, this._label, this._stop);

    this._listener = {
      update: (id, data) => {
        if (data === null) {
          this._runs.delete(id);
        } else {
          this._runs.set(id, parseStatus(data, this._runs.get(id)));
        }
        this._render();
      },
      clear: () => {
        this._runs.clear();
        this._render();
      }
    };
    sessionContext.kernelChanged.connect(this._onKernelChanged, this);
    sessionContext.statusChanged.connect(this._onStatus, this);
    this._onKernelChanged();
    this._render();
  }

  /** The active runs, for tests and other views. */
  get runs(): ReadonlyMap<string, IRunStatus> {
    return this._runs;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._unsubscribe?.();
    this._session.kernelChanged.disconnect(this._onKernelChanged, this);
    this._session.statusChanged.disconnect(this._onStatus, this);
    super.dispose();
  }

  private _onKernelChanged(): void {
    const kernel = this._session.session?.kernel ?? null;
    if (kernel === this._kernel) {
      return;
    }
    this._unsubscribe?.();
    this._unsubscribe = null;
    this._kernel = kernel;
    this._listener.clear();
    if (kernel) {
      this._unsubscribe = subscribe(kernel, this._listener);
    }
  }

  private _onStatus(_: ISessionContext, status: Kernel.Status): void {
    // A restart or a dead kernel ends every run; the comm target itself survives restarts.
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._listener.clear();
    }
    // the session may have swapped kernels without a kernelChanged we saw yet
    this._onKernelChanged();
  }

  private _onStop(): void {
    const kernel = this._session.session?.kernel;
    if (!kernel || this._stopping) {
      return;
    }
    this._stopping = true;
    this._render();
    kernel.interrupt().catch(() => {
      this._stopping = false;
      this._render();
    });
  }

  private _render(): void {
    const active = [...this._runs.values()].filter(r => r.status === 'running');
    if (!active.length) {
      this._stopping = false;
      this.addClass('nbs-mod-idle');
      this.node.hidden = true;
      this._label.textContent = '';
      this._stop.textContent = '';
      return;
    }
    this.removeClass('nbs-mod-idle');
    this.node.hidden = false;
    const running = active.reduce((n, r) => n + (r.running?.length ?? r.nprocs), 0);
    const total = active.reduce((n, r) => n + r.nprocs, 0);
    const ranks = `${running} rank${running === 1 ? '' : 's'}`;
    this._label.textContent =
      running < total ? `nbspawn: ${running} of ${total} ranks running` : `nbspawn: ${ranks} running`;
    this.node.title = active
      .map(r => `run ${r.run_id}: ${r.running ? `ranks ${r.running.join(', ') || '—'}` : `${r.nprocs} ranks`} running`)
      .join('\n');
    this.node.dataset.runId = active.map(r => r.run_id).join(' ');
    this._stop.disabled = this._stopping;
    this._stop.textContent = this._stopping ? '\u25a0 Stopping\u2026' : '\u25a0 Stop';
  }

  private _session: ISessionContext;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _unsubscribe: (() => void) | null = null;
  private _listener: Listener;
  private _runs = new Map<string, IRunStatus>();
  private _label: HTMLSpanElement;
  private _stop: HTMLButtonElement;
  private _stopping = false;
}
