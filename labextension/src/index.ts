/**
 * nbspawn's JupyterLab / Notebook 7 extension.
 *
 * - `lib/mime.js` (the package's `mimeExtension`): the renderer of
 *   `application/vnd.nbspawn.run+json`.
 * - this module (the package's `extension`): the "ranks running ■ Stop" notebook toolbar item.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { DocumentRegistry, IDocumentWidget } from '@jupyterlab/docregistry';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

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

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nbspawn-labextension:run-status',
  description: 'Shows the nbspawn ranks running in a notebook’s kernel, with a Stop button.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addWidgetExtension('Notebook', new RunStatusExtension());
  }
};

export default plugin;
