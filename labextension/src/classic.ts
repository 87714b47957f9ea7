/**
 * The classic Notebook (Notebook 6, nbclassic) with ipywidgets 7: once its widget manager has loaded the
 * kernel's widgets, it draws every cell that holds a widget view again from the cell's JSON
 * (`Notebook.render_cell_output`), and JSON keeps no display_id (it is transient). A run whose live view
 * was shown before then (Run All as the page opens, on a busy machine) loses its output's display_id
 * record: the run's end (`update_display_data`) finds nothing to replace, and the cell keeps the live
 * view, hidden once the widget closes, in place of the run's snapshot. Seen in 4 of 6 runs of the
 * classic Notebook's tests with the machine's cores busy, and forced in `test_classic_notebook.py`.
 *
 * (ipywidgets 7 also blanks the drawn-again output's model_id as it removes the old view, so the live
 * view itself is gone until the run ends.) So each time a run's live view is drawn there, and each time
 * one is removed while its run goes on, the run's output is recorded under its display_id again, as the
 * Notebook records a display as it appends it (`OutputArea._record_display_id`): the run's end then
 * replaces it with the snapshot. Elsewhere (no `Jupyter.notebook`: JupyterLab, Notebook 7, VS Code,
 * Colab) this does nothing.
 */

import { LIVE_MIME_TYPE, parseLiveInfo } from './messages';

/** The parts of the classic Notebook's `OutputArea` used here. */
interface IClassicOutputArea {
  element?: { children(selector: string): { get(index: number): Element | undefined } };
  outputs?: { data?: Record<string, unknown> }[];
  _display_id_targets?: Record<string, { index: number; element: unknown }[]>;
}

interface IClassicNotebook {
  get_cells(): { output_area?: IClassicOutputArea }[];
}

const LOOK_EVERY_MS = 50;
const LOOKS = 200; // 10 s for the view to be attached to its output, or the cell to be drawn again

/**
 * Record the output holding run `runId`'s live view under its display_id: once `el` is attached to it
 * (a view drawn), or, without `el`, once the cell has been drawn again after a view was removed (then
 * ipywidgets 7 has blanked the output's model_id, so no view of ours is drawn there to ask).
 */
export function keepDisplayTarget(runId: string, el?: HTMLElement): void {
  const page = window as unknown as { Jupyter?: { notebook?: IClassicNotebook }; jQuery?: (el: Element) => unknown };
  const notebook = page.Jupyter?.notebook;
  if (!runId || typeof notebook?.get_cells !== 'function' || typeof page.jQuery !== 'function') {
    return;
  }
  const jQuery = page.jQuery;
  let looks = 0;
  const look = (): void => {
    if (!record(notebook, runId, jQuery, el) && ++looks < LOOKS) {
      setTimeout(look, LOOK_EVERY_MS);
    }
  };
  look();
}

/** Whether the run's output was found, attached, and recorded. */
function record(notebook: IClassicNotebook, runId: string, jQuery: (el: Element) => unknown, el?: HTMLElement): boolean {
  for (const cell of notebook.get_cells()) {
    const area = cell.output_area;
    const outputs = area?.outputs ?? [];
    const index = outputs.findIndex(output => parseLiveInfo(output?.data?.[LIVE_MIME_TYPE])?.run_id === runId);
    if (!area?._display_id_targets || !area.element || index < 0) {
      continue;
    }
    const displayId = parseLiveInfo(outputs[index].data![LIVE_MIME_TYPE])!.display_id;
    // its own element: the view's, or the index-th output drawn (one element an output, as the Notebook draws them)
    const element = el ? el.closest('.output_area') : area.element.children('.output_area').get(index);
    if (!displayId || !element?.isConnected) {
      return false;
    }
    const kept = (area._display_id_targets[displayId] ?? []).filter(target => target.index !== index);
    area._display_id_targets[displayId] = [...kept, { index, element: jQuery(element) }];
    return true;
  }
  return false;
}
