import { readdirSync } from 'node:fs';
import type { Source } from './types.js';

export type { AlertsSource, PushFields, PushMapping, PushSource, SecretSpec, Source, Verification } from './types.js';

/** The webhook senders: every module here but these helpers, so a new sender is one file; name order is the docs' and OpenAPI's. */
const HELPERS = new Set(['index', 'types', 'fields', 'table']);
const here = new URL('.', import.meta.url);
const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
const modules = readdirSync(here)
  .filter((f) => f.endsWith(ext) && !f.endsWith(`.d${ext}`) && !HELPERS.has(f.slice(0, -ext.length)))
  .sort();

const loaded: Source[] = [];
for (const file of modules) {
  const { source: s } = (await import(`./${file}`)) as { source?: Source };
  if (!s) throw new Error(`src/sources/${file} exports no source`);
  if (!/^[a-z][a-z0-9-]*$/.test(s.name)) throw new Error(`webhook source name ${JSON.stringify(s.name)} is not a path segment`);
  if (loaded.some((o) => o.name === s.name)) throw new Error(`webhook source ${s.name} is defined twice`);
  loaded.push(s);
}

export const SOURCES: readonly Source[] = loaded;

/** Whether `name` is a sender of pushes (a deploy's `source` may also be a CI job's `ci`, no sender). */
export const isPushSender = (name: string): boolean => SOURCES.some((s) => s.name === name && s.kind === 'push');

export const SOURCE_SECRET_ENVS: readonly string[] = [...new Set(SOURCES.map((s) => s.secret.env))];

/** The file-mode variable of a sender's secret (GITHUB_WEBHOOK_SECRET_FILE): a file re-read while the API runs. */
export const secretFileVar = (env: string): string => `${env}_FILE`;

export const SOURCE_SECRET_FILE_ENVS: readonly string[] = SOURCE_SECRET_ENVS.map(secretFileVar);
