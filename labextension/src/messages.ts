/**
 * The wire: every message and record the kernel side sends or receives (docs/run-bundle.md), as
 * TypeScript types, and their tolerant decoding.  No DOM, no JupyterLab: the widget bundle, the
 * JupyterLab extension and the unit tests all read the kernel through this one module.
 *
 * Kernel side: `nbspawn/views/_bundle.py` (the run and rank records, the frozen bundle),
 * `nbspawn/views/_widget.py` (the live widget's traits and messages, the live display's info),
 * `nbspawn/views/_status.py` (the `nbspawn.status` comm), `nbspawn/events/_display.py` (display
 * items).  Everything that arrives is untrusted JSON: decoders coerce wrong or missing fields to
 * neutral values and never throw.
 */

// -- names ------------------------------------------------------------------------------------------

/** The frozen run (`_bundle.MIME`). */
export const RUN_MIME_TYPE = 'application/vnd.nbspawn.run+json';
/** The live display's facts, beside the widget view (`_widget.LIVE_MIME`). */
export const LIVE_MIME_TYPE = 'application/vnd.nbspawn.live+json';
/** ipywidgets' view of a widget model (anywidget's too). */
export const WIDGET_VIEW_MIME_TYPE = 'application/vnd.jupyter.widget-view+json';
/** A widget tree a rank built, reduced by the kernel (`events._display.WIDGET_MIME`). */
export const WIDGET_MIME = 'application/vnd.nbspawn.widget+json';
/** The toolbar item's comm target (`_status.TARGET`). */
export const STATUS_COMM_TARGET = 'nbspawn.status';

// -- records, as the kernel sends them (`_bundle.run_record`, `_bundle.rank_record`) ----------------

export type RunStatus = 'starting' | 'running' | 'succeeded' | 'failed' | 'timeout' | 'interrupted' | 'stopped';
/** `failed_after`: it failed once the run's first failure had (`after` names that rank), most often because of it. */
export type RankStatus = 'starting' | 'running' | 'done' | 'failed' | 'failed_after' | 'stopped';

/** A display item (docs §2): `data`, an `update` of earlier items with its id, or a `clear`. */
export interface IDisplayItemRecord {
  kind?: 'data' | 'update' | 'clear';
  id?: string | null;
  mime?: string;
  /** A string; an object for `application/vnd.nbspawn.widget+json` (an `IWidgetTree`). */
  value?: unknown;
  /** The item's text/plain repr. */
  text?: string;
  meta?: { width?: number; height?: number; unconfined?: boolean; alt?: string };
  /** `clear`: when the rank's next output arrives. */
  wait?: boolean;
}

/** A widget tree (docs §2), drawn without a widget manager. */
export type IWidgetTree =
  | { type: 'box'; dir: 'row' | 'column'; children: IWidgetTree[] }
  | {
      type: 'progress';
      value: number;
      min: number;
      max: number;
      bar_style: '' | 'success' | 'info' | 'warning' | 'danger';
      description?: string;
    }
  | { type: 'text'; value: string }
  | { type: 'other'; text: string };

/** One piece of a rank's output: text of a stream, or a display item. */
export type OutputChunk = [stream: 'stdout' | 'stderr', text: string] | [stream: 'display', item: IDisplayItemRecord];
/** The same, in a live message that carries every rank's output. */
export type RankChunk =
  | [rank: number, stream: 'stdout' | 'stderr', text: string]
  | [rank: number, stream: 'display', item: IDisplayItemRecord];

export interface IRunErrorRecord {
  /** The root cause's rank, if a rank failed first. */
  rank: number | null;
  summary: string;
  /** A stopped run: what stopped it (`%spawn stop`, `run.stop()`, `Stop button`); absent before 0.x. */
  stopped_by?: string | null;
  /** A run stopped while hung (timeout, interrupt, Stop): why, "rank 1 never entered barrier #1 (…)". */
  verdict?: string | null;
  /** The root rank failed because a peer skipped a collective and finished the cell: that, which the summary leads with. */
  cause?: string | null;
}

