/**
 * The run view: the same DOM for a live run and a saved one, updated in place as output and rank
 * statuses arrive, with an elapsed-time counter and a Stop button in the header while it runs.
 * Header, banner and chips are rebuilt only where they changed; the selected tab's output is a
 * `Pane` (pane.ts).
 */

import { h } from './dom';
import { formatElapsed } from './format';
import { buildBanner, buildHeader, headerFacts, metaEntry } from './header';
import { IRunBundle } from './messages';
import { ILiveSource, ILiveUpdate, LiveOutput } from './output';
import { Pane, Sel, rankKey } from './pane';
import { TabKey, attachTabKeys, buildChip, buildMergedTab, markSelected } from './tabs';
import { XRayPanel, buildXRayTab } from './xray';

export type { Sel } from './pane';

const ACTIVE = new Set(['starting', 'running']);
/** How long Stop may go unanswered before the view says the frontend may be holding it back. */
const STOP_UNANSWERED_MS = 4000;

/** The rank whose pane is selected first: the root cause, else the first failed rank. */
export function defaultSelection(run: IRunBundle): number | 'merged' {
  const ranks = run.ranks.map(r => r.rank);
  if (run.error && run.error.rank !== null && ranks.includes(run.error.rank)) {
    return run.error.rank;
  }
  const failed = run.ranks.find(r => r.status === 'failed');
  if (failed) {
    return failed.rank;
  }
  return run.ranks.length === 1 ? run.ranks[0].rank : 'merged';
}

/** Options of a view. */
export interface ILiveViewOptions {
  /** Tab to show instead of the default (kept across re-renders of one output). */
  selected?: number | 'merged' | null;
  /** Called when the user picks a tab. */
  onSelect?: (sel: number | 'merged') => void;
  /** A live run (the default): elapsed time and Stop while it is active. False for a saved run. */
  live?: boolean;
}

/** Seconds since the kernel started the run are not known to a saved run: nothing to stop. */
class StaticSource implements ILiveSource {
  readonly output = new LiveOutput(Number.POSITIVE_INFINITY);
  readonly stopRequested = false;
  readonly stopAcknowledged = false;
  constructor(
    private _run: IRunBundle,
    private _xrayHtml: string | null = null
  ) {}
  run(): IRunBundle {
    return this._run;
  }
  xrayHtml(): string | null {
    return this._xrayHtml;
  }
  startedAt(): number | null {
    return null;
  }
  stop(): void {
    // a saved run is over
  }
}

/**
 * A saved run into `host`: the same view as the live one, over the run's kept output.
 * `tails` are each rank's chunks (`[stream, text]` or `["display", item]`); without them, a
 * version 1 bundle's per-rank `output`.  Returns the view (dispose it with its host).
 */
export function renderRun(
  host: HTMLElement,
  run: IRunBundle,
  options: ILiveViewOptions & {
    tails?: Record<string, ReadonlyArray<readonly [string, unknown]>>;
    /** Whose chunk of `tails` came next (`parseOrder`); without it the ranks are merged by position. */
    order?: readonly number[] | null;
    /** The collectives X-ray's drawing, as the bundle's `text/html` keeps it. */
    xrayHtml?: string | null;
  } = {}
): LiveView {
  const src = new StaticSource(run, options.xrayHtml ?? null);
  const tails: Record<string, ReadonlyArray<readonly [string, unknown]>> = options.tails ?? {};
  if (!options.tails) {
    for (const r of run.ranks) {
      tails[String(r.rank)] = r.output;
    }
  }
  const elided: Record<string, number> = {};
  for (const r of run.ranks) {
    elided[String(r.rank)] = r.elided_lines;
  }
  const order = options.tails ? (options.order ?? null) : null;
  src.output.reset(tails, elided, order);
  if (order === null) {
    src.output.interleave(); // a bundle saved before it kept the order
  }
  return new LiveView(host, src, { ...options, live: false });
}


/**
 * One view of a run, drawn into `host`: header, banner, tabs (a chip per rank), and the selected
 * tab's `Pane`.  `refresh` redraws what changed of the run's records; output goes to the pane.
 */
