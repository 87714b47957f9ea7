/**
 * A rank's output as DOM: terminal lines with their ANSI styles (the 16 themed colours as CSS
 * classes, 256-colour and true colour inline), display items (drawn by `rich.ts`), the
 * `[rank{r}]` prefix and colour of each rank, the elided-lines note and the empty placeholder.
 * Stateless builders; `pane.ts` puts them in its window.
 */

import { h } from './dom';
import type { Entry } from './entry';
import { richNode } from './rich';
import { ILine, ITextStyle } from './text';

/** Distinct hues for the first ranks, none of them red (red is for errors). */
const RANK_HUES = [212, 140, 275, 32, 186, 318, 80, 245, 160, 292];

/** A colour per rank; past the table, hues step by the golden angle so neighbours differ. */
export function rankHue(rank: number): number {
  if (rank < RANK_HUES.length) {
    return RANK_HUES[rank];
  }
  const h = Math.round((rank * 137.508 + 200) % 360);
  return h < 15 || h > 345 ? (h + 30) % 360 : h; // skip red
}

/** xterm's 256-colour palette, indices 16-255 (0-15 are themed CSS classes). */
function palette256(n: number): string {
  if (n < 232) {
    const i = n - 16;
    const steps = [0, 95, 135, 175, 215, 255];
    const r = steps[Math.floor(i / 36)];
    const g = steps[Math.floor(i / 6) % 6];
    const b = steps[i % 6];
    return `rgb(${r}, ${g}, ${b})`;
  }
  const v = 8 + (n - 232) * 10;
  return `rgb(${v}, ${v}, ${v})`;
}

function applyColour(el: HTMLElement, which: 'fg' | 'bg', c: number | string | undefined): void {
  if (c === undefined) {
    return;
  }
  if (typeof c === 'number' && c < 16) {
    el.classList.add(`nbs-${which}-${c}`);
    return;
  }
  const css = typeof c === 'number' ? palette256(c) : /^#[0-9a-f]{6}$/.test(c) ? c : '';
  if (css) {
    if (which === 'fg') {
      el.style.color = css;
    } else {
      el.style.backgroundColor = css;
    }
  }
}

/** One styled run of text as a span (or a bare text node when unstyled). */
function styledNode(text: string, style: ITextStyle): Node {
  if (Object.keys(style).length === 0) {
    return document.createTextNode(text);
  }
  const span = document.createElement('span');
  span.textContent = text;
  let { fg, bg } = style;
  if (style.inverse) {
    [fg, bg] = [bg, fg];
    span.classList.add('nbs-inverse');
    if (fg === undefined) {
      span.classList.add('nbs-inverse-fg');
    }
    if (bg === undefined) {
      span.classList.add('nbs-inverse-bg');
    }
  }
  applyColour(span, 'fg', fg);
  applyColour(span, 'bg', bg);
  if (style.bold) {
    span.classList.add('nbs-bold');
  }
  if (style.dim) {
    span.classList.add('nbs-dim');
  }
  if (style.italic) {
    span.classList.add('nbs-italic');
  }
  if (style.underline || style.strike) {
    span.style.textDecorationLine = [
      style.underline ? 'underline' : '',
      style.strike ? 'line-through' : ''
    ]
      .join(' ')
      .trim();
  }
  return span;
}

/** One terminal line: its styled runs, after the rank's prefix in the merged view. */
export function lineNode(line: ILine, prefix?: HTMLElement): HTMLElement {
  const div = h('div', { class: 'nbs-Line' });
  if (line.stream === 'stderr') {
    div.classList.add('nbs-stderr');
  }
  if (prefix) {
    div.appendChild(prefix);
  }
  const body = h('span', { class: 'nbs-Line-text' });
  for (const seg of line.segments) {
    body.appendChild(styledNode(seg.text, seg.style));
  }
  div.appendChild(body);
  return div;
}

/** One entry of a rank's flow: a line, or a display item drawn by `rich.ts`. */
export function entryNode(e: Entry, prefixed: boolean): HTMLElement {
  const prefix = prefixed ? rankPrefix(e.rank) : undefined;
  if (e.kind === 'line') {
    const node = lineNode(e.line, prefix);
    node.hidden = !isVisible(e.line);
    return node;
  }
  const div = h('div', { class: 'nbs-Display' });
  if (prefix) {
    div.appendChild(prefix);
  }
  div.appendChild(richNode(e.item));
  return div;
}

/** `[rank{r}]` before a line in the merged view, in the rank's colour. */
export function rankPrefix(rank: number): HTMLElement {
  const el = h('span', { class: 'nbs-Prefix' }, `[rank${rank}]`);
  el.style.setProperty('--nbs-rank-hue', String(rankHue(rank)));
  return el;
}

/** `N lines elided — full log at PATH`, before a rank's output. */
export function elidedNode(
  rank: number,
  count: number,
  path: string | null,
  prefix = false
): HTMLElement {
  const where = path ?? 'the log directory';
  return h(
    'div',
    { class: 'nbs-Elided', 'data-rank': String(rank) },
    prefix ? rankPrefix(rank) : null,
    `${count} ${count === 1 ? 'line' : 'lines'} elided — full log at ${where}`
  );
}

/** The placeholder of an output area with nothing in it. */
export function emptyOutput(): HTMLElement {
  return h('div', { class: 'nbs-Empty' }, 'no output');
}

/** Whether a line is worth a row: not an empty, still-open line (the text after a final "\n"). */
export function isVisible(line: ILine): boolean {
  return line.complete || line.segments.length > 0;
}
