/**
 * Terminal-ish text processing for rank output, with no DOM: ANSI SGR colours become styled
 * segments, `\r` rewrites the current line, `\b` erases.  Reusable by any view of rank output.
 *
 * Semantics follow `nbspawn.views._text.settle_line` (and Jupyter's own stream handling): after a
 * `\r`, the next visible character (or `\b`) replaces the whole line, so a progress bar shows only
 * its latest state, and a trailing `\r` leaves the line as it was.  Each stream (stdout, stderr)
 * has its own current line and colour state, as it would on a terminal with two pipes.
 */

/** SGR attributes of a run of text.  Colours are a palette index (0-255) or `#rrggbb`. */
export interface ITextStyle {
  readonly fg?: number | string;
  readonly bg?: number | string;
  readonly bold?: boolean;
  readonly dim?: boolean;
  readonly italic?: boolean;
  readonly underline?: boolean;
  readonly inverse?: boolean;
  readonly strike?: boolean;
}

/** A run of characters sharing one style. */
export interface ISegment {
  text: string;
  readonly style: ITextStyle;
}

/** One output line, in the order lines were started. */
export interface ILine {
  readonly stream: string;
  readonly segments: ISegment[];
  /** Whether a `\n` ended the line (false for the last, still open, line of a stream). */
  complete: boolean;
  /** Whether the line was drawn over (`\r`, erase-line) at least once: a progress bar while open. */
  redrawn?: boolean;
}

const PLAIN: ITextStyle = Object.freeze({});

/** Whether two styles render the same. */
export function sameStyle(a: ITextStyle, b: ITextStyle): boolean {
  return (
    a === b ||
    (a.fg === b.fg &&
      a.bg === b.bg &&
      !!a.bold === !!b.bold &&
      !!a.dim === !!b.dim &&
      !!a.italic === !!b.italic &&
      !!a.underline === !!b.underline &&
      !!a.inverse === !!b.inverse &&
      !!a.strike === !!b.strike)
  );
}

/** A parameter's value: empty is 0 (as terminals read it), anything else not a number is NaN. */
function sgrNumber(p: string | undefined): number {
  return p === undefined ? NaN : p === '' ? 0 : /^[0-9]+$/.test(p) ? Number(p) : NaN;
}

/** `#rrggbb` from three parameters, or undefined if one is not a number. */
function sgrRGB(values: string[]): string | undefined {
  const n = values.map(sgrNumber);
  if (n.length !== 3 || n.some(v => !Number.isFinite(v))) {
    return undefined;
  }
  return '#' + n.map(v => Math.min(255, v).toString(16).padStart(2, '0')).join('');
}

/**
 * The colour of a colon-form `38:5:n`, `38:2::r:g:b` (ITU T.416: a colour-space slot before r, g, b)
 * or `38:2:r:g:b` (the slot left out, as many programs write it); `sub` is what follows the 38.
 */
function colonColour(sub: string[]): number | string | undefined {
  const kind = sgrNumber(sub[0]);
  if (kind === 5 && sub.length >= 2) {
    const n = sgrNumber(sub[1]);
    return n <= 255 ? n : undefined;
  }
  if (kind === 2 && sub.length >= 5) {
    return sgrRGB(sub.slice(2, 5));
  }
  if (kind === 2 && sub.length === 4) {
    return sgrRGB(sub.slice(1, 4));
  }
  return undefined;
}

type MutableStyle = { -readonly [K in keyof ITextStyle]: ITextStyle[K] };
type Flag = 'bold' | 'dim' | 'italic' | 'underline' | 'inverse' | 'strike';

/** The codes that turn one attribute on, and those that turn attributes off. */
const SGR_ON: Readonly<Record<number, Flag>> = {
  1: 'bold',
  2: 'dim',
  3: 'italic',
  4: 'underline',
  7: 'inverse',
  9: 'strike'
};
const SGR_OFF: Readonly<Record<number, readonly (keyof ITextStyle)[]>> = {
  21: ['bold', 'dim'],
  22: ['bold', 'dim'],
  23: ['italic'],
  24: ['underline'],
  27: ['inverse'],
  29: ['strike'],
  39: ['fg'],
  49: ['bg']
};

