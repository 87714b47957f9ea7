/**
 * Requests to a kernel over a JupyterLab kernel connection: a subshell of our own (JEP 91), comm
 * messages to the run's widget on it, and the kernel's runs per cell (`askActive`).  What the
 * messages say is typed in `messages.ts`.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';

import {
  ACTIVE_COMM_TARGET,
  IActiveRequest,
  IActiveRun,
  WidgetCommData,
  parseActiveRuns,
  record
} from './messages';

/** How long the kernel may leave our questions about the run unanswered. */
export const ANSWER_MS = 5000;

/** Whether messages can still go to `kernel`. */
export function usable(kernel: Kernel.IKernelConnection | null | undefined): kernel is Kernel.IKernelConnection {
  return !!kernel && !kernel.isDisposed && kernel.status !== 'dead';
}

/** The subshell requests (JEP 91) this page sends, with their content. */
type SubshellRequest =
  | { msgType: 'create_subshell_request'; content: KernelMessage.ICreateSubshellRequestMsg['content'] }
  | { msgType: 'delete_subshell_request'; content: KernelMessage.IDeleteSubshellRequestMsg['content'] };

/**
 * Send one subshell request on the control channel and wait for its reply: the reply's content, or
 * null when there is none in `ANSWER_MS` and a bit, or the request could not be sent.  Sent on the
 * control channel directly: a page connected mid-run has no `kernel_info_reply` yet (that request
 * waits for the busy main shell), so the services do not know whether the kernel has subshells.
 */
async function subshellRequest(
  kernel: Kernel.IKernelConnection,
  request: SubshellRequest
): Promise<Record<string, unknown> | null> {
  let future: Kernel.IControlFuture | null = null;
  let timer = 0;
  try {
    const common = { channel: 'control', username: kernel.username, session: kernel.clientId } as const;
    // createMessage's overloads take one message type at a time, hence one call per request type
    const msg =
      request.msgType === 'create_subshell_request'
        ? KernelMessage.createMessage({ ...common, ...request })
        : KernelMessage.createMessage({ ...common, ...request });
    future = kernel.sendControlMessage(msg, true, true);
    const timeout = new Promise<null>(resolve => (timer = window.setTimeout(() => resolve(null), ANSWER_MS + 3000)));
    const reply = await Promise.race([future.done, timeout]);
    return reply ? record(reply.content) : null;
  } catch {
    return null; // no such request, or gone with its kernel
  } finally {
    window.clearTimeout(timer);
    if (future && !future.isDisposed) {
      future.dispose();
    }
  }
}

/** A new subshell of `kernel`, or null if it has none (`subshellRequest` tells when). */
export async function createSubshell(kernel: Kernel.IKernelConnection): Promise<string | null> {
  const id = (await subshellRequest(kernel, { msgType: 'create_subshell_request', content: {} }))?.subshell_id;
  return typeof id === 'string' && id ? id : null;
}