export interface IRankRecord {
  rank: number;
  pid: number | null;
  status: RankStatus;
  /** `failed_after`: the rank whose failure came first (the chip reads "after rank 2"); absent before it existed. */
  after?: number | null;
  exit_code: number | null;
  signal: string | null;
  duration: number | null;
  summary: string | null;
  traceback: string | null;
  elided_lines: number;
  stdout_path: string | null;
  stderr_path: string | null;
  display_path: string | null;
  /** A cluster run's rank: its node, e.g. "node 1 (hostb)"; its log paths are then `host:path`. */
  node: string | null;
  /**
   * While it runs and the run looks hung: "waiting in barrier #3 for 25 s; rank 2 has not entered it";
   * a rank stopped in a hang keeps where it was then ("has not entered barrier #3 (Cell In[5], line 6: …)").
   */
  note?: string | null;
  /** At a prompt now: "pdb" (a breakpoint or post-mortem; its note says where) or "input" (input(), getpass()). */
  prompt?: string | null;
  /** What it costs (its children included), sampled about once a second: CPU now (% of one core) and
   * resident memory now, while it runs; its peak in the run (bytes). Absent before they existed. */
  cpu?: number | null;
  rss?: number | null;
  peak_rss?: number | null;
  /** On the GPUs it used ("GPU 0"): what its torch has allocated and reserved there now (while it
   * runs), and the most of each in the run (bytes). Null where it used none. */
  gpu?: string | null;
  gpu_allocated?: number | null;
  gpu_reserved?: number | null;
  peak_gpu_allocated?: number | null;
  peak_gpu_reserved?: number | null;
  /** Version 1 bundles only: the kept output (version 2 keeps it in the bundle's `text/html`). */
  output?: OutputChunk[];
}

/** The machine's memory (or its container's limit, the tighter) at the last sample, in bytes. */
export interface IMemoryRecord {
  total: number;
  used: number;
  source: 'machine' | 'container';
}

/** A GPU the ranks used: what their torch reserved on it (now while they run, else the most they held there together) of its total, bytes. */
export interface IGpuRecord {
  gpu: string;
  name: string;
  total: number;
  reserved: number;
}

/** What a rank's status says in words: "failed after rank 2" for one that failed once rank 2 had. */
export function statusWords(r: Pick<IRankRecord, 'status' | 'after'>): string {
  return r.status === 'failed_after' && typeof r.after === 'number' ? `failed after rank ${r.after}` : r.status;
}

export interface IRunRecord {
  version: number;
  run_id: string;
  nprocs: number;
  start_method: string;
  /** A program's run: its command line (its start method and backend are the program's own). */
  program: string | null;
  backend: string;
  /** Where the logs are; a cluster run's node directories, `host:path; host:path`. */
  log_dir: string;
  /** Seconds since the epoch (the kernel's clock). */
  started_at: number;
  duration: number | null;
  status: RunStatus;
  /** The kept world this cell ran on, and which of its cells it is (from 1). */
  world: string | null;
  world_cell: number | null;
  error: IRunErrorRecord | null;
  /** `text/html`: each rank's output is in the bundle's HTML (version 2); `""`: in `ranks[].output`. */
  output_in: 'text/html' | '';
  /** The collectives X-ray in words (its drawing: the bundle's `text/html`, or the widget's `xray_html`). */
  xray?: string | null;
  memory?: IMemoryRecord | null;
  /** Said once, when the ranks brought the memory in use (or a GPU's) near its end. */
  memory_warning?: string | null;
  /** The GPUs the ranks used (none: []). */
  gpus?: IGpuRecord[];
  ranks: IRankRecord[];
}

// -- the live widget (`_widget.py`; browser: widget.ts, follow.ts) ---------------------------------

/** The synced traits. */
export interface IWidgetState {
  /** The run record without `ranks`, plus the seconds since it started and whether Stop was heard. */
  header: Omit<IRunRecord, 'ranks'> & { elapsed: number; stopping: boolean };
  ranks: IRankRecord[];
  error: IRunErrorRecord | null;
  /** The collectives X-ray's drawing (static HTML and SVG, shown in a sandboxed frame), '' until there is one. */
  xray_html: string;
}

