/**
 * MIME renderer extension for `application/vnd.nbspawn.run+json` (JupyterLab 4 and Notebook 7).
 */

import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { RUN_MIME_TYPE, parseBundle } from './bundle';
import { renderRun } from './render';

/** Renders a finished (or running) `%%spawn` run. */
export class RunRenderer extends Widget implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass('nbs-RunRenderer');
  }

  renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const run = parseBundle(model.data[this._mimeType]);
    // an output updated in place (update_display) keeps the tab the user picked
    renderRun(this.node, run, {
      selected: this._picked,
      onSelect: sel => (this._picked = sel)
    });
    return Promise.resolve();
  }

  private _mimeType: string;
  private _picked: number | 'merged' | null = null;
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  // Only DOM text nodes are produced from the data, so it is safe in untrusted notebooks too.
  safe: true,
  mimeTypes: [RUN_MIME_TYPE],
  createRenderer: options => new RunRenderer(options)
};

const extension: IRenderMime.IExtension = {
  id: 'nbspawn-labextension:run-renderer',
  description: 'Renders nbspawn %%spawn runs: per-rank panes, status chips, merged view.',
  rendererFactory,
  // Lower rank wins; text/html is 50, so the bundle's HTML fallback is never chosen.
  rank: 0,
  dataType: 'json'
};

export default extension;
