/**
 * Stop that always arrives (JupyterLab and Notebook 7 with this extension: `StopClicks` watches the
 * live view's Stop button in the reattaching renderer, reattach.ts).
 *
 * The widget's own `{type: "stop"}` comm message goes first (the run then ends "stopped"), but a
 * frontend may hold it back while the cell runs (Notebook 7 sends comm messages on the busy main
 * shell).  So the same message also goes on a subshell of our own (handled at once, busy main
 * shell or not).  Where the kernel has no subshells, and it has not said it is stopping
 * (`header.stopping`) nor ended the run within `STOP_ACK_MS` of the click, the kernel is
 * interrupted, which stops every rank as well (the run then ends "interrupted").  Where our copy
 * went on a subshell, the interrupt waits `STOP_SENT_ACK_MS` for any sign that the kernel heard:
 * under a flood the answer queues behind output on the page's one websocket, and an interrupt
 * that lands after the kernel began stopping kills the ranks (a second interrupt), or, after the
 * run ended, interrupts the cell before it shows the frozen run.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';

import { commMessage, createSubshell, deleteSubshell, usable } from './kernel';
import { stopHeard } from './messages';

/** How long a Stop may go unheard by a kernel without subshells before it is interrupted. */
export const STOP_ACK_MS = 300;
/** The same, once our copy of the Stop went on a subshell (it is handled at once). */
export const STOP_SENT_ACK_MS = 3000;

export type StopOutcome = 'waiting' | 'heard' | 'interrupted';

/** One click on Stop, followed until the kernel has heard it (or has been interrupted). */
export class StopGuard {
  /**
   * `modelId`: the widget's comm; `displayId`: the live display (its update is the run's end);
   * `subshell`: where our copy of the message goes (null: none, only the interrupt can help).
   */
  constructor(
    private _kernel: Kernel.IKernelConnection,
    private _modelId: string,
    private _displayId: string,
    subshell: Promise<string | null>,
    private _onDone: (outcome: StopOutcome) => void
  ) {
    _kernel.iopubMessage.connect(this._onIOPub, this);
    this._timer = window.setTimeout(() => this._fallBack(), STOP_ACK_MS);
    void subshell.then(id => this._send(id));
  }

  get outcome(): StopOutcome {
    return this._outcome;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    window.clearTimeout(this._timer);
    this._kernel.iopubMessage.disconnect(this._onIOPub, this);
    this._onDone(this._outcome);
  }

  private _send(id: string | null): void {
    const kernel = this._kernel;
    if (this._disposed) {
      return;
    }
    if (id === null || kernel.isDisposed) {
      // no subshell: the main shell is busy with the cell, only the interrupt can help
      this._shell = 'none';
      if (this._due) {
        this._fallBack();
      }
      return;
    }
    const msg = commMessage(kernel, this._modelId, { method: 'custom', content: { type: 'stop' } }, id);
    this._msgId = msg.header.msg_id;
    try {
      kernel.sendShellMessage(msg, false, true);
    } catch {
      return; // the kernel went away
    }
    // delivered on a subshell: the kernel handles it at once; interrupt only if nothing is heard
    this._shell = 'sent';
    this._due = false;
    window.clearTimeout(this._timer);
    this._timer = window.setTimeout(() => this._fallBack(), STOP_SENT_ACK_MS);
  }

  private _onIOPub(_: Kernel.IKernelConnection, msg: KernelMessage.IIOPubMessage): void {
    if (this._outcome === 'waiting' && stopHeard(msg, this._modelId, this._displayId, this._msgId)) {
      this._outcome = 'heard';
      this.dispose();
    }
  }

  private _fallBack(): void {
    if (this._disposed || this._outcome !== 'waiting') {
      return;
    }
    if (this._shell === 'pending') {
      this._due = true; // the subshell's answer decides (it is asked for on hover, so it is near)
      return;
    }
    this._outcome = 'interrupted';
    const kernel = this._kernel;
    if (usable(kernel)) {
      void kernel.interrupt().catch(() => undefined);
    }
    this.dispose();
  }

  private _timer = 0;
  private _shell: 'pending' | 'none' | 'sent' = 'pending';
  private _due = false;
  private _msgId = '';
  private _outcome: StopOutcome = 'waiting';
  private _disposed = false;
}

/** What a click on Stop would stop now; null where it stops nothing (no live view of a widget). */
export interface IStopTarget {
  kernel: Kernel.IKernelConnection | null;
  /** The widget's comm. */
  modelId: string;
  /** The live display. */
  displayId: string;
}

/**
 * The live view's Stop button (the widget's, or the reattached view's) inside `node`, seen before
 * the view's own handler: a subshell for our copy of the message is asked for as soon as the
 * pointer is on the button (a click may come), and each click is followed by a `StopGuard`.
 * `node` gets `data-stop`: `waiting`, then the guard's outcome.
 */
export class StopClicks {
  constructor(
    private _node: HTMLElement,
    private _target: () => IStopTarget | null
  ) {
    _node.addEventListener('pointerover', this._onHover, true);
    _node.addEventListener('click', this._onClick, true);
  }

  /** Forget the click being followed and the subshell (a new display, or the renderer goes). */
  reset(): void {
    this._guard?.dispose();
    this._guard = null;
    this._dropShell();
  }

  /** The target of a Stop click at `ev` with a usable kernel, or null. */
  private _stopping(ev: Event): (IStopTarget & { kernel: Kernel.IKernelConnection }) | null {
    const btn = (ev.target as Element | null)?.closest?.('.nbs-Stop') as HTMLButtonElement | null;
    if (!btn || btn.disabled) {
      return null;
    }
    const target = this._target();
    if (!target?.modelId || btn.closest('.nbs-Run:not(.nbs-mod-live)')) {
      return null;
    }
    const kernel = target.kernel;
    return usable(kernel) ? { ...target, kernel } : null;
  }

  private _shell(kernel: Kernel.IKernelConnection): Promise<string | null> {
    if (this._shellKernel !== kernel || this._shellId === null) {
      this._dropShell();
      this._shellKernel = kernel;
      this._shellId = createSubshell(kernel);
    }
    return this._shellId;
  }

  private _dropShell(): void {
    const kernel = this._shellKernel;
    const pending = this._shellId;
    this._shellKernel = null;
    this._shellId = null;
    if (kernel && pending) {
      void pending.then(id => deleteSubshell(kernel, id));
    }
  }

  private _onHover = (ev: Event): void => {
    const target = this._stopping(ev);
    if (target) {
      void this._shell(target.kernel);
    }
  };

  private _onClick = (ev: Event): void => {
    const target = this._stopping(ev);
    if (!target || this._guard) {
      return;
    }
    this._node.setAttribute('data-stop', 'waiting');
    const guard: StopGuard = new StopGuard(
      target.kernel,
      target.modelId,
      target.displayId,
      this._shell(target.kernel),
      outcome => {
        if (this._guard === guard) {
          this._guard = null;
        }
        this._node.setAttribute('data-stop', outcome);
      }
    );
    this._guard = guard;
  };

  private _guard: StopGuard | null = null;
  private _shellId: Promise<string | null> | null = null;
  private _shellKernel: Kernel.IKernelConnection | null = null;
}
