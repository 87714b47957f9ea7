/**
 * `h`, the one element builder of the run view's DOM pieces: string children become text nodes,
 * so worker text reaches the DOM through `textContent`/text nodes only, never parsed as HTML.
 */

type Child = Node | string | null | undefined | false;

/** Create an element; string children become text nodes (never parsed as HTML). */
export function h(
  tag: string,
  attrs: Record<string, string | undefined> = {},
  ...children: Child[]
): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined) {
      el.setAttribute(k, v);
    }
  }
  for (const c of children) {
    if (c !== null && c !== undefined && c !== false) {
      el.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    }
  }
  return el;
}
