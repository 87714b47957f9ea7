/**
 * The run view's tabs: the "merged" tab and one status chip per rank, with arrow-key moves between
 * them and which one is selected.  Stateless builders; `view.ts` keeps the selection.
 */

import { h } from './dom';
import { costWords, formatBytes, formatDuration } from './format';
import { rankHue } from './lines';
import { IRankInfo, IRunBundle, statusWords } from './messages';

/** A chip's icon by rank status. */
const RANK_ICON: Record<string, string> = {
  done: '\u2713', // ✓
  failed: '\u2715', // ✕
  failed_after: '\u21b3', // ↳ it failed after the first failure, most often because of it
  stopped: '\u25a0', // ■
  running: '' // spinner drawn in CSS
};

/** The "merged" tab (every rank, prefixed lines). */
export function buildMergedTab(): HTMLElement {
  return h(
    'button',
    {
      class: 'nbs-Tab nbs-Tab-merged',
      type: 'button',
      role: 'tab',
      'data-tab': 'merged',
      title: 'Every rank, lines prefixed with [rank{r}]'
    },
    h('span', { class: 'nbs-Tab-icon', 'aria-hidden': 'true' }, '\u2261'),
    'merged'
  );
}

/** A running rank's memory now, for its chip: "583 MB", "583 MB · GPU 3.1 GB"; '' once ended. */
export function chipCost(r: IRankInfo): string {
  if (r.status !== 'running') {
    return '';
  }
  const gpu = typeof r.gpu_allocated === 'number' ? `GPU ${formatBytes(r.gpu_allocated)}` : '';
  return [r.rss ? formatBytes(r.rss) : '', gpu].filter(Boolean).join(' · ');
}

/**
 * A rank's tab: its status chip (spinner, ✓ with duration, ✕ with the exception, ↳ "after rank 2" for
 * one that failed after the first failure, ■ with the signal).
 */
export function buildChip(r: IRankInfo, run: IRunBundle): HTMLElement {
  // a rank that finished the cell (a kept world's: back at its prompt) without entering the collective
  // the others wait in says so: "never entered all_reduce #1", the hang's cause (issue #57)
  const note = (r.status === 'running' || r.status === 'done') && r.note ? r.note : null;
  const cost = chipCost(r);
  // stopped in a hang: where it was then, as its chip said while it ran (the signal goes in the title);
  // failed for lack of GPU memory: what each rank held on that GPU (in the title: the chip says the error)
  const where = (r.status === 'stopped' || r.status === 'failed') && r.note ? r.note : null;
  const detail =
    r.status === 'failed'
      ? r.summary ?? (r.exit_code !== null ? `exit ${r.exit_code}` : 'failed')
      : r.status === 'failed_after'
        ? typeof r.after === 'number'
          ? `after rank ${r.after}`
          : 'failed after'
        : r.status === 'stopped'
          ? where
            ? shortNote(where)
            : r.signal ?? 'stopped'
        : r.status === 'done'
          ? note
            ? shortNote(note)
            : formatDuration(r.duration)
          : note
            ? shortNote(note)
            : 'running';
  const title = [
    `rank ${r.rank}: ${statusWords(r)}`,
    note ?? where,
    r.summary,
    r.duration !== null ? formatDuration(r.duration) : null,
    r.exit_code !== null ? `exit code ${r.exit_code}` : null,
    costWords(r) || null
  ]
    .filter(Boolean)
    .join(' — ');
  const chip = h(
    'button',
    {
      class: 'nbs-Tab nbs-Chip',
      type: 'button',
      role: 'tab',
      'data-rank': String(r.rank),
      'data-status': r.status,
      title
    },
    h('span', { class: 'nbs-Chip-icon', 'aria-hidden': 'true' }, RANK_ICON[r.status] ?? ''),
    h('span', { class: 'nbs-Chip-rank' }, String(r.rank)),
    detail ? h('span', { class: 'nbs-Chip-detail' }, detail) : null,
    // while it runs, the memory it holds now (and what its torch has allocated on its GPU): which rank grows is seen at a glance
    cost ? h('span', { class: 'nbs-Chip-cost' }, cost) : null
  );
  if (run.error && run.error.rank === r.rank) {
    chip.classList.add('nbs-mod-rootcause');
  }
  if (note && r.prompt) {
    chip.classList.add('nbs-mod-prompt'); // at a breakpoint or input(): the kernel's stdin (or %spawn debug) answers
    chip.setAttribute('data-prompt', r.prompt);
  } else if (note) {
    chip.classList.add('nbs-mod-waiting'); // the run looks hung: this rank waits, or others wait for it
  }
  chip.style.setProperty('--nbs-rank-hue', String(rankHue(r.rank)));
  return chip;
}

/** A note's head, for a chip: "waiting in barrier #3 for 25 s", "has not entered barrier #3". */
function shortNote(note: string): string {
  return note.split(/; | \(/)[0];
}

/** A tab: a rank's, the merged one, or the collectives X-ray's. */
export type TabKey = number | 'merged' | 'xray';

/** Which tab a tab element stands for. */
export function tabKey(el: Element): TabKey {
  if (el.getAttribute('data-tab') === 'xray') {
    return 'xray';
  }
  const rank = el.getAttribute('data-rank');
  return rank === null ? 'merged' : Number(rank);
}

/** Arrow keys, Home and End move between the tabs of `tabs`. */
export function attachTabKeys(tabs: HTMLElement, pick: (sel: TabKey) => void): void {
  tabs.addEventListener('keydown', ev => {
    const els = [...tabs.querySelectorAll<HTMLElement>('.nbs-Tab')];
    const cur = els.findIndex(el => el.getAttribute('aria-selected') === 'true');
    let next = -1;
    if (ev.key === 'ArrowRight' || ev.key === 'ArrowDown') {
      next = (cur + 1) % els.length;
    } else if (ev.key === 'ArrowLeft' || ev.key === 'ArrowUp') {
      next = (cur - 1 + els.length) % els.length;
    } else if (ev.key === 'Home') {
      next = 0;
    } else if (ev.key === 'End') {
      next = els.length - 1;
    }
    if (next >= 0 && els.length) {
      ev.preventDefault();
      pick(tabKey(els[next]));
      // the tab may have been re-created by the pick
      tabs.querySelectorAll<HTMLElement>('.nbs-Tab')[next]?.focus();
    }
  });
}

/** Mark one tab selected (and focusable), the others not. */
export function markSelected(tabs: HTMLElement, sel: TabKey): void {
  for (const el of tabs.querySelectorAll<HTMLElement>('.nbs-Tab')) {
    const on = tabKey(el) === sel;
    el.setAttribute('aria-selected', on ? 'true' : 'false');
    el.tabIndex = on ? 0 : -1;
    el.classList.toggle('nbs-mod-selected', on);
  }
}