/** Kernel → browser, at most ten a second: new output, and lines of a rank the kernel skipped. */
export interface IOutputMessage {
  type: 'output';
  chunks: RankChunk[];
  elided: Record<string, number>;
}

/** Kernel → browser: everything the kernel kept (`update` and `clear` applied), for a `replay`. */
export interface IReplayMessage {
  type: 'replay';
  tails: Record<string, OutputChunk[]>;
  /** Whose chunk of `tails` came next, in the order they were printed (`parseOrder`). */
  order: string;
  elided: Record<string, number>;
}

/** Browser → kernel (a widget custom message): catch up on what was kept, stop the run, or ask
 * where every rank is now (`%spawn where`, answered with a `where` message). */
export type WidgetRequest = { type: 'replay' } | { type: 'stop' } | { type: 'where' };

/** Kernel → browser: every rank's stack now, ranks at the same line grouped (`%spawn where`'s text). */
export interface IWhereMessage {
  type: 'where';
  text: string;
}

/** The data of a widget comm message, as this front end sends it (ipywidgets' protocol). */
export type WidgetCommData = { method: 'custom'; content: WidgetRequest } | { method: 'request_state' };

/** A live display's `application/vnd.nbspawn.live+json` (docs §3). */
export interface ILiveInfo {
  run_id: string;
  /** The widget's model (its comm id). */
  model_id: string;
  /** The live display's id: its `update_display_data` is the run's end. */
  display_id: string;
  started_at: number | null;
  nprocs: number | null;
  log_dir?: string;
}

// -- the status comm (`_status.status_data`; browser: status.ts) -----------------------------------

/** `comm_open` and `comm_msg` data of `nbspawn.status`. */
export interface IRunStatus {
  run_id: string;
  /** `running` while the run is active, then its final status. */
  status: string;
  nprocs: number;
  /** Ranks still running; null when the kernel did not say (then all `nprocs` count). */
  running: number[] | null;
}

// -- decoding ---------------------------------------------------------------------------------------

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

/** A run as the views read it: a run record with every field present (`parseBundle`). */
export interface IRunError {
  rank: number | null;
  summary: string;
  /** A stopped run: what stopped it, as the kernel recorded it (null: not said). */
  stopped_by: string | null;
  /** A run stopped while hung: why (null: not hung, or a bundle saved before verdicts were kept). */
  verdict: string | null;
  /** A peer's skipped collective that made the root rank fail (null: none); the summary leads with it. */
  cause: string | null;
  /** Not sent by the kernel today (the rank's record has it); `""` then. */
  traceback: string;
}

/** A rank record with every field present; `output` is `[]` unless a version 1 bundle has it. */
export interface IRankInfo extends Omit<IRankRecord, 'output'> {
  output: [string, unknown][];
}

export interface IRunBundle extends Omit<IRunRecord, 'status' | 'error' | 'output_in' | 'ranks' | 'started_at' | 'xray'> {
  started_at: number | null;
  xray: string | null;
  /** A `RunStatus`, or whatever a newer kernel sends. */
  status: string;
  error: IRunError | null;
  output_in: string;
  ranks: IRankInfo[];
}

/** The run's memory figures, or null when absent or malformed. */
function memoryRecord(value: unknown): IMemoryRecord | null {
  if (!value || typeof value !== 'object') {
    return null;
  }
  const m = record(value);
  const total = num(m.total);
  const used = num(m.used);
  return total !== null && used !== null ? { total, used, source: m.source === 'container' ? 'container' : 'machine' } : null;
}

function gpuRecords(value: unknown): IGpuRecord[] {
  return (Array.isArray(value) ? (value as unknown[]) : [])
    .filter(g => g && typeof g === 'object')
    .map(g => record(g))
    .map(g => ({ gpu: str(g.gpu), name: str(g.name), total: num(g.total) ?? 0, reserved: num(g.reserved) ?? 0 }))
    .filter(g => g.gpu);
}

