import type { ConfigProblem } from './errors.js';
import { watchFiles, type FileReloader } from './fileReload.js';
import type { Logger } from './logger.js';
import type { Metrics } from './metrics.js';
import type { Source } from '../sources/index.js';

/** Credentials the API re-reads from mounted files while it runs, so that rotating them needs no restart. */

/** A sender's secret: [current] or [current, previous] during a rotation; empty when not configured. */
export type SecretValues = readonly string[];

/** Which value a delivery proved, by position: what the audit line says (never the value). */
export const SECRET_ROLES = ['current', 'previous'] as const;

/** The values in use of every sender secret variable, replaced whole by a reload. */
export interface SenderSecrets {
  values(env: string): SecretValues;
  /** Read at each call: the source's own variable's values, else its fallback's (GitLab: SCM_WEBHOOK_SECRET). */
  of(source: Pick<Source, 'secret'>): () => SecretValues;
  set(env: string, values: SecretValues): void;
}

export function createSenderSecrets(initial: Readonly<Record<string, SecretValues>>): SenderSecrets {
  const current = new Map<string, SecretValues>(Object.entries(initial).filter(([, v]) => v.length > 0));
  const none: SecretValues = Object.freeze([]);
  const values = (env: string) => current.get(env) ?? none;
  return {
    values,
    of(source) {
      const { env, fallbackEnv } = source.secret;
      return () => {
        const own = values(env);
        return own.length > 0 || !fallbackEnv ? own : values(fallbackEnv);
      };
    },
    set(env, v) {
      current.set(env, Object.freeze([...v]));
    },
  };
}

/** A credential file as loaded at start: what the reload poll compares with. */
export interface CredentialFile {
  variable: string;
  path: string;
  /** contentsDigest of the contents loaded at start (of an absent optional file: its absence). */
  digest: string;
  /** An absent sender's secret file leaves its sender unconfigured. */
  optional?: boolean;
}

export type CredentialReloadMetrics = Pick<Metrics, 'secretReloads' | 'secretReloadRefused'>;

/** Polls one credential file: a valid new file is applied, an invalid one refused. `describe` says what changed, never a value. */
export function watchCredentialFile<T>(opts: {
  file: CredentialFile;
  intervalMs: number;
  parse(text: string | undefined): T;
  apply(value: T): void;
  describe(value: T): Record<string, unknown>;
  logger: Logger;
  metrics?: CredentialReloadMetrics;
}): FileReloader {
  const { variable } = opts.file;
  opts.metrics?.secretReloadRefused.set({ variable }, 0);
  return watchFiles<T>({
    files: [{ variable, path: opts.file.path, ...(opts.file.optional ? { optional: true } : {}) }],
    initialDigest: opts.file.digest,
    intervalMs: opts.intervalMs,
    parse: ([bytes]) => opts.parse(bytes?.toString('utf8')),
    apply: (value) => opts.apply(value),
    onApplied(value) {
      opts.metrics?.secretReloads.inc({ variable, outcome: 'reloaded' });
      opts.metrics?.secretReloadRefused.set({ variable }, 0);
      opts.logger.info('credentials reloaded', { variable, ...opts.describe(value) });
    },
    onRefused(problems: readonly ConfigProblem[]) {
      opts.metrics?.secretReloads.inc({ variable, outcome: 'refused' });
      opts.metrics?.secretReloadRefused.set({ variable }, 1);
      opts.logger.error('credentials reload refused: keeping the ones in use', { variable, problems });
    },
    onRestored() {
      opts.metrics?.secretReloadRefused.set({ variable }, 0);
      opts.logger.info('credentials file back to the contents in use', { variable });
    },
  });
}