/** One SGR code that stands alone (not 38/48's extended colours): a reset, an attribute, a colour. */
function applyCode(s: MutableStyle, c: number): void {
  if (c === 0) {
    for (const k of Object.keys(s) as (keyof ITextStyle)[]) {
      delete s[k];
    }
  } else if (c in SGR_ON) {
    s[SGR_ON[c]] = true;
  } else if (c in SGR_OFF) {
    for (const k of SGR_OFF[c]) {
      delete s[k];
    }
  } else if (c >= 30 && c <= 37) {
    s.fg = c - 30;
  } else if (c >= 40 && c <= 47) {
    s.bg = c - 40;
  } else if (c >= 90 && c <= 97) {
    s.fg = c - 90 + 8;
  } else if (c >= 100 && c <= 107) {
    s.bg = c - 100 + 8;
  }
}

/**
 * A colon group (`38:2::r:g:b`, `4:3`): its own sub-parameters, never the next groups'.  Returns the
 * group's code where it is one that stands alone (`1:`), for `applyCode`; undefined once applied.
 */
function applyColonGroup(s: MutableStyle, group: string): number | undefined {
  const sub = group.split(':');
  const c = sgrNumber(sub[0]);
  if (c === 38 || c === 48) {
    const colour = colonColour(sub.slice(1));
    if (colour !== undefined) {
      s[c === 38 ? 'fg' : 'bg'] = colour;
    }
    return undefined;
  }
  if (c === 4) {
    // 4:0 no underline, 4:1..4:5 one of its shapes
    if (sub.length > 1 && sgrNumber(sub[1]) === 0) {
      delete s.underline;
    } else {
      s.underline = true;
    }
    return undefined;
  }
  return c;
}

/**
 * Apply the parameters of one SGR sequence (`ESC [ params m`) to a style.  A colon group
 * (`38:2::r:g:b`, `4:3`) carries its own sub-parameters and never takes the next groups; the
 * semicolon form `38;2;r;g;b` does.  Twin of `nbspawn.views._sgr.apply_sgr`.
 */
export function applySGR(style: ITextStyle, params: string): ITextStyle {
  const groups = params === '' ? ['0'] : params.split(';');
  const s: MutableStyle = { ...style };
  for (let i = 0; i < groups.length; i++) {
    const group = groups[i];
    const c = group.includes(':') ? applyColonGroup(s, group) : sgrNumber(group);
    if (c === undefined || !Number.isFinite(c)) {
      continue;
    }
    if (c !== 38 && c !== 48) {
      applyCode(s, c);
      continue;
    }
    const key = c === 38 ? 'fg' : 'bg';
    const kind = sgrNumber(groups[i + 1]);
    if (kind === 5 && i + 2 < groups.length) {
      const n = sgrNumber(groups[i + 2]);
      if (n <= 255) {
        s[key] = n;
      }
      i += 2;
    } else if (kind === 2 && i + 4 < groups.length) {
      const rgb = sgrRGB(groups.slice(i + 2, i + 5));
      if (rgb !== undefined) {
        s[key] = rgb;
      }
      i += 4;
    } else {
      break; // malformed: ignore the rest, as terminals do
    }
  }
  return Object.keys(s).length === 0 ? PLAIN : Object.freeze(s);
}

interface IStreamState {
  style: ITextStyle;
  line: ILine | null;
  /** A `\r` was seen: the next visible character starts the line over. */
  rewind: boolean;
  /** An escape sequence split across chunks, kept until the rest arrives. */
  partial: string;
}

