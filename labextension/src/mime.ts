/**
 * MIME renderer extension for `application/vnd.nbspawn.run+json` (JupyterLab 4 and Notebook 7).
 *
 * Version 2 bundles keep the run's facts in the JSON and each rank's output once, in the same
 * output's `text/html` (docs/run-bundle.md §4), which is parsed here with `DOMParser` (an inert
 * document: nothing in it runs or loads) back into the chunks the live view is drawn from.
 * Version 1 bundles carry the chunks in the JSON.
 */

import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { RUN_MIME_TYPE, WIDGET_MIME, parseBundle, parseOrder } from './messages';
import { LiveView, renderRun } from './view';

type Chunk = [string, unknown];

/** A saved line back to the text a terminal was given: `data-sgr` runs become SGR sequences. */
function lineText(span: Element): string {
  let text = '';
  for (const node of Array.from(span.childNodes)) {
    if (node.nodeType === 3) {
      text += node.textContent ?? '';
    } else if (node.nodeType === 1) {
      const sgr = (node as Element).getAttribute('data-sgr');
      const inner = node.textContent ?? '';
      text += sgr && /^[0-9;:]*$/.test(sgr) ? `\x1b[0;${sgr}m${inner}\x1b[0m` : inner;
    }
  }
  return text;
}

function displayItem(div: Element): Record<string, unknown> {
  const mime = div.getAttribute('data-display') || 'text/plain';
  const item: Record<string, unknown> = { kind: 'data', id: null, mime, text: '', meta: {} };
  const widget = div.getAttribute('data-widget');
  if (widget !== null) {
    try {
      item.value = JSON.parse(widget);
      item.mime = WIDGET_MIME;
      return item;
    } catch {
      // drawn as its static text below
    }
  }
  const img = div.querySelector('img');
  if (mime.startsWith('image/') && img) {
    item.value = img.getAttribute('src') ?? '';
    const meta: Record<string, number> = {};
    for (const k of ['width', 'height']) {
      const v = Number(img.getAttribute(k));
      if (v > 0) {
        meta[k] = v;
      }
    }
    item.meta = meta;
    return item;
  }
  if (mime === 'text/html') {
    item.value = div.innerHTML; // drawn in a sandboxed iframe, never in this page
    return item;
  }
  item.mime = mime === 'text/markdown' || mime === 'text/latex' ? mime : 'text/plain';
  item.value = div.textContent ?? '';
  return item;
}

/**
 * Each rank's output chunks from a version 2 bundle's `text/html` (one chunk per saved line or
 * display item), and whose chunk came next when they were printed (`data-order`; null in a
 * bundle saved before it was kept).
 */
export function parseOutputHtml(html: string): {
  tails: Record<string, Chunk[]>;
  order: number[] | null;
  xray: string | null;
} {
  const doc = new DOMParser().parseFromString(html, 'text/html');
  // the X-ray's drawing: shown only in a sandboxed frame without scripts (xray.ts)
  const xray = doc.querySelector('div.nbspawn-xray')?.outerHTML ?? null;
  const tails: Record<string, Chunk[]> = {};
  const order = parseOrder(doc.querySelector('div.nbspawn-run')?.getAttribute('data-order') ?? null);
  for (const box of Array.from(doc.querySelectorAll('div.nbspawn-output[data-rank]'))) {
    const rank = box.getAttribute('data-rank')!;
    const chunks: Chunk[] = (tails[rank] = []);
    for (const el of Array.from(box.children)) {
      const s = el.getAttribute('data-s');
      if (el.tagName === 'SPAN' && s !== null) {
        chunks.push([s === 'e' ? 'stderr' : 'stdout', lineText(el)]);
      } else if (el.hasAttribute('data-display')) {
        chunks.push(['display', displayItem(el)]);
      }
    }
  }
  return { tails, order, xray };
}

/** Renders a finished (or running) `%%spawn` run. */
export class RunRenderer extends Widget implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass('nbs-RunRenderer');
  }

  renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const run = parseBundle(model.data[this._mimeType]);
    const html = model.data['text/html'];
    const saved = run.version >= 2 && typeof html === 'string' ? parseOutputHtml(html) : undefined;
    this._view?.dispose();
    // an output updated in place (update_display) keeps the tab the user picked
    this._view = renderRun(this.node, run, {
      tails: saved?.tails,
      order: saved?.order,
      xrayHtml: saved?.xray,
      selected: this._picked,
      onSelect: sel => (this._picked = sel)
    });
    return Promise.resolve();
  }

  dispose(): void {
    this._view?.dispose();
    this._view = null;
    super.dispose();
  }

  private _mimeType: string;
  private _picked: number | 'merged' | null = null;
  private _view: LiveView | null = null;
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  // Worker text becomes DOM text nodes; rank HTML is drawn only in sandboxed iframes without
  // scripts; images only from data: URLs.  Safe in untrusted notebooks too.
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