/** Ask the kernel to delete a subshell (nothing if there is none, or the kernel is gone). */
export function deleteSubshell(kernel: Kernel.IKernelConnection, id: string | null): void {
  if (id && usable(kernel)) {
    void subshellRequest(kernel, { msgType: 'delete_subshell_request', content: { subshell_id: id } });
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

/**
 * The kernel's latest run of each recent cell (`nbspawn/views/_active.py`), asked by opening an
 * `nbspawn.active` comm on a subshell of our own (the main shell may be running a cell); without
 * subshells, on the main shell, answered once it is idle (`mainShellMs`).  The kernel answers with
 * one message, and we close the comm; `[]` when nbspawn is not loaded there (`targetListed`: no comm
 * is opened then) or the kernel closes the comm unanswered; null when it does not answer, or the
 * kernel went away.
 */
export async function askActive(
  kernel: Kernel.IKernelConnection,
  request: IActiveRequest,
  mainShellMs = 10 * 60_000
): Promise<IActiveRun[] | null> {
  if (!usable(kernel)) {
    return null;
  }
  const subshell = await createSubshell(kernel);
  const listed = await targetListed(kernel, subshell, subshell !== null ? ANSWER_MS : mainShellMs);
  if (listed !== true) {
    deleteSubshell(kernel, subshell);
    return listed === false ? [] : null;
  }
  const commId = `nbspawn-active-${Date.now().toString(16)}-${Math.random().toString(16).slice(2)}`;
  let onIOPub: ((k: Kernel.IKernelConnection, msg: KernelMessage.IIOPubMessage) => void) | null = null;
  let onStatus: ((k: Kernel.IKernelConnection, status: Kernel.Status) => void) | null = null;
  let timer = 0;
  let answered = false;
  try {
    return await new Promise<IActiveRun[] | null>(resolve => {
      onIOPub = (_, msg) => {
        const content = record(msg.content);
        if (content.comm_id !== commId) {
          return;
        }
        if (msg.header.msg_type === 'comm_msg') {
          answered = true;
          resolve(parseActiveRuns(content.data));
        } else if (msg.header.msg_type === 'comm_close') {
          resolve([]); // closed unanswered: a kernel without nbspawn's target
        }
      };
      onStatus = (_, status) => {
        if (status === 'dead' || status === 'restarting' || status === 'autorestarting') {
          resolve(null);
        }
      };
      kernel.iopubMessage.connect(onIOPub);
      kernel.statusChanged.connect(onStatus);
      timer = window.setTimeout(() => resolve(null), subshell !== null ? ANSWER_MS : mainShellMs);
      try {
        const msg = KernelMessage.createMessage({
          msgType: 'comm_open',
          channel: 'shell',
          username: kernel.username,
          session: kernel.clientId,
          subshellId: subshell,
          content: { comm_id: commId, target_name: ACTIVE_COMM_TARGET, data: { ...request } }
        });
        kernel.sendShellMessage(msg, false, true);
      } catch {
        resolve(null);
      }
    });
  } finally {
    window.clearTimeout(timer);
    if (onIOPub) {
      kernel.iopubMessage.disconnect(onIOPub);
    }
    if (onStatus) {
      kernel.statusChanged.disconnect(onStatus);
    }
    if (answered) {
      closeComm(kernel, commId);
    }
    deleteSubshell(kernel, subshell);
  }
}

/**
 * Whether the kernel has the `nbspawn.active` target: nbspawn, once loaded, lists a comm of it that no
 * page opened (`_active.py`'s `LISTED`), so a `comm_info_request` for the target tells, on a subshell
 * at once.  Asked before the comm is opened: a kernel without the target (a notebook's new kernel,
 * before its `%load_ext nbspawn`) would close it, and every page on that kernel would log the close
 * of a comm it does not know.  null when there is no answer in `ms`, or the kernel went away.
 */
async function targetListed(
  kernel: Kernel.IKernelConnection,
  subshellId: string | null,
  ms: number
): Promise<boolean | null> {
  let future: Kernel.IShellFuture | null = null;
  let timer = 0;
  try {
    const msg = KernelMessage.createMessage({
      msgType: 'comm_info_request',
      channel: 'shell',
      username: kernel.username,
      session: kernel.clientId,
      subshellId,
      content: { target_name: ACTIVE_COMM_TARGET }
    });
    future = kernel.sendShellMessage(msg, true, true);
    const timeout = new Promise<null>(resolve => (timer = window.setTimeout(() => resolve(null), ms)));
    const reply = await Promise.race([future.done, timeout]);
    if (!reply) {
      return null;
    }
    const comms = Object.values(record(record(reply.content).comms));
    return comms.some(c => record(c).target_name === ACTIVE_COMM_TARGET);
  } catch {
    return null; // gone with its kernel
  } finally {
    window.clearTimeout(timer);
    if (future && !future.isDisposed) {
      future.dispose();
    }
  }
}

/**
 * Close the comm `commId` on the kernel's side (on the main shell: handled once it is idle).  The
 * kernel leaves an `nbspawn.active` comm open after its answer, so that no `comm_close` reaches
 * this page's connection, which would log it as a comm it does not know.
 */
function closeComm(kernel: Kernel.IKernelConnection, commId: string): void {
  if (!usable(kernel)) {
    return;
  }
  try {
    const msg = KernelMessage.createMessage({
      msgType: 'comm_close',
      channel: 'shell',
      username: kernel.username,
      session: kernel.clientId,
      content: { comm_id: commId, data: {} }
    });
    kernel.sendShellMessage(msg, false, true);
  } catch {
    // gone with its kernel
  }
}
