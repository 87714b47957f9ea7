/** Durations as the views write them (no DOM). */

/** `0.84 s`, `12.3 s`, `2 min 05 s`, `1 h 02 min`: how long a rank or a run took. */
export function formatDuration(seconds: number | null): string {
  if (seconds === null) {
    return '';
  }
  if (seconds < 10) {
    return `${seconds.toFixed(2)} s`;
  }
  if (seconds < 60) {
    return `${seconds.toFixed(1)} s`;
  }
  const s = Math.round(seconds);
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  }
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
}

/** `7 s`, `1 min 05 s`, `1 h 02 min`: a clock that ticks once a second. */
export function formatElapsed(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  }
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
}

/**
 * What a run's banner says when someone stopped it: how, as the kernel recorded it (`%spawn stop`,
 * `run.stop()`), or its Stop button when that was it or nothing was said (a bundle saved before).
 */
export function stoppedByUser(how: string | null | undefined): string {
  return `stopped by you (${how && how !== 'Stop button' ? how : 'Stop'})`;
}

/** `5.1 GB`, `850 MB` (decimal, as the kernel's `gigabytes` writes them); `''` for null. */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return '';
  }
  return bytes >= 1e9 ? `${(bytes / 1e9).toFixed(1)} GB` : `${Math.round(bytes / 1e6)} MB`;
}

/** What a rank costs, in a few words: "CPU 97% · 1.2 GB · peak 1.4 GB" (what is known of it). */
export function costWords(r: { cpu?: number | null; rss?: number | null; peak_rss?: number | null }): string {
  return [
    typeof r.cpu === 'number' ? `CPU ${Math.round(r.cpu)}%` : '',
    formatBytes(r.rss),
    r.peak_rss && r.peak_rss !== r.rss ? `peak ${formatBytes(r.peak_rss)}` : ''
  ]
    .filter(Boolean)
    .join(' · ');
}
