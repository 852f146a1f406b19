import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { ConfigError, type ConfigProblem } from './errors.js';

/**
 * Files a running process re-reads instead of needing a restart: its TLS certificate
 * (src/shared/tls.ts), the API keys file and the webhook senders' secret files
 * (src/shared/liveSecrets.ts). Each set of files is polled every interval and its contents
 * compared with what is in use; a changed set is checked, then put in use. Polling the contents
 * (not inotify) follows the kubelet's update of a Secret volume, which swaps a `..data` symlink:
 * a watch set on the old files would never fire again.
 *
 * A changed set that fails its check (unreadable, malformed, refused where it is applied) is
 * refused: reported once per distinct contents (not on every poll), and what is in use stays. A
 * later change is checked again, so fixing the files is enough. Nothing here throws into the
 * process: a reload problem never takes a listener or a route down.
 */

/** One file of a set, and the variable that names it (the name goes into every problem report). */
export interface WatchedFile {
  variable: string;
  path: string;
  /**
   * The file may not exist (an optional key of a mounted Secret): its absence is a state like any
   * contents (undefined for `parse`), not a read error. A file that appears later is then checked
   * like a changed one.
   */
  optional?: boolean;
}

/** A problem with one file: the variable naming it and what is wrong, never the contents. */
export class FileProblem extends Error {
  readonly problem: ConfigProblem;
  constructor(variable: string, problem: string) {
    super(`${variable}: ${problem}`);
    this.name = 'FileProblem';
    this.problem = { variable, problem };
  }
}

/** The problems of a failed check: a FileProblem's, every one of a ConfigError's, or one naming the first file. */
function problemsOf(err: unknown, files: readonly WatchedFile[]): ConfigProblem[] {
  if (err instanceof FileProblem) return [err.problem];
  if (err instanceof ConfigError) return [...err.problems];
  return [{ variable: files[0]?.variable ?? 'file', problem: 'could not be checked' }];
}

const readProblem = (variable: string, err: unknown): FileProblem => {
  const code = (err as { code?: string }).code;
  return new FileProblem(variable, `cannot be read${code ? ` (${code})` : ''}`);
};

/** Reads one file at start-up; an unreadable file is a FileProblem naming its variable (never its path). */
export function readWatchedFile(file: WatchedFile): Buffer {
  try {
    return readFileSync(file.path);
  } catch (err) {
    throw readProblem(file.variable, err);
  }
}

/** Identity of a set's contents (lengths and bytes of each file, in order; an absent one counts too). */
export function contentsDigest(parts: ReadonlyArray<Buffer | undefined>): string {
  const h = createHash('sha256');
  for (const p of parts) {
    h.update(p ? String(p.length) : '-');
    h.update(':');
    if (p) h.update(p);
  }
  return h.digest('hex');
}

export interface FileReloader {
  /** Checks the files now (the poll does the same on its own); resolves when done. */
  check(): Promise<void>;
  close(): void;
}

interface WatchFilesOptions<T> {
  files: readonly WatchedFile[];
  /** contentsDigest of the contents in use when the watch starts. */
  initialDigest: string;
  intervalMs: number;
  /**
   * Checks changed contents (one Buffer per file, in order; undefined for an optional file that does
   * not exist); throws a FileProblem or a ConfigError to refuse them.
   */
  parse(contents: Array<Buffer | undefined>): T;
  /** Puts a checked value in use; throws a FileProblem when it cannot (the contents are then refused). */
  apply(value: T): void;
  /** After apply: the new contents are in use. */
  onApplied(value: T): void;
  /** Changed contents were refused; what was in use stays. Once per distinct contents. */
  onRefused(problems: readonly ConfigProblem[]): void;
  /** The files hold what is in use again, after a refusal (a bad update undone, a half-written one completed). */
  onRestored?(): void;
}

/**
 * Polls a set of files every `intervalMs` (the first poll one interval after the call) and puts
 * changed, valid contents in use. At most one check runs at a time.
 */
export function watchFiles<T>(opts: WatchFilesOptions<T>): FileReloader {
  let inUse = opts.initialDigest;
  let refused: string | undefined;
  let timer: NodeJS.Timeout | undefined;
  let closed = false;
  let running: Promise<void> | undefined;

  const read = async (file: WatchedFile): Promise<Buffer | undefined> => {
    try {
      return await readFile(file.path);
    } catch (err) {
      if (file.optional && (err as { code?: string }).code === 'ENOENT') return undefined;
      throw readProblem(file.variable, err);
    }
  };

  const once = async (): Promise<void> => {
    let seen: string | undefined;
    let value: T;
    try {
      const contents = await Promise.all(opts.files.map(read));
      seen = contentsDigest(contents);
      if (seen === inUse) {
        if (refused !== undefined) {
          refused = undefined;
          opts.onRestored?.();
        }
        return;
      }
      if (seen === refused) return;
      value = opts.parse(contents);
      opts.apply(value);
    } catch (err) {
      const problems = problemsOf(err, opts.files);
      // Refused contents are reported once; an unreadable file once per kind of problem.
      const key = seen ?? `error:${problems.map((p) => `${p.variable}:${p.problem}`).join(';')}`;
      if (refused === key) return;
      refused = key;
      opts.onRefused(problems);
      return;
    }
    inUse = seen;
    refused = undefined;
    opts.onApplied(value);
  };

  const check = (): Promise<void> => {
    running ??= once()
      .catch(() => {
        /* a reporting callback that threw: the next poll tries again */
      })
      .finally(() => (running = undefined));
    return running;
  };
  const schedule = () => {
    if (closed) return;
    timer = setTimeout(() => {
      void check().finally(schedule);
    }, opts.intervalMs);
    // The poll alone never keeps a process alive.
    timer.unref();
  };
  schedule();
  return {
    check,
    close() {
      closed = true;
      if (timer) clearTimeout(timer);
    },
  };
}