export class LiveView {
  constructor(host: HTMLElement, src: ILiveSource, options: ILiveViewOptions = {}) {
    this._src = src;
    this._live = options.live !== false;
    this._onSelect = options.onSelect;
    this._root = h('div', { class: this._live ? 'nbs-Run nbs-mod-live' : 'nbs-Run' });
    this._tabs = h('div', { class: 'nbs-Tabs', role: 'tablist', 'aria-label': 'Ranks' });
    this._host = h('div', { class: 'nbs-Pane-host', role: 'tabpanel' });
    this._clock = h('span', { class: 'nbs-Meta-value nbs-Clock' });
    this._stopBtn = h(
      'button',
      { class: 'nbs-Stop', type: 'button', title: 'Stop every rank (as an interrupt would)' },
      h('span', { class: 'nbs-Stop-icon', 'aria-hidden': 'true' }),
      h('span', { class: 'nbs-Stop-label' }, 'Stop')
    ) as HTMLButtonElement;
    this._stopBtn.addEventListener('click', () => {
      // again if the kernel has not answered (a frontend may have held the first one back)
      if (!this._src.stopAcknowledged) {
        this._src.stop(); // first, before any drawing: the message leaves now
        this._stopClickedAt = Date.now();
        this._stopHintShown = false;
        this.refresh();
      }
    });
    this._whereBtn = h(
      'button',
      { class: 'nbs-Where-button', type: 'button', title: 'Where is every rank right now? (their stacks, grouped)' },
      'Where?'
    ) as HTMLButtonElement;
    this._whereBtn.addEventListener('click', () => {
      this._src.where?.();
      this.refresh();
    });
    this._wherePanel = h('div', { class: 'nbs-Where', hidden: '' });
    this._root.append(this._wherePanel, this._tabs, this._host, this._xray.node);
    host.textContent = '';
    host.appendChild(this._root);
    attachTabKeys(this._tabs, sel => this._pick(sel));
    this._unsubscribe = src.output.subscribe((u: ILiveUpdate) => this._pane?.update(u));
    if (options.selected !== undefined && options.selected !== null) {
      this._wanted = options.selected;
    }
    this.refresh();
  }

