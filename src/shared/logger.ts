import { pino, type DestinationStream, type Logger as PinoLogger } from 'pino';
import { withFallback } from './timeout.js';

/**
 * JSON lines on stdout, written by pino asynchronously (a slow log reader does not stall requests):
 *   {"level":"info","time":"<ISO 8601>", <base and child fields>, <call fields>, "msg":"..."}
 * An `err` field becomes `error` (message) and `error_type` (class name), never a stack. Every
 * serialised line has each registered secret, raw, JSON-escaped or percent-encoded, replaced by
 * "[REDACTED]": the last line of defence behind never logging them. `await logger.flush()` before exit.
 */
type Level = 'debug' | 'info' | 'warn' | 'error';

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(fields: Record<string, unknown>): Logger;
  /** Resolves once every line logged so far is written (at most `timeoutMs`, default 2000). */
  flush(timeoutMs?: number): Promise<void>;
  /** Adds values to redact from every line of this logger and its children from now on (a reloaded credential). */
  addSecrets(values: readonly string[]): void;
}

interface LoggerOptions {
  level?: Level;
  base?: Record<string, unknown>;
  secrets?: string[];
  /** Where lines go (one call per line, without the newline); stdout by default. */
  write?: (line: string) => void;
  /** stdout: bytes that may wait for a slow reader (default 16 MiB, inside the API's capped heap); lines past it are dropped and counted. */
  maxBufferBytes?: number;
}

const DEFAULT_LOG_BUFFER_BYTES = 16 * 1024 * 1024;

const REDACTED = '[REDACTED]';

/**
 * Each secret as it appears in a line, longest first (a secret containing another is replaced
 * whole): raw, JSON-escaped, and percent-encoded as the audit line's query is.
 */
function redactionNeedles(secrets: readonly string[]): string[] {
  return [...new Set(secrets.filter((s) => s.length >= 4).flatMap((s) => [s, JSON.stringify(s).slice(1, -1), encodeURIComponent(s)]))].sort(
    (a, b) => b.length - a.length,
  );
}

/** U+2028/U+2029 are valid raw in JSON, but line-oriented readers take them for line breaks: escaped like CR and LF. */
const HAS_LINE_SEPARATOR = /[\u2028\u2029]/;
const LINE_SEPARATORS = /[\u2028\u2029]/g;
const escapeLineSeparators = (line: string): string =>
  HAS_LINE_SEPARATOR.test(line) ? line.replace(LINE_SEPARATORS, (c) => (c === '\u2028' ? '\\u2028' : '\\u2029')) : line;

/** The redaction step over a set of secrets that may grow (addSecrets). */
function redactor(initial: readonly string[]): { redact: (line: string) => string; add: (values: readonly string[]) => void } {
  const secrets = new Set(initial);
  let needles = redactionNeedles([...secrets]);
  return {
    redact(line) {
      if (needles.length === 0) return escapeLineSeparators(line);
      let out = line;
      for (const s of needles) if (out.includes(s)) out = out.split(s).join(REDACTED);
      return escapeLineSeparators(out);
    },
    add(values) {
      const before = secrets.size;
      for (const v of values) secrets.add(v);
      if (secrets.size !== before) needles = redactionNeedles([...secrets]);
    },
  };
}

function errorFields(err: unknown): Record<string, unknown> {
  if (err instanceof Error) return { error: err.message, error_type: err.name };
  return { error: String(err) };
}

/** The `err` field as message and type; objects without it pass through uncopied. */
function formatLogObject(obj: Record<string, unknown>): Record<string, unknown> {
  if (!Object.prototype.hasOwnProperty.call(obj, 'err')) return obj;
  const { err, ...rest } = obj;
  return err === undefined ? rest : { ...rest, ...errorFields(err) };
}

/** What the stdout destination (pino.destination, a SonicBoom) exposes; `_writing`/`_len` are its in-flight state. */
interface AsyncDestination extends DestinationStream {
  flushSync(): void;
  on(event: 'drain' | 'drop' | 'error', fn: (...args: unknown[]) => void): unknown;
  off(event: 'drain', fn: () => void): unknown;
  _writing?: boolean;
  _len?: number;
}

/** Waits until the destination has nothing in flight or buffered (at most timeoutMs), then writes any rest synchronously. */
async function settle(dest: AsyncDestination, timeoutMs: number): Promise<void> {
  const idle = () => !dest._writing && (dest._len ?? 0) === 0;
  let check = () => {};
  const drained = new Promise<void>((resolve) => {
    // Re-checked after every drain: a drain listener may have written again (the dropped-lines warning).
    check = () => (idle() ? resolve() : undefined);
    dest.on('drain', check);
    check();
  });
  await withFallback(drained, timeoutMs, () => undefined);
  dest.off('drain', check);
  try {
    // Anything still buffered (only when the deadline passed) goes out synchronously.
    if (!dest._writing && (dest._len ?? 0) > 0) dest.flushSync();
  } catch {
    /* destination gone (EPIPE, closed): nothing more can be written */
  }
}

export function createLogger(opts: LoggerOptions = {}): Logger {
  const redaction = redactor(opts.secrets ?? []);
  const maxLength = opts.maxBufferBytes ?? DEFAULT_LOG_BUFFER_BYTES;
  let dest: DestinationStream;
  let stdout: AsyncDestination | undefined;
  if (opts.write) {
    const write = opts.write;
    dest = { write: (s: string) => write(s.endsWith('\n') ? s.slice(0, -1) : s) };
  } else {
    // minLength 0: every line goes to fs.write at once, lines logged meanwhile batched into the next write.
    stdout = pino.destination({ dest: 1, sync: false, minLength: 0, maxLength });
    // EPIPE is handled by pino (logging stops); any other write error must not crash the process.
    stdout.on('error', () => {});
    dest = stdout;
  }
  const root = pino(
    {
      level: opts.level ?? 'info',
      base: opts.base ?? null,
      timestamp: pino.stdTimeFunctions.isoTime,
      messageKey: 'msg',
      formatters: { level: (label) => ({ level: label }), log: formatLogObject },
      hooks: { streamWrite: redaction.redact },
    },
    dest,
  );

  if (stdout) {
    // Lines dropped past the buffer limit: say how many once it drained, so the gap shows in the log itself.
    let dropped = 0;
    stdout.on('drop', () => dropped++);
    stdout.on('drain', () => {
      if (dropped === 0) return;
      const n = dropped;
      dropped = 0;
      root.warn({ dropped_lines: n, buffer_limit_bytes: maxLength }, 'log lines dropped: stdout was not read fast enough');
    });
  }
  const flush = (timeoutMs = 2000): Promise<void> => (stdout ? settle(stdout, timeoutMs) : Promise.resolve());
  const wrap = (p: PinoLogger): Logger => ({
    debug: (msg, fields) => (fields ? p.debug(fields, msg) : p.debug(msg)),
    info: (msg, fields) => (fields ? p.info(fields, msg) : p.info(msg)),
    warn: (msg, fields) => (fields ? p.warn(fields, msg) : p.warn(msg)),
    error: (msg, fields) => (fields ? p.error(fields, msg) : p.error(msg)),
    child: (fields) => wrap(p.child(fields)),
    flush,
    addSecrets: redaction.add,
  });
  return wrap(root);
}

/** A logger that drops everything (for tests that do not read logs). */
export const silentLogger: Logger = createLogger({ write: () => {} });