/** Coerce untrusted JSON to a bundle: wrong or missing fields get neutral values, never throw. */
export function parseBundle(data: unknown): IRunBundle {
  const d = record(data);
  const ranks: IRankInfo[] = (Array.isArray(d.ranks) ? (d.ranks as unknown[]) : [])
    .filter(r => r && typeof r === 'object')
    .map((v, i) => {
      const r = record(v);
      return {
        rank: num(r.rank) ?? i,
        pid: num(r.pid),
        status: (str(r.status, 'running') as RankStatus) || 'running',
        after: num(r.after),
        exit_code: num(r.exit_code),
        signal: strOrNull(r.signal),
        duration: num(r.duration),
        summary: strOrNull(r.summary),
        traceback: strOrNull(r.traceback),
        output: (Array.isArray(r.output) ? (r.output as unknown[]) : [])
          .filter((c): c is unknown[] => Array.isArray(c) && c.length >= 2)
          .map((c): [string, unknown] => (c[0] === 'display' ? ['display', c[1]] : [str(c[0], 'stdout'), str(c[1])])),
        elided_lines: num(r.elided_lines) ?? 0,
        stdout_path: strOrNull(r.stdout_path),
        stderr_path: strOrNull(r.stderr_path),
        display_path: strOrNull(r.display_path),
        node: strOrNull(r.node),
        note: strOrNull(r.note),
        prompt: strOrNull(r.prompt),
        cpu: num(r.cpu),
        rss: num(r.rss),
        peak_rss: num(r.peak_rss),
        gpu: strOrNull(r.gpu),
        gpu_allocated: num(r.gpu_allocated),
        gpu_reserved: num(r.gpu_reserved),
        peak_gpu_allocated: num(r.peak_gpu_allocated),
        peak_gpu_reserved: num(r.peak_gpu_reserved)
      };
    });
  const e = d.error && typeof d.error === 'object' ? record(d.error) : null;
  return {
    version: num(d.version) ?? 1,
    run_id: str(d.run_id),
    world: strOrNull(d.world),
    world_cell: num(d.world_cell),
    nprocs: num(d.nprocs) ?? ranks.length,
    start_method: str(d.start_method),
    program: strOrNull(d.program),
    backend: str(d.backend),
    log_dir: str(d.log_dir),
    started_at: num(d.started_at),
    duration: num(d.duration),
    status: str(d.status, 'running'),
    error: e
      ? {
          rank: num(e.rank),
          summary: str(e.summary),
          traceback: str(e.traceback),
          stopped_by: strOrNull(e.stopped_by),
          verdict: strOrNull(e.verdict),
          cause: strOrNull(e.cause)
        }
      : null,
    output_in: str(d.output_in),
    xray: strOrNull(d.xray),
    memory: memoryRecord(d.memory),
    memory_warning: strOrNull(d.memory_warning),
    gpus: gpuRecords(d.gpus),
    ranks
  };
}

/** One display item, as the views read it (`kind` is `data` once updates are applied). */
export interface IDisplayItem {
  kind: string;
  id: string | null;
  mime: string;
  value: unknown;
  text: string;
  meta: Record<string, unknown>;
  wait?: boolean;
}

/** Coerce one untrusted display item; null if it is not one. */
export function parseItem(v: unknown): IDisplayItem | null {
  if (!v || typeof v !== 'object' || Array.isArray(v)) {
    return null;
  }
  const d = record(v);
  const kind = typeof d.kind === 'string' ? d.kind : 'data';
  if (kind !== 'data' && kind !== 'update' && kind !== 'clear') {
    return null;
  }
  return {
    kind,
    id: typeof d.id === 'string' ? d.id : null,
    mime: typeof d.mime === 'string' ? d.mime : 'text/plain',
    value: d.value ?? '',
    text: typeof d.text === 'string' ? d.text : '',
    meta: record(d.meta),
    wait: d.wait === true
  };
}

/** Chunks of rank output as `LiveOutput` takes them: checked there, chunk by chunk. */
export type Chunks = ReadonlyArray<readonly [number, string, unknown]>;
/** Each rank's kept chunks (`[stream, text]` or `["display", item]`), by rank. */
export type Tails = Record<string, ReadonlyArray<readonly [string, unknown]>>;

