/**
 * Structured JSON logs, one object per line on stdout. Every line passes through a redaction
 * step that replaces any registered secret value (API keys, tokens, webhook secrets, Redis
 * password) with "[REDACTED]", as a last line of defence behind never logging them at all.
 */
export type Level = 'debug' | 'info' | 'warn' | 'error';
const order: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(fields: Record<string, unknown>): Logger;
}

export interface LoggerOptions {
  level?: Level;
  base?: Record<string, unknown>;
  secrets?: string[];
  /** Where lines go; stdout by default. Tests pass a collector. */
  write?: (line: string) => void;
}

function errorFields(err: unknown): Record<string, unknown> {
  if (err instanceof Error) return { error: err.message, error_type: err.name };
  return { error: String(err) };
}

export function createLogger(opts: LoggerOptions = {}): Logger {
  const min = order[opts.level ?? 'info'];
  // Each secret as it appears raw and JSON-escaped inside a serialised line, computed once
  // (this runs on every log line), longest first so a secret containing another is replaced whole.
  const needles = [
    ...new Set((opts.secrets ?? []).filter((s) => s.length >= 4).flatMap((s) => [s, JSON.stringify(s).slice(1, -1)])),
  ].sort((a, b) => b.length - a.length);
  const write = opts.write ?? ((line: string) => process.stdout.write(line + '\n'));
  const base = opts.base ?? {};

  const redact = (line: string): string => {
    let out = line;
    for (const s of needles) if (out.includes(s)) out = out.split(s).join('[REDACTED]');
    return out;
  };

  const make = (bound: Record<string, unknown>): Logger => {
    const emit = (level: Level, msg: string, fields?: Record<string, unknown>) => {
      if (order[level] < min) return;
      const { err, ...rest } = fields ?? {};
      const record = {
        time: new Date().toISOString(),
        level,
        msg,
        ...base,
        ...bound,
        ...rest,
        ...(err !== undefined ? errorFields(err) : {}),
      };
      let line: string;
      try {
        line = JSON.stringify(record);
      } catch {
        line = JSON.stringify({ time: record.time, level, msg, note: 'unserialisable fields dropped' });
      }
      write(redact(line));
    };
    return {
      debug: (m, f) => emit('debug', m, f),
      info: (m, f) => emit('info', m, f),
      warn: (m, f) => emit('warn', m, f),
      error: (m, f) => emit('error', m, f),
      child: (f) => make({ ...bound, ...f }),
    };
  };
  return make({});
}

/** A logger that drops everything (for tests that do not read logs). */
export const silentLogger: Logger = createLogger({ write: () => {} });
