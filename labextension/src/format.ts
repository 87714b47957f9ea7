/** Durations as the views write them (no DOM). */

import type { IRankRecord } from './messages';

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

/** What of a rank's record `costWords` reads. */
export type ICosts = Partial<
  Pick<
    IRankRecord,
    'cpu' | 'rss' | 'peak_rss' | 'gpu' | 'gpu_allocated' | 'gpu_reserved' | 'peak_gpu_allocated' | 'peak_gpu_reserved'
  >
>;

/**
 * What a rank costs, in a few words: "CPU 97% · 1.2 GB · peak 1.4 GB · GPU 0 3.1 GB (4.0 GB reserved)"
 * while it runs; its GPU's peak ("GPU 0 peak 3.5 GB (4.0 GB reserved)") once it ended (what is known of it).
 */
export function costWords(r: ICosts): string {
  return [
    typeof r.cpu === 'number' ? `CPU ${Math.round(r.cpu)}%` : '',
    formatBytes(r.rss),
    r.peak_rss && r.peak_rss !== r.rss ? `peak ${formatBytes(r.peak_rss)}` : '',
    gpuWords(r)
  ]
    .filter(Boolean)
    .join(' · ');
}

function gpuWords(r: ICosts): string {
  if (!r.gpu) {
    return '';
  }
  if (typeof r.gpu_allocated === 'number') {
    return `${r.gpu} ${formatBytes(r.gpu_allocated)} (${formatBytes(r.gpu_reserved ?? 0)} reserved)`;
  }
  return typeof r.peak_gpu_allocated === 'number'
    ? `${r.gpu} peak ${formatBytes(r.peak_gpu_allocated)} (${formatBytes(r.peak_gpu_reserved ?? 0)} reserved)`
    : '';
}
