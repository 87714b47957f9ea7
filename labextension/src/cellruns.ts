/**
 * A notebook's cells brought up to date with the kernel's runs after a page load: the saved file may
 * hold an earlier run's output (the notebook was not saved during the run), so the kernel, which
 * knows each cell's latest run by its cell id (`nbspawn/views/_active.py`), is asked on a subshell
 * (`kernel.ts`'s `askActive`), and the cell gets the live display (which `reattach.ts`'s renderer
 * follows) or the frozen run.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';

import { askActive, usable } from './kernel';
import { IActiveRun, LIVE_MIME_TYPE, RUN_MIME_TYPE, parseLiveInfo, record } from './messages';

// -- the kernel's runs per cell ---------------------------------------------------------------------

/** An output of a cell, as read here (`@jupyterlab/outputarea`'s `IOutputModel`). */
interface IOutputLike {
  readonly data: Readonly<Record<string, unknown>>;
}

/** A cell's outputs (`IOutputAreaModel`). */
interface IOutputsLike {
  readonly length: number;
  get(index: number): IOutputLike;
  clear(wait?: boolean): void;
  add(output: { output_type: 'display_data'; data: Record<string, unknown>; metadata: Record<string, unknown> }): number;
}

/** A notebook cell's model (`ICodeCellModel`), as read and written here. */
interface ICellLike {
  readonly id: string;
  readonly type: string;
  readonly sharedModel?: { getSource(): string };
  readonly outputs?: IOutputsLike;
  executionCount?: number | null;
}

/** A notebook's model (`INotebookModel`), as read here. */
export interface INotebookModelLike {
  readonly cells: { readonly length: number; get(index: number): ICellLike };
}

/** The part of a document's context used here (`DocumentRegistry.IContext`). */
export interface INotebookContextLike {
  readonly ready: Promise<void>;
  readonly model: unknown;
  readonly sessionContext: ISessionContext;
}

/** A notebook that may have run nbspawn: only its kernel is asked (every other kernel is left alone). */
const SPAWN_SOURCE = /%%?spawn\b|\bnbspawn\b/;

/**
 * One notebook's cells brought up to date with the kernel's runs (`_active.py`), asked once the
 * notebook and its kernel are ready, and again when the notebook gets another kernel.  A running
 * run's cell gets the live display (this module's renderer reattaches to it) unless it shows it
 * already; an ended run's cell gets the frozen run unless it shows that run already.  What the
 * cell showed before belongs to an earlier execution, and goes.
 */
export class CellRuns implements IDisposable {
  constructor(private _context: INotebookContextLike) {
    void this._start();
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._context.sessionContext.kernelChanged.disconnect(this._onKernelChanged, this);
  }

  private async _start(): Promise<void> {
    try {
      await Promise.all([this._context.ready, this._context.sessionContext.ready]);
    } catch {
      // no kernel: nothing to ask
    }
    if (!this._disposed) {
      this._context.sessionContext.kernelChanged.connect(this._onKernelChanged, this);
      await this._ask();
    }
  }

  private _onKernelChanged(): void {
    void this._ask();
  }

  private _cells(): ICellLike[] {
    const model = this._context.model as INotebookModelLike | null;
    const cells: ICellLike[] = [];
    const list = model?.cells;
    for (let i = 0; list && i < list.length; i++) {
      cells.push(list.get(i));
    }
    return cells;
  }

  private async _ask(): Promise<void> {
    const kernel = this._context.sessionContext.session?.kernel ?? null;
    if (this._disposed || !usable(kernel) || this._asked.has(kernel)) {
      return;
    }
    const cells = this._cells().filter(c => c.type === 'code' && c.outputs);
    if (!cells.some(c => SPAWN_SOURCE.test(c.sharedModel?.getSource() ?? ''))) {
      return;
    }
    this._asked.add(kernel);
    const have = new Set<string>();
    for (const cell of cells) {
      for (const data of outputData(cell)) {
        const runId = record(data[RUN_MIME_TYPE]).run_id;
        if (typeof runId === 'string' && runId) {
          have.add(runId);
        }
      }
    }
    const runs = await askActive(kernel, { have: [...have] });
    if (this._disposed || !runs || this._context.sessionContext.session?.kernel !== kernel) {
      return;
    }
    for (const run of runs) {
      const cell = this._cells().find(c => c.id === run.cell_id && c.type === 'code' && c.outputs);
      if (cell) {
        putRun(cell, run);
      }
    }
  }

  private _asked = new WeakSet<Kernel.IKernelConnection>();
  private _disposed = false;
}

function outputData(cell: ICellLike): Readonly<Record<string, unknown>>[] {
  const outputs = cell.outputs;
  const datas: Readonly<Record<string, unknown>>[] = [];
  for (let i = 0; outputs && i < outputs.length; i++) {
    datas.push(record(outputs.get(i).data));
  }
  return datas;
}

/** Put the kernel's run into its cell, unless the cell shows it already. */
function putRun(cell: ICellLike, run: IActiveRun): void {
  const datas = outputData(cell);
  let data: Record<string, unknown>;
  if (run.status === 'ended') {
    if (!run.frozen || datas.some(d => record(d[RUN_MIME_TYPE]).run_id === run.run_id)) {
      return;
    }
    data = run.frozen;
  } else {
    const live = run.live;
    if (!live || datas.some(d => parseLiveInfo(d[LIVE_MIME_TYPE])?.display_id === live.display_id)) {
      return;
    }
    // no widget view: this page cannot get the widget's model from a busy kernel; reattach at once
    const ranks = live.nprocs === null ? '' : ` ${live.nprocs} rank${live.nprocs === 1 ? '' : 's'},`;
    data = { [LIVE_MIME_TYPE]: { ...live }, 'text/plain': `nbspawn run ${run.run_id}:${ranks} running` };
  }
  const outputs = cell.outputs!;
  outputs.clear();
  outputs.add({ output_type: 'display_data', data, metadata: {} });
  if (run.execution_count !== null) {
    cell.executionCount = run.execution_count;
  }
}
