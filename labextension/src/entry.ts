/**
 * What the output model keeps of a rank's output: entries (a line, or a display item) and what one
 * batch of output changed.  No DOM: `output.ts` makes them, `lines.ts` and `pane.ts` draw them.
 */

import { IDisplayItem, WIDGET_MIME, record } from './messages';
import { ILine, isBar } from './text';

/** A line of a rank's output, in its flow or (a progress bar being redrawn) at the bottom. */
export interface ILineEntry {
  readonly kind: 'line';
  readonly rank: number;
  readonly line: ILine;
  /** Position in the run's arrival order; a bar that lands gets a new one. */
  seq: number;
  /** Bumped whenever what it shows may have changed. */
  version: number;
  /** In the flow (not dropped, cleared or floating at the bottom as a bar). */
  inFlow: boolean;
}

/** Something a rank displayed (an image, HTML, a widget), in its flow. */
export interface IDisplayEntry {
  readonly kind: 'display';
  readonly rank: number;
  item: IDisplayItem;
  seq: number;
  version: number;
  inFlow: boolean;
  /** An `update` reached it (a widget bar being driven). */
  updated: boolean;
}

export type Entry = ILineEntry | IDisplayEntry;

/** What one batch of output changed. */
export interface ILiveUpdate {
  /** Everything was replaced (a replay): redraw from scratch. */
  reset: boolean;
  /** Entries placed at the end of the flow, in order (new ones, and bars that landed). */
  added: Entry[];
  /** Entries whose content may have changed (in the flow or at the bottom). */
  changed: Set<Entry>;
  /** Entries that left the flow (dropped, cleared, or floated to the bottom as a bar). */
  removed: Set<Entry>;
  /** Ranks whose bottom bars changed (a bar appeared, was redrawn, or landed). */
  bars: Set<number>;
  /** Ranks whose elided count changed. */
  elided: Set<number>;
  /** Ranks whose output was cleared (`clear_output`). */
  cleared: Set<number>;
}

/** An update that changed nothing yet (`reset`: one that replaces everything). */
export function emptyUpdate(reset = false): ILiveUpdate {
  return {
    reset,
    added: [],
    changed: new Set(),
    removed: new Set(),
    bars: new Set(),
    elided: new Set(),
    cleared: new Set()
  };
}

/** Whether a widget tree still shows a bar that is running (not full, not finished in success or error). */
export function widgetRunning(tree: unknown, depth = 0): boolean {
  const t = record(tree);
  if (depth > 20) {
    return false;
  }
  if (t.type === 'progress') {
    const hi = typeof t.max === 'number' ? t.max : 100;
    const v = typeof t.value === 'number' ? t.value : 0;
    return v < hi && t.bar_style !== 'success' && t.bar_style !== 'danger';
  }
  return t.type === 'box' && Array.isArray(t.children) && t.children.some((c: unknown) => widgetRunning(c, depth + 1));
}

/** Whether an entry is floating at the bottom now (a bar being redrawn). */
export function entryIsBar(e: Entry): boolean {
  if (e.kind === 'line') {
    return isBar(e.line) && e.line.segments.some(s => s.text.trim() !== '');
  }
  return e.updated && e.item.mime === WIDGET_MIME && widgetRunning(e.item.value);
}

/** The text of a line entry (tests, plain views). */
export function entryText(e: Entry): string {
  return e.kind === 'line' ? e.line.segments.map(s => s.text).join('') : `[${e.item.mime}]`;
}
