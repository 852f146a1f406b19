import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { ConfigError, type ConfigProblem } from './errors.js';

/**
 * Files a running process re-reads instead of needing a restart. Contents are polled, not watched with inotify: the kubelet
 * swaps a Secret volume's `..data` symlink, and a watch on the old files would never fire again. A changed set that fails
 * its check is refused, reported once per distinct contents, and what is in use stays. Nothing here throws into the process.
 */

/** One file of a set, and the variable that names it in every problem report. */
export interface WatchedFile {
  variable: string;
  path: string;
  /** The file may not exist (an optional key of a Secret): its absence is a state (undefined for `parse`), not an error. */
  optional?: boolean;
}

/** What is wrong with one file, naming its variable, never the contents. */
export class FileProblem extends Error {
  readonly problem: ConfigProblem;
  constructor(variable: string, problem: string) {
    super(`${variable}: ${problem}`);
    this.name = 'FileProblem';
    this.problem = { variable, problem };
  }
}

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
    h.update(p ? `${p.length}:` : '-:');
    if (p) h.update(p);
  }
  return h.digest('hex');
}

export interface FileReloader {
  check(): Promise<void>;
  close(): void;
}

interface WatchFilesOptions<T> {
  files: readonly WatchedFile[];
  initialDigest: string;
  intervalMs: number;
  /** Checks changed contents (one per file; undefined for an absent optional one); throws FileProblem or ConfigError to refuse. */
  parse(contents: Array<Buffer | undefined>): T;
  /** Puts a checked value in use; throws a FileProblem to refuse it. */
  apply(value: T): void;
  onApplied(value: T): void;
  /** Once per distinct refused contents. */
  onRefused(problems: readonly ConfigProblem[]): void;
  /** The files hold what is in use again, after a refusal (a bad update undone, a half-written one completed). */
  onRestored?(): void;
}

/** Polls a set of files every `intervalMs` and puts changed, valid contents in use; one check at a time. */
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
