/**
 * Stop that always arrives (JupyterLab and Notebook 7 with this extension; see `reattach.ts`,
 * which watches clicks on the live view's Stop button).
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

import { record } from './bundle';

/** How long a Stop may go unheard by a kernel without subshells before it is interrupted. */
export const STOP_ACK_MS = 300;
/** The same, once our copy of the Stop went on a subshell (it is handled at once). */
export const STOP_SENT_ACK_MS = 3000;

export type StopOutcome = 'waiting' | 'heard' | 'interrupted';

/** Ask the kernel to delete a subshell (nothing if there is none, or the kernel is gone). */
export function deleteSubshell(kernel: Kernel.IKernelConnection, id: string | null): void {
  if (id && !kernel.isDisposed && kernel.status !== 'dead') {
    try {
      const msg = KernelMessage.createMessage({
        msgType: 'delete_subshell_request',
        channel: 'control',
        username: kernel.username,
        session: kernel.clientId,
        content: { subshell_id: id }
      });
      kernel.sendControlMessage(msg, true, true);
    } catch {
      // gone with its kernel
    }
  }
}

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
    const msg = KernelMessage.createMessage({
      msgType: 'comm_msg',
      channel: 'shell',
      username: kernel.username,
      session: kernel.clientId,
      subshellId: id,
      content: { comm_id: this._modelId, data: { method: 'custom', content: { type: 'stop' } } }
    });
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
    const type = msg.header.msg_type;
    const content = record(msg.content);
    let heard = false;
    if (type === 'status') {
      // our copy was handled (the handler only sets the flag the supervision loop reads)
      heard =
        content.execution_state === 'idle' && this._msgId !== '' && record(msg.parent_header).msg_id === this._msgId;
    } else if (type === 'comm_msg' && content.comm_id === this._modelId) {
      const data = record(content.data);
      heard = data.method === 'update' && record(record(data.state).header).stopping === true;
    } else if (type === 'comm_close') {
      heard = content.comm_id === this._modelId;
    } else if (type === 'update_display_data') {
      heard = this._displayId !== '' && record(content.transient).display_id === this._displayId;
    }
    if (heard && this._outcome === 'waiting') {
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
    if (!kernel.isDisposed && kernel.status !== 'dead') {
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
