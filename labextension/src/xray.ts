/**
 * The collectives X-ray in the run view: a "collectives" tab beside the rank tabs, and its panel,
 * the kernel's drawing of what the ranks did together (`views/_xray_html.py`: static HTML and SVG,
 * the same that a saved notebook keeps in its `text/html`).
 *
 * The drawing comes from the kernel, or from a saved notebook that may not be trusted, so it is shown
 * only in a sandboxed iframe without scripts (as a rank's HTML is: rich.ts), coloured as this page is:
 * the theme's variables are copied into it, since a frame does not inherit the page's CSS.
 */

import { h } from './dom';
import { sandboxedFrame } from './rich';

/** The tab's key, beside a rank's number and `'merged'`. */
export const XRAY = 'xray';

/** The theme variables the drawing reads (each with a fallback of its own, for a page without them). */
const THEME_VARS = [
  '--jp-layout-color0',
  '--jp-layout-color1',
  '--jp-layout-color2',
  '--jp-layout-color3',
  '--jp-ui-font-color0',
  '--jp-ui-font-color1',
  '--jp-ui-font-color2',
  '--jp-ui-font-color3',
  '--jp-border-color1',
  '--jp-border-color2',
  '--jp-ui-font-family',
  '--jp-code-font-family',
  '--jp-ui-font-size1',
  '--jp-brand-color1',
  '--jp-error-color0',
  '--jp-error-color1',
  '--jp-warn-color0',
  '--jp-warn-color1',
  '--jp-success-color1'
];

/** The "collectives" tab. */
export function buildXRayTab(): HTMLElement {
  return h(
    'button',
    {
      class: 'nbs-Tab nbs-Tab-xray',
      type: 'button',
      role: 'tab',
      'data-tab': XRAY,
      title: 'What the ranks did together: every collective lined up across the ranks, who arrived last'
    },
    h('span', { class: 'nbs-Tab-icon', 'aria-hidden': 'true' }, '\u21C4'),
    'collectives'
  );
}

/**
 * `:root{...}` with the page's values of the theme variables (JupyterLab sets them on the body; a
 * view drawn before it is attached would read none of its own).
 */
export function themeStyle(from: Element = document.body): string {
  const computed = getComputedStyle(from);
  const decls = THEME_VARS.map(name => {
    const value = computed.getPropertyValue(name).trim().replace(/[<>{};]/g, '');
    return value ? `${name}:${value};` : '';
  }).join('');
  const dark = document.body.dataset.jpThemeLight === 'false';
  return `<style>:root{${decls}color-scheme:${dark ? 'dark' : 'light'}}body{margin:0;background:transparent;}</style>`;
}

/** The page's theme, as far as the drawing's colours go (JupyterLab's body attributes). */
function themeKey(): string {
  return `${document.body.dataset.jpThemeName ?? ''}|${document.body.dataset.jpThemeLight ?? ''}`;
}

/** The panels in the page, by node: a theme change redraws theirs (a frame keeps the colours it was given). */
const panels = new WeakMap<Element, XRayPanel>();
let watchingTheme = false;

/** Once per page: when JupyterLab switches theme (it sets the body's attributes once the theme's CSS is
 * in), every X-ray drawn in the page is drawn again in the new one.  A panel not in the page then
 * is drawn again when it is next updated or shown. */
function watchTheme(): void {
  if (watchingTheme || typeof MutationObserver === 'undefined' || !document.body) {
    return;
  }
  watchingTheme = true;
  new MutationObserver(() => {
    requestAnimationFrame(() => document.querySelectorAll('.nbs-XRay').forEach(node => panels.get(node)?.retheme()));
  }).observe(document.body, { attributes: true, attributeFilter: ['data-jp-theme-light', 'data-jp-theme-name'] });
}

/** The X-ray's panel: its words while there is no drawing yet, else the drawing in a sandboxed frame. */
export class XRayPanel {
  readonly node: HTMLElement = h('div', { class: 'nbs-XRay', role: 'tabpanel', hidden: '' });

  constructor() {
    panels.set(this.node, this);
    watchTheme();
  }

  /** Show `summary` and `html` (the kernel's), redrawn only when they (or the page's theme) changed. */
  update(summary: string | null, html: string | null): void {
    const key = JSON.stringify([summary, html, themeKey()]);
    if (key === this._key) {
      return;
    }
    this._key = key;
    this._summary = summary;
    this._html = html;
    if (!html) {
      this.node.replaceChildren(h('div', { class: 'nbs-XRay-summary' }, summary ?? 'no collective yet'));
      return;
    }
    const frame = sandboxedFrame(html, {
      className: 'nbs-XRay-frame',
      title: 'collectives X-ray',
      head: themeStyle(),
      maxHeight: 1600
    });
    this.node.replaceChildren(frame);
  }

  /** The page's theme may have changed: drawn again in it, if it did. */
  retheme(): void {
    this.update(this._summary, this._html);
  }

  private _key = '';
  private _summary: string | null = null;
  private _html: string | null = null;
}
