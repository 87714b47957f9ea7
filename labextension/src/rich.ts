/**
 * Rich output of a rank (docs/run-bundle.md §2): one function draws one display item.
 *
 * Nothing a rank sends becomes HTML in this page: images are `<img>` elements from `data:` URLs
 * (SVG too, so its scripts never run), `text/html` is drawn in a sandboxed iframe without scripts,
 * widget trees are built element by element, everything else is text.  `text/markdown` is shown
 * as its source text (no Markdown library is bundled).
 */

import { IDisplayItem, WIDGET_MIME, record } from './messages';

const IMAGES = new Set(['image/png', 'image/jpeg', 'image/gif']);
const BAR_STYLES = new Set(['success', 'info', 'warning', 'danger']);

function el(tag: string, cls: string, text?: string): HTMLElement {
  const e = document.createElement(tag);
  e.className = cls;
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

function size(img: HTMLElement, meta: Record<string, unknown>): void {
  for (const k of ['width', 'height']) {
    const v = meta[k];
    if (typeof v === 'number' && Number.isFinite(v) && v > 0) {
      img.setAttribute(k, String(Math.round(v)));
    }
  }
}

/** `<img>` from a data URL; `src` may be a whole `data:` URL already (from a saved bundle). */
function image(mime: string, value: string, meta: Record<string, unknown>): HTMLElement {
  const img = document.createElement('img');
  img.className = 'nbs-Rich-img';
  let src: string;
  if (value.startsWith('data:')) {
    src = /^data:image\/(png|jpeg|gif|svg\+xml)[;,]/.test(value) ? value : '';
  } else if (mime === 'image/svg+xml') {
    src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(value);
  } else {
    src = `data:${mime};base64,${value.replace(/\s+/g, '')}`;
  }
  if (src) {
    img.src = src;
  }
  img.alt = typeof meta.alt === 'string' ? meta.alt : mime;
  size(img, meta);
  // shown whole: as wide as the pane allows and no taller than the pane (style/base.css), by its
  // width/height ratio, known from its metadata or, failing that, once it is decoded
  const w = Number(img.getAttribute('width'));
  const ht = Number(img.getAttribute('height'));
  if (w > 0 && ht > 0) {
    img.style.setProperty('--nbs-img-ratio', String(w / ht));
  } else {
    img.addEventListener(
      'load',
      () => {
        if (img.naturalWidth > 0 && img.naturalHeight > 0) {
          img.style.setProperty('--nbs-img-ratio', String(img.naturalWidth / img.naturalHeight));
        }
      },
      { once: true }
    );
  }
  return img;
}

const FRAME_STYLE =
  '<style>html,body{margin:0;padding:0;background:transparent;}' +
  // flow-root: the margins of its first and last child (<h3>, <p>, rich's <pre>) stay inside the body,
  // which is measured for the frame's height; collapsed through it, they were cut off
  'body{display:flow-root;font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;color:#222;overflow:hidden;}' +
  // a frame no taller than the pane (style/base.css) scrolls inside, opening at its top: a long
  // DataFrame's header, where the pane, which follows its output to the bottom, would be past it
  'html{overflow:auto;}' +
  // what sits first and last is flush with the frame: rich's bar (a <pre>, UA margins of 1em) on its
  // [rankN] prefix's line in the merged pane, not a line below it
  'body>:first-child{margin-top:0;}body>:last-child{margin-bottom:0;}' +
  // JupyterLab's own table style (.jp-RenderedHTMLCommon, light: the frame is white), not the
  // browser's grid that pandas' border="1" asks for
  'table{border-collapse:collapse;border-spacing:0;border:none;font-size:12px;color:rgba(0,0,0,.87);}' +
  'thead{border-bottom:1px solid #bdbdbd;vertical-align:bottom;}' +
  'td,th,tr{vertical-align:middle;padding:.5em;line-height:normal;white-space:normal;max-width:none;border:none;text-align:right;}' +
  'th{font-weight:bold;}tbody tr:nth-child(odd){background:#fff;}tbody tr:nth-child(even){background:#f5f5f5;}' +
  'tbody tr:hover{background:#e1f5fe;}' +
  'img,svg{max-width:100%;}</style>';

/** HTML in a sandboxed iframe (no scripts, no forms, no popups), as tall as its content. */
function htmlFrame(html: string): HTMLElement {
  return sandboxedFrame(html, { className: 'nbs-Rich-frame', title: 'rank output (HTML)', head: FRAME_STYLE, maxHeight: 2000 });
}

/**
 * `html` in an iframe that runs nothing (`allow-same-origin` only: this page may measure it), `head`
 * in its head, as tall as its content up to `maxHeight` px (images in it that load later included).
 */
export function sandboxedFrame(
  html: string,
  options: { className: string; title: string; head: string; maxHeight: number }
): HTMLIFrameElement {
  const frame = document.createElement('iframe');
  frame.className = options.className;
  frame.setAttribute('sandbox', 'allow-same-origin');
  frame.setAttribute('referrerpolicy', 'no-referrer');
  frame.setAttribute('title', options.title);
  frame.srcdoc = `<!doctype html><html><head><meta charset="utf-8">${options.head}</head><body>${html}</body></html>`;
  frame.addEventListener('load', () => {
    // allow-same-origin lets this page measure it; without allow-scripts nothing in it runs
    const body = frame.contentDocument?.body;
    if (!body) {
      return;
    }
    const root = body.ownerDocument.documentElement;
    const fit = () => {
      // the document's box, not the body's: a first or last child's margins collapse through the body and
      // are outside its box (the X-ray's 4 px: its legend's last line was cut in Notebook 7)
      const height = `${Math.min(options.maxHeight, Math.ceil(root.getBoundingClientRect().height) + 2)}px`;
      if (frame.style.height !== height) {
        frame.style.height = height;
      }
    };
    fit();
    if (typeof ResizeObserver !== 'undefined') {
      new ResizeObserver(fit).observe(body);
    }
  });
  return frame;
}

function percent(v: number, lo: number, hi: number): string {
  return hi > lo ? `${Math.round(((v - lo) / (hi - lo)) * 100)}%` : '';
}

/** A tree node's text: the kernel sends strings; a number is shown, anything else is not. */
function scalarText(v: unknown): string {
  return typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean' ? String(v) : '';
}

/** A widget tree (`application/vnd.nbspawn.widget+json`) as plain elements. */
export function widgetNode(tree: unknown, depth = 0): HTMLElement {
  const t = record(tree);
  if (depth > 20) {
    return el('span', 'nbs-W-other', '\u2026');
  }
  if (t.type === 'box') {
    const box = el('div', `nbs-W-box nbs-mod-${t.dir === 'column' ? 'column' : 'row'}`);
    for (const child of Array.isArray(t.children) ? t.children : []) {
      box.appendChild(widgetNode(child, depth + 1));
    }
    return box;
  }
  if (t.type === 'progress') {
    const num = (v: unknown, d: number) => (typeof v === 'number' && Number.isFinite(v) ? v : d);
    const lo = num(t.min, 0);
    const hi = num(t.max, 100);
    const v = Math.max(lo, Math.min(hi, num(t.value, lo)));
    const wrap = el('span', 'nbs-W-progress');
    if (typeof t.description === 'string' && t.description) {
      wrap.appendChild(el('span', 'nbs-W-label', t.description));
    }
    const bar = document.createElement('progress');
    bar.className = 'nbs-W-bar';
    bar.max = Math.max(0, hi - lo);
    bar.value = v - lo;
    bar.title = percent(v, lo, hi);
    if (typeof t.bar_style === 'string' && BAR_STYLES.has(t.bar_style)) {
      bar.classList.add(`nbs-mod-${t.bar_style}`);
    }
    wrap.appendChild(bar);
    return wrap;
  }
  if (t.type === 'text') {
    return el('span', 'nbs-W-text', scalarText(t.value));
  }
  return el('span', 'nbs-W-other', scalarText(t.text ?? t.value));
}

/** Draw one display item. */
export function richNode(item: IDisplayItem): HTMLElement {
  const box = el('div', 'nbs-Rich');
  box.setAttribute('data-mime', item.mime);
  const value = item.value;
  if (item.mime === WIDGET_MIME && value && typeof value === 'object') {
    box.appendChild(widgetNode(value));
  } else if ((IMAGES.has(item.mime) || item.mime === 'image/svg+xml') && typeof value === 'string') {
    box.appendChild(image(item.mime, value, item.meta));
  } else if (item.mime === 'text/html' && typeof value === 'string') {
    box.appendChild(htmlFrame(value));
  } else {
    const text = typeof value === 'string' ? value : item.text || JSON.stringify(value);
    box.appendChild(el('div', 'nbs-Rich-text', text));
  }
  return box;
}