/**
 * The order the ranks printed in (`nbspawn.views._tail.order_runs`): whose chunk comes next, a run
 * of one rank written `rank*count`: `"1*3,0,2"` is `[1, 1, 1, 0, 2]`.  Null when absent or
 * malformed (a bundle saved before it was kept): the caller merges by position then.
 */
export function parseOrder(text: unknown, max = 1_000_000): number[] | null {
  if (typeof text !== 'string') {
    return null;
  }
  const order: number[] = [];
  for (const run of text ? text.split(',') : []) {
    const m = /^(\d+)(?:\*(\d+))?$/.exec(run);
    if (!m) {
      return null;
    }
    const rank = Number(m[1]);
    const n = m[2] === undefined ? 1 : Number(m[2]);
    if (order.length + n > max) {
      return null;
    }
    for (let i = 0; i < n; i++) {
      order.push(rank);
    }
  }
  return order;
}

/** A widget custom message from the kernel, decoded; the chunks themselves are checked by `LiveOutput`. */
export type WidgetMessage =
  | { type: 'output'; chunks: Chunks; elided: Record<string, number> }
  | { type: 'replay'; tails: Tails; order: number[] | null; elided: Record<string, number> }
  | IWhereMessage;

/** A kernel → browser custom message of the live widget (`IOutputMessage`, `IReplayMessage`); null if neither. */
export function decodeWidgetMessage(msg: unknown): WidgetMessage | null {
  const m = record(msg);
  if (m.type === 'output' && Array.isArray(m.chunks)) {
    // [rank, stream, text] and [rank, "display", item]; LiveOutput skips malformed ones
    return { type: 'output', chunks: m.chunks as Chunks, elided: record(m.elided) as Record<string, number> };
  }
  if (m.type === 'replay') {
    return {
      type: 'replay',
      tails: record(m.tails) as Tails,
      order: parseOrder(m.order),
      elided: record(m.elided) as Record<string, number>
    };
  }
  if (m.type === 'where') {
    return { type: 'where', text: typeof m.text === 'string' ? m.text : '' };
  }
  return null;
}

/** The traits a widget state update (`{method: "update", state}`) sets; absent: not in it. */
export interface IStateUpdate {
  header?: Record<string, unknown>;
  ranks?: unknown[];
  error?: unknown;
}

/** The widget traits of a state update, each only if it is there in a usable form. */
export function decodeState(state: unknown): IStateUpdate {
  const s = record(state);
  const u: IStateUpdate = {};
  if ('header' in s && s.header && typeof s.header === 'object') {
    u.header = record(s.header);
  }
  if ('ranks' in s && Array.isArray(s.ranks)) {
    u.ranks = s.ranks as unknown[];
  }
  if ('error' in s) {
    u.error = s.error ?? null;
  }
  return u;
}

/** A widget comm message's data as seen on iopub: a state update, or a custom message. */
export type WidgetComm = { method: 'update'; state: Record<string, unknown> } | { method: 'custom'; content: unknown };

export function decodeWidgetComm(data: unknown): WidgetComm | null {
  const d = record(data);
  if (d.method === 'update') {
    return { method: 'update', state: record(d.state) };
  }
  if (d.method === 'custom') {
    return { method: 'custom', content: d.content };
  }
  return null;
}

/** The live display's info; null without a model id or a display id. */
export function parseLiveInfo(data: unknown): ILiveInfo | null {
  const d = record(data);
  if (!str(d.model_id) && !str(d.display_id)) {
    return null;
  }
  return {
    run_id: str(d.run_id),
    model_id: str(d.model_id),
    display_id: str(d.display_id),
    started_at: num(d.started_at),
    nprocs: num(d.nprocs),
    log_dir: str(d.log_dir) || undefined
  };
}

/** A status comm's data over the run's last known status (`prev`): what is missing is kept. */
export function parseStatus(data: unknown, prev?: IRunStatus): IRunStatus {
  const d = record(data);
  const running = Array.isArray(d.running)
    ? d.running.filter((r): r is number => typeof r === 'number')
    : (prev?.running ?? null);
  return {
    run_id: typeof d.run_id === 'string' ? d.run_id : (prev?.run_id ?? ''),
    status: typeof d.status === 'string' ? d.status : (prev?.status ?? 'running'),
    nprocs: typeof d.nprocs === 'number' ? d.nprocs : (prev?.nprocs ?? running?.length ?? 0),
    running
  };
}

