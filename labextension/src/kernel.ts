/**
 * Requests to a kernel over a JupyterLab kernel connection: a subshell of our own (JEP 91), and
 * comm messages to the run's widget on it.  What the messages say is typed in `messages.ts`.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';

import { WidgetCommData, record } from './messages';

/** How long the kernel may leave our questions about the run unanswered. */
export const ANSWER_MS = 5000;

/** Whether messages can still go to `kernel`. */
export function usable(kernel: Kernel.IKernelConnection | null | undefined): kernel is Kernel.IKernelConnection {
  return !!kernel && !kernel.isDisposed && kernel.status !== 'dead';
}

/**
 * A new subshell of `kernel`, or null if it has none (no answer in `ANSWER_MS` and a bit).  Asked
 * on the control channel directly: a page connected mid-run has no `kernel_info_reply` yet (that
 * request waits for the busy main shell), so the services do not know whether it has subshells.
 */
export async function createSubshell(kernel: Kernel.IKernelConnection): Promise<string | null> {
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

/** Ask the kernel to delete a subshell (nothing if there is none, or the kernel is gone). */
export function deleteSubshell(kernel: Kernel.IKernelConnection, id: string | null): void {
  if (id && usable(kernel)) {
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

/** A `comm_msg` to the widget `commId`, for the main shell or (`subshellId`) a subshell. */
export function commMessage(
  kernel: Kernel.IKernelConnection,
  commId: string,
  data: WidgetCommData,
  subshellId: string | null
): KernelMessage.ICommMsgMsg<'shell'> {
  return KernelMessage.createMessage({
    msgType: 'comm_msg',
    channel: 'shell',
    username: kernel.username,
    session: kernel.clientId,
    subshellId,
    content: { comm_id: commId, data }
  });
}
