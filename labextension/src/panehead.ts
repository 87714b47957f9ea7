/**
 * The first rows of a pane: a rank's title, facts and log-file buttons, its traceback box, or the
 * merged pane's head.  Stateless builders; `pane.ts` puts them above the output.
 */

import { h } from './dom';
import { costWords, formatDuration } from './format';
import { IRankInfo, IRunBundle, statusWords } from './messages';

/** A log file as a compact button: its name; the full path in the tooltip, copied on click. */
function fileButton(path: string | null): HTMLElement | null {
  if (!path) {
    return null;
  }
  const name = path.split('/').pop() || path;
  const btn = h(
    'button',
    { class: 'nbs-File', type: 'button', title: `${path}\n(click to copy the path)` },
    h('span', { class: 'nbs-File-icon', 'aria-hidden': 'true' }),
    h('span', { class: 'nbs-File-name' }, name)
  );
  const label = btn.querySelector('.nbs-File-name')!;
  btn.addEventListener('click', () => {
    void navigator.clipboard?.writeText(path).then(
      () => {
        label.textContent = 'path copied';
        window.setTimeout(() => (label.textContent = name), 1200);
      },
      () => undefined
    );
  });
  return btn;
}

/** A rank pane's first row: title, facts (pid, status, exit code, signal, time), log files. */
export function paneHead(rank: IRankInfo): HTMLElement {
  const facts = [
    rank.pid !== null ? `pid ${rank.pid}` : null,
    statusWords(rank),
    rank.exit_code !== null && rank.exit_code !== 0 ? `exit code ${rank.exit_code}` : null,
    rank.signal,
    rank.duration !== null ? formatDuration(rank.duration) : null,
    costWords(rank) || null
  ].filter(Boolean) as string[];
  return h(
    'div',
    { class: 'nbs-Pane-head' },
    h('span', { class: 'nbs-Pane-title' }, rank.node ? `rank ${rank.rank} · ${rank.node}` : `rank ${rank.rank}`),
    h('span', { class: 'nbs-Pane-facts' }, facts.join(' · ')),
    h(
      'span',
      { class: 'nbs-Pane-files' },
      fileButton(rank.stdout_path),
      fileButton(rank.stderr_path)
    )
  );
}

/** A failed (or stopped) rank's traceback or stack, first thing in its pane; null if it has none. */
export function tracebackBox(rank: IRankInfo, run: IRunBundle): HTMLElement | null {
  const tb = rank.traceback ?? (run.error && run.error.rank === rank.rank ? run.error.traceback : null);
  if (!(tb || ((rank.status === 'failed' || rank.status === 'failed_after') && rank.summary))) {
    return null;
  }
  return h(
    'div',
    { class: 'nbs-Traceback' },
    h('div', { class: 'nbs-Traceback-summary' }, rank.summary ?? run.error?.summary ?? 'failed'),
    // out of GPU memory: what each rank held on that GPU
    rank.status === 'failed' && rank.note ? h('div', { class: 'nbs-Traceback-note' }, rank.note) : null,
    tb ? h('pre', { class: 'nbs-Traceback-text' }, tb) : null
  );
}

/** The merged pane's first row. */
export function mergedHead(facts: string): HTMLElement {
  return h(
    'div',
    { class: 'nbs-Pane-head' },
    h('span', { class: 'nbs-Pane-title' }, 'all ranks'),
    h('span', { class: 'nbs-Pane-facts' }, facts)
  );
}