// ESC [ ... final byte | ESC ] ... (BEL | ESC \) | ESC + one char | lone ESC at the end
// eslint-disable-next-line no-control-regex
const CONTROL = /\x1b\[([0-9;:?<=>]*)([ -/]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()*+][ -~]|\x1b[^[\]()*+]|[\r\n\b]|[\x00-\x08\x0b-\x1f\x7f]/g;
// eslint-disable-next-line no-control-regex
const UNFINISHED = /\x1b(?:\[[0-9;:?<=>]*[ -/]*|\][^\x07\x1b]*(?:\x1b)?)?$/;

/**
 * Accumulates the chunks of one rank's streams into display lines.
 *
 * ```ts
 * const t = new TerminalText();
 * t.write('stdout', ' 50%\r100%\n');
 * t.lines; // [{stream: 'stdout', segments: [{text: '100%', style: {}}], complete: true}]
 * ```
 */
export class TerminalText {
  /** Lines in the order they were started. */
  readonly lines: ILine[] = [];

  private _streams = new Map<string, IStreamState>();

  /** Feed one chunk of a stream. */
  write(stream: string, text: string): void {
    let st = this._streams.get(stream);
    if (!st) {
      st = { style: PLAIN, line: null, rewind: false, partial: '' };
      this._streams.set(stream, st);
    }
    text = st.partial + text;
    st.partial = '';
    const tail = UNFINISHED.exec(text);
    if (tail && tail[0].length > 0 && tail[0].length < 64) {
      st.partial = tail[0];
      text = text.slice(0, tail.index);
    }
    CONTROL.lastIndex = 0;
    let last = 0;
    for (let m = CONTROL.exec(text); m; m = CONTROL.exec(text)) {
      if (m.index > last) {
        this._print(stream, st, text.slice(last, m.index));
      }
      last = CONTROL.lastIndex;
      const tok = m[0];
      if (tok === '\n') {
        if (st.line) {
          st.line.complete = true;
        } else {
          this._start(stream, st).complete = true;
        }
        st.line = null;
        st.rewind = false;
      } else if (tok === '\r') {
        st.rewind = st.line !== null;
      } else if (tok === '\b') {
        this._erase(st);
      } else if (m[3] === 'm' && m[2] === '' && !/[?<=>]/.test(m[1])) {
        st.style = applySGR(st.style, m[1]);
      } else if (m[3] === 'K' && st.line && (m[1] === '2' || (m[1] !== '1' && st.rewind))) {
        // erase line (or erase-to-end right after a \r): the line starts over
        st.line.redrawn = true;
        st.line.segments.length = 0;
        st.rewind = false;
      }
      // any other control or escape sequence (cursor moves, titles, bells) is dropped
    }
    if (last < text.length) {
      this._print(stream, st, text.slice(last));
    }
  }

  /** Feed a list of `[stream, text]` chunks, in arrival order. */
  writeAll(chunks: ReadonlyArray<readonly [string, string]>): this {
    for (const [stream, text] of chunks) {
      this.write(stream, text);
    }
    return this;
  }

  /** The visible text of every line, for tests and plain-text views. */
  toPlainText(): string {
    return this.lines.map(l => l.segments.map(s => s.text).join('') + (l.complete ? '\n' : '')).join('');
  }

  private _start(stream: string, st: IStreamState): ILine {
    const line: ILine = { stream, segments: [], complete: false };
    this.lines.push(line);
    st.line = line;
    return line;
  }

  private _print(stream: string, st: IStreamState, text: string): void {
    const line = st.line ?? this._start(stream, st);
    if (st.rewind) {
      line.redrawn = true;
      line.segments.length = 0;
      st.rewind = false;
    }
    const lastSeg = line.segments[line.segments.length - 1];
    if (lastSeg && sameStyle(lastSeg.style, st.style)) {
      lastSeg.text += text;
    } else {
      line.segments.push({ text, style: st.style });
    }
  }

  private _erase(st: IStreamState): void {
    const line = st.line;
    if (!line) {
      return;
    }
    if (st.rewind) {
      line.redrawn = true;
      line.segments.length = 0;
      st.rewind = false;
      return;
    }
    const segs = line.segments;
    const lastSeg = segs[segs.length - 1];
    if (!lastSeg) {
      return;
    }
    const chars = Array.from(lastSeg.text); // whole code points
    chars.pop();
    lastSeg.text = chars.join('');
    if (!lastSeg.text) {
      segs.pop();
    }
  }
}

/** Whether a line is a progress bar now: still open and drawn over at least once. */
export function isBar(line: ILine): boolean {
  return !line.complete && !!line.redrawn;
}

/** Render `[stream, text]` chunks to lines in one call. */
export function renderChunks(chunks: ReadonlyArray<readonly [string, string]>): ILine[] {
  return new TerminalText().writeAll(chunks).lines;
}

/** Remove every escape sequence and settle `\r`/`\b`: what a terminal shows, as plain text. */
export function plainText(text: string): string {
  return new TerminalText().writeAll([['stdout', text]]).toPlainText();
}
