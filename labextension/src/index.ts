/**
 * nbspawn's JupyterLab / Notebook 7 extension.
 *
 * - `lib/mime.js` (the package's `mimeExtension`): the renderer of
 *   `application/vnd.nbspawn.run+json`.
 * - this module (the package's `extension`): the "ranks running ■ Stop" notebook toolbar item, and
 *   in every notebook the renderer of `application/vnd.nbspawn.live+json` (`reattach.ts`): the
 *   live widget, or on a page reloaded mid-run a placeholder that reattaches to the run; and
 *   `CellRuns`, which asks the kernel for its runs of the notebook's cells, so that a page loaded
 *   without a save made during the run still shows it, live or frozen.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { DocumentRegistry, IDocumentWidget } from '@jupyterlab/docregistry';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

import { CellRuns } from './cellruns';
import { IRendermime, LIVE_RANK, reattachFactory } from './reattach';
import { RunStatusWidget } from './status';

const TOOLBAR_ITEM = 'nbspawnStatus';

/** Adds the status item to every notebook's toolbar. */
class RunStatusExtension
  implements DocumentRegistry.IWidgetExtension<IDocumentWidget, DocumentRegistry.IModel>
{
  createNew(
    panel: IDocumentWidget,
    context: DocumentRegistry.IContext<DocumentRegistry.IModel>
  ): IDisposable {
    const item = new RunStatusWidget(context.sessionContext);
    // next to the kernel indicators when the toolbar has them, else at the end
    if (!panel.toolbar.insertAfter('spacer', TOOLBAR_ITEM, item)) {
      panel.toolbar.addItem(TOOLBAR_ITEM, item);
    }
    return new DisposableDelegate(() => item.dispose());
  }
}

/**
 * Adds the live-display renderer to every notebook's own rendermime (as the widget manager adds
 * the widget-view renderer there), before the notebook's outputs are drawn.
 */
class ReattachExtension implements DocumentRegistry.IWidgetExtension<IDocumentWidget, DocumentRegistry.IModel> {
  createNew(
    panel: IDocumentWidget,
    context: DocumentRegistry.IContext<DocumentRegistry.IModel>
  ): IDisposable {
    const rendermime = (panel.content as { rendermime?: IRendermime }).rendermime;
    if (!rendermime) {
      return new DisposableDelegate(() => undefined);
    }
    rendermime.addFactory(reattachFactory(rendermime, context.sessionContext), LIVE_RANK);
    // the kernel's runs of this notebook's cells, whatever the file saved of them
    const runs = new CellRuns(context);
    return new DisposableDelegate(() => runs.dispose());
  }
}

const reattach: JupyterFrontEndPlugin<void> = {
  id: 'nbspawn-labextension:reattach',
  description: 'Shows a %%spawn run that is running on a page reloaded mid-run, and its end.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addWidgetExtension('Notebook', new ReattachExtension());
  }
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nbspawn-labextension:run-status',
  description: 'Shows the nbspawn ranks running in a notebook’s kernel, with a Stop button.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addWidgetExtension('Notebook', new RunStatusExtension());
  }
};

export default [plugin, reattach];
