/**
 * The `application/vnd.nbspawn.run+json` display bundle (docs/run-bundle.md), and tolerant parsing.
 */

export const RUN_MIME_TYPE = 'application/vnd.nbspawn.run+json';

export type RunStatus = 'running' | 'succeeded' | 'failed' | 'timeout' | 'interrupted' | 'stopped';
export type RankStatus = 'running' | 'done' | 'failed' | 'stopped';

export interface IRunError {
  rank: number | null;
  summary: string;
  traceback: string;
}

export interface IRankInfo {
  rank: number;
  pid: number | null;
  status: RankStatus;
  exit_code: number | null;
  signal: string | null;
  duration: number | null;
  summary: string | null;
  traceback: string | null;
  /** Version 1: the kept output, `[stream, text]` chunks (version 2 keeps it in the `text/html`). */
  output: [string, unknown][];
  elided_lines: number;
  stdout_path: string | null;
  stderr_path: string | null;
  display_path: string | null;
  /** A cluster run's rank: its node, e.g. "node 1 (hostb)"; its log paths are then `host:path`. */
  node: string | null;
}

export interface IRunBundle {
  version: number;
  run_id: string;
  /** The kept world this cell ran on, and which of its cells it is (from 1). */
  world: string | null;
  world_cell: number | null;
  nprocs: number;
  start_method: string;
  backend: string;
  log_dir: string;
  started_at: number | null;
  duration: number | null;
  status: RunStatus | string;
  error: IRunError | null;
  /** Where each rank's output is: `text/html` (version 2), or `""` (in each rank's `output`). */
  output_in: string;
  ranks: IRankInfo[];
}

/** `value` as an object to read fields from; `{}` for anything that is not a plain object. */
export function record(value: unknown): Record<string, unknown> {
  return value && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : {};
}

function str(v: unknown, dflt = ''): string {
  return typeof v === 'string' ? v : dflt;
}

function strOrNull(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** Coerce untrusted JSON to a bundle: wrong or missing fields get neutral values, never throw. */
export function parseBundle(data: unknown): IRunBundle {
  const d = (data && typeof data === 'object' ? data : {}) as Record<string, any>;
  const ranks: IRankInfo[] = (Array.isArray(d.ranks) ? d.ranks : [])
    .filter((r: unknown) => r && typeof r === 'object')
    .map((r: Record<string, any>, i: number) => ({
      rank: num(r.rank) ?? i,
      pid: num(r.pid),
      status: (str(r.status, 'running') as RankStatus) || 'running',
      exit_code: num(r.exit_code),
      signal: strOrNull(r.signal),
      duration: num(r.duration),
      summary: strOrNull(r.summary),
      traceback: strOrNull(r.traceback),
      output: (Array.isArray(r.output) ? r.output : [])
        .filter((c: unknown) => Array.isArray(c) && c.length >= 2)
        .map((c: unknown[]) =>
          c[0] === 'display' ? (['display', c[1]] as [string, unknown]) : ([str(c[0], 'stdout'), str(c[1])] as [string, unknown])
        ),
      elided_lines: num(r.elided_lines) ?? 0,
      stdout_path: strOrNull(r.stdout_path),
      stderr_path: strOrNull(r.stderr_path),
      display_path: strOrNull(r.display_path),
      node: strOrNull(r.node)
    }));
  const e = d.error && typeof d.error === 'object' ? (d.error as Record<string, any>) : null;
  return {
    version: num(d.version) ?? 1,
    run_id: str(d.run_id),
    world: strOrNull(d.world),
    world_cell: num(d.world_cell),
    nprocs: num(d.nprocs) ?? ranks.length,
    start_method: str(d.start_method),
    backend: str(d.backend),
    log_dir: str(d.log_dir),
    started_at: num(d.started_at),
    duration: num(d.duration),
    status: str(d.status, 'running'),
    error: e ? { rank: num(e.rank), summary: str(e.summary), traceback: str(e.traceback) } : null,
    output_in: str(d.output_in),
    ranks
  };
}

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

/** `0.84 s`, `12.3 s`, `2 min 05 s`, `1 h 02 min`. */
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