  /** Redraw what changed of everything but the output: header, banner, chips, the pane's head. */
  refresh(): void {
    if (this._disposed) {
      return;
    }
    const run = this._src.run();
    this._run = run;
    this._pane?.setRun(run);
    this._root.setAttribute('data-status', run.status);
    const active = this._live && ACTIVE.has(run.status);
    if (active && this._timer === null) {
      this._timer = window.setInterval(() => this._tick(), 1000);
    } else if (!active && this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
    this._updateClock();
    this._refreshHeader(run, active);
    this._refreshWhere(active);
    this._refreshTabs(run);
    this._xray.update(run.xray, this._src.xrayHtml?.() ?? null);

    // the selection: the default first, the failed rank's pane as soon as one fails
    const failed = run.ranks.some(r => r.status === 'failed');
    let sel = this._selected;
    if (sel === null && this._wanted !== null && this._valid(this._wanted)) {
      sel = this._wanted;
      this._failureShown = failed;
    }
    if (sel === null || !this._valid(sel)) {
      sel = run.ranks.length ? defaultSelection(run) : null;
    }
    if (failed && !this._failureShown) {
      this._failureShown = true;
      if (this._live) {
        sel = defaultSelection(run);
      }
    }
    if (sel === null) {
      if (this._selected === null && !this._host.firstChild) {
        this._host.appendChild(h('div', { class: 'nbs-Empty' }, 'no rank has started'));
      }
    } else if (sel !== this._selected) {
      this._select(sel);
    } else {
      this._pane?.refreshHead();
    }
  }

  dispose(): void {
    this._disposed = true;
    this._unsubscribe();
    if (this._timer !== null) {
      window.clearInterval(this._timer);
    }
    this._pane?.dispose();
  }

  /**
   * The run ended at `at` (`performance.now()`) without the kernel saying so (it died, or restarted):
   * the clock shows the run's length then, as it stops.
   */
  endClock(at: number): void {
    const start = this._src.startedAt();
    if (start !== null) {
      this._clock.textContent = formatElapsed((at - start) / 1000);
    }
  }

  /** Select a tab (a rank or `'merged'`), as a click on it would. */
  select(sel: Sel): void {
    this._pick(sel);
  }

  // -- chrome ----------------------------------------------------------------------------------

  private _refreshHeader(run: IRunBundle, active: boolean): void {
    const unanswered = this._stopUnanswered();
    // redrawn when what it draws changes: the header's facts are all it draws (header.ts), and the rest
    // here is what decides its extras and the Stop button
    const facts = headerFacts(run);
    const key = JSON.stringify([facts, active, this._src.stopRequested, this._src.stopAcknowledged, unanswered]);
    if (key !== this._headerKey) {
      this._headerKey = key;
      const header = buildHeader(facts, { meta: active ? [metaEntry('elapsed', this._clock)] : [] });
      const hint = this._updateStopButton(unanswered);
      this._placeHeader(header, active ? [...(this._src.where ? [this._whereBtn] : []), this._stopBtn] : [], active && hint);
    }
    const bannerKey = JSON.stringify([run.status, run.error, run.ranks.map(r => r.rank)]);
    if (bannerKey !== this._bannerKey) {
      this._bannerKey = bannerKey;
      for (const node of this._banner) {
        node.remove();
      }
      this._banner = buildBanner(run, rank => this._pick(rank));
      this._header!.after(...this._banner);
    }
  }

  /**
   * The redrawn header in place of the old one, its buttons (Where?, Stop) never leaving the page.
   * The header is redrawn whenever its figures change (each rank's memory, every few seconds), and
   * Chromium sends a click whose press and release straddle the removal of its button to the
   * button's old parent: a redraw between the two, on a busy machine, lost the user's click. So the
   * first header stays and takes the new one's rows, and `_actions` (the buttons' row) is the same
   * element throughout: of its children, only what comes or goes is put in or taken out.
   */
  private _placeHeader(next: HTMLElement, actions: HTMLElement[], stopHint: boolean): void {
    const row = this._actions;
    // what leaves goes, what comes is put in its place: a button that stays is never moved
    for (const child of [...row.children]) {
      if (!actions.includes(child as HTMLElement)) {
        child.remove();
      }
    }
    let at = row.firstElementChild;
    for (const action of actions) {
      if (action === at) {
        at = at.nextElementSibling;
      } else {
        row.insertBefore(action, at);
      }
    }
    const old = this._header;
    if (old === null) {
      this._root.prepend(next);
      this._header = next;
    } else {
      const oldMain = old.querySelector(':scope > .nbs-Header-main')!;
      for (const child of [...oldMain.childNodes]) {
        if (child !== row) {
          child.remove();
        }
      }
      const nextMain = next.querySelector(':scope > .nbs-Header-main')!;
      oldMain.prepend(...nextMain.childNodes);
      old.querySelector(':scope > .nbs-Header-meta')!.replaceWith(next.querySelector(':scope > .nbs-Header-meta')!);
    }
    const main = this._header!.querySelector(':scope > .nbs-Header-main')!;
    if (actions.length === 0) {
      row.remove();
    } else if (row.parentNode !== main) {
      main.appendChild(row);
    }
    // a line of its own under the header's rows: in the buttons' row it moved them under the pointer
    if (!stopHint) {
      this._stopHint.remove();
    } else if (this._stopHint.parentNode !== this._header) {
      this._header!.appendChild(this._stopHint);
    }
  }

  /** The Where answer, under the header while the run goes on (its × closes it). */
  private _refreshWhere(active: boolean): void {
    const text = active ? this._src.whereText ?? null : null;
    const key = JSON.stringify([text, this._whereClosed]);
    if (key === this._whereKey) {
      return;
    }
    this._whereKey = key;
    this._whereBtn.disabled = text === '';
    const panel = this._wherePanel;
    if (text === null || (this._whereClosed && text === this._whereClosedText)) {
      panel.hidden = true;
      return;
    }
    const close = h('button', { class: 'nbs-Where-close', type: 'button', title: 'Close', 'aria-label': 'Close' }, '\u00d7');
    close.addEventListener('click', () => {
      this._whereClosed = true;
      this._whereClosedText = text;
      this.refresh();
    });
    this._whereClosed = false;
    panel.replaceChildren(
      h('div', { class: 'nbs-Where-head' }, h('b', {}, 'Where every rank is'), close),
      h('pre', { class: 'nbs-Where-text' }, text === '' ? 'asking the ranks\u2026' : text)
    );
    panel.hidden = false;
  }

  private _refreshTabs(run: IRunBundle): void {
    const ranks = run.ranks.map(r => r.rank);
    const xray = this._hasXRay(run);
    const layout = JSON.stringify([ranks, xray]);
    if (layout !== this._tabsLayout) {
      this._tabsLayout = layout;
      this._chips.clear();
      this._tabs.textContent = '';
      this._tabs.classList.toggle('nbs-mod-compact', ranks.length > 16);
      if (ranks.length > 1) {
        const merged = buildMergedTab();
        merged.addEventListener('click', () => this._pick('merged'));
        this._tabs.appendChild(merged);
      }
      if (xray) {
        const tab = buildXRayTab();
        tab.addEventListener('click', () => this._pick('xray'));
        this._tabs.appendChild(tab);
      }
      if (this._xrayShown && !xray) {
        this._showXRay(false);
      }
    }
    for (const r of run.ranks) {
      const key = rankKey(r, run);
      const had = this._chips.get(r.rank);
      if (had?.key === key) {
        continue;
      }
      const chip = buildChip(r, run);
      chip.addEventListener('click', () => this._pick(r.rank));
      if (had) {
        had.el.replaceWith(chip);
      } else {
        this._tabs.appendChild(chip);
      }
      this._chips.set(r.rank, { key, el: chip });
    }
    if (this._xrayShown) {
      markSelected(this._tabs, 'xray');
    } else if (this._selected !== null) {
      markSelected(this._tabs, this._selected);
    }
  }

  /** Whether the run has an X-ray to show (in words, or drawn). */
  private _hasXRay(run: IRunBundle): boolean {
    return Boolean(run.xray || this._src.xrayHtml?.());
  }

  /** The X-ray's panel in place of the pane (or the pane back). */
  private _showXRay(on: boolean): void {
    this._xrayShown = on;
    if (on) {
      this._xray.retheme(); // a panel that was out of the page when the theme changed
    }
    this._xray.node.hidden = !on;
    this._host.hidden = on;
    markSelected(this._tabs, on ? 'xray' : this._selected ?? 'merged');
  }

  // -- selection -------------------------------------------------------------------------------

  private _valid(sel: Sel): boolean {
    const ranks = this._run?.ranks ?? [];
    return sel === 'merged' ? ranks.length > 1 : ranks.some(r => r.rank === sel);
  }

  private _pick(sel: TabKey): void {
    if (sel === 'xray') {
      if (this._run && this._hasXRay(this._run)) {
        this._showXRay(true);
      }
      return;
    }
    if (this._valid(sel)) {
      if (this._xrayShown) {
        this._showXRay(false);
      }
      this._select(sel);
      this._onSelect?.(sel);
    }
  }

  /** Show the pane of `sel`, built from what is kept. */
  private _select(sel: Sel): void {
    this._selected = sel;
    if (!this._xrayShown) {
      markSelected(this._tabs, sel);
    }
    this._pane?.dispose();
    this._pane = new Pane(this._host, this._src.output, sel, this._run!, this._live);
  }

  // -- header controls -------------------------------------------------------------------------

  private _stopUnanswered(): boolean {
    return (
      this._src.stopRequested &&
      !this._src.stopAcknowledged &&
      this._stopClickedAt !== null &&
      Date.now() - this._stopClickedAt > STOP_UNANSWERED_MS
    );
  }

  /** The Stop button drawn as the run stands; returns whether the hint that it went unanswered shows. */
  private _updateStopButton(unanswered: boolean): boolean {
    const btn = this._stopBtn;
    const requested = this._src.stopRequested;
    btn.disabled = requested;
    btn.classList.toggle('nbs-mod-stopping', requested);
    btn.querySelector('.nbs-Stop-label')!.textContent = requested ? 'Stopping\u2026' : 'Stop';
    this._stopHintShown = unanswered;
    if (unanswered) {
      btn.disabled = false; // let it be tried again
      btn.querySelector('.nbs-Stop-label')!.textContent = 'Stop';
    }
    return unanswered;
  }

  private _updateClock(): void {
    const start = this._src.startedAt();
    const run = this._run;
    if (start !== null && run && ACTIVE.has(run.status)) {
      const text = formatElapsed((performance.now() - start) / 1000);
      if (this._clock.textContent !== text) {
        this._clock.textContent = text;
      }
    }
  }

  private _tick(): void {
    this._updateClock();
    const run = this._run;
    // Stop unanswered for a while: say so (once)
    if (run && ACTIVE.has(run.status) && !this._stopHintShown && this._stopUnanswered()) {
      this.refresh();
    }
  }

  private _src: ILiveSource;
  private _live: boolean;
  private _onSelect?: (sel: Sel) => void;
  private _root: HTMLElement;
  private _header: HTMLElement | null = null;
  /** The header's buttons' row, the same element while the view lives (`_placeHeader`). */
  private _actions: HTMLElement = h('span', { class: 'nbs-Header-actions' });
  private _stopHint: HTMLElement = h(
    'span',
    { class: 'nbs-Stop-hint', role: 'note' },
    'the kernel has not received Stop (this frontend may hold widget messages while a cell runs): use Interrupt'
  );
  private _headerKey = '';
  private _banner: HTMLElement[] = [];
  private _bannerKey = '';
  private _tabs: HTMLElement;
  private _tabsLayout = '';
  private _chips = new Map<number, { key: string; el: HTMLElement }>();
  private _host: HTMLElement;
  private _pane: Pane | null = null;
  private _clock: HTMLElement;
  private _stopBtn: HTMLButtonElement;
  private _whereBtn: HTMLButtonElement;
  private _wherePanel: HTMLElement;
  private _xray = new XRayPanel();
  private _xrayShown = false;
  private _whereKey = '';
  private _whereClosed = false;
  private _whereClosedText: string | null = null;
  private _stopClickedAt: number | null = null;
  private _stopHintShown = false;
  private _run: IRunBundle | null = null;
  private _selected: Sel | null = null;
  private _wanted: Sel | null = null;
  private _failureShown = false;
  private _unsubscribe: () => void;
  private _timer: number | null = null;
  private _disposed = false;
}