// -- iopub messages about a run (reattach.ts, follow.ts, stopguard.ts) -------------------------------

/** The fields of a Jupyter iopub message read here. */
export interface IIOPub {
  header: { msg_type: string };
  parent_header?: unknown;
  content: unknown;
}

/** The data and metadata of an `update_display_data` for the display `displayId`; else null. */
export function displayUpdate(
  msg: IIOPub,
  displayId: string | undefined
): { data: Record<string, unknown>; metadata: Record<string, unknown> } | null {
  if (msg.header.msg_type !== 'update_display_data' || !displayId) {
    return null;
  }
  const content = record(msg.content);
  if (record(content.transient).display_id !== displayId) {
    return null;
  }
  return { data: record(content.data), metadata: record(content.metadata) };
}

/**
 * Whether an iopub message shows that the kernel heard a Stop: our copy (`stopMsgId`) was
 * handled, the widget (`modelId`) says it is stopping or closed, or the live display
 * (`displayId`) was replaced by the frozen run.
 */
export function stopHeard(msg: IIOPub, modelId: string, displayId: string, stopMsgId: string): boolean {
  const type = msg.header.msg_type;
  const content = record(msg.content);
  if (type === 'status') {
    // our copy was handled (the handler only sets the flag the supervision loop reads)
    return content.execution_state === 'idle' && stopMsgId !== '' && record(msg.parent_header).msg_id === stopMsgId;
  }
  if (type === 'comm_msg' && content.comm_id === modelId) {
    const data = record(content.data);
    return data.method === 'update' && record(record(data.state).header).stopping === true;
  }
  if (type === 'comm_close') {
    return content.comm_id === modelId;
  }
  if (type === 'update_display_data') {
    return displayId !== '' && record(content.transient).display_id === displayId;
  }
  return false;
}

// -- the runs the kernel remembers per cell (`_active.py`; browser: reattach.ts, kernel.ts) ---------

/** The comm target a page opens to ask which runs its cells should show (`_active.TARGET`). */
export const ACTIVE_COMM_TARGET = 'nbspawn.active';

/** Browser → kernel: the `nbspawn.active` comm's open data (`ActiveRequest`). */
export interface IActiveRequest {
  /** Run ids whose frozen run the page already shows: their bundle is not sent again. */
  have?: string[];
  /** Only these runs (by run id); all when absent. */
  only?: string[];
}

/** One cell's latest run, as the kernel remembers it (`ActiveRun`). */
export interface IActiveRun {
  /** The notebook cell's id (the execute_request's `metadata.cellId`). */
  cell_id: string;
  run_id: string;
  /** The prompt the cell ran under. */
  execution_count: number | null;
  status: 'running' | 'ended';
  /** The live display, while it is shown. */
  live: ILiveInfo | null;
  /** The frozen run's mime bundle once ended; null when the page said it has it. */
  frozen: Record<string, unknown> | null;
}

/** The `nbspawn.active` comm's one message (`ActiveRunsMessage`); null if it is not that. */
export function parseActiveRuns(data: unknown): IActiveRun[] | null {
  const d = record(data);
  if (d.type !== 'active' || !Array.isArray(d.runs)) {
    return null;
  }
  const runs: IActiveRun[] = [];
  for (const item of d.runs) {
    const r = record(item);
    const cellId = str(r.cell_id);
    const runId = str(r.run_id);
    if (!cellId || !runId) {
      continue;
    }
    const live = r.live === null || r.live === undefined ? null : parseLiveInfo(r.live);
    const frozen = r.frozen && typeof r.frozen === 'object' && !Array.isArray(r.frozen) ? record(r.frozen) : null;
    runs.push({
      cell_id: cellId,
      run_id: runId,
      execution_count: num(r.execution_count),
      status: r.status === 'ended' || frozen ? 'ended' : 'running',
      live,
      frozen
    });
  }
  return runs;
}
