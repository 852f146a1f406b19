import { readdirSync } from 'node:fs';
import type { Source } from './types.js';

export type { AlertsSource, PushFields, PushMapping, PushSource, SecretSpec, Source, Verification } from './types.js';

/**
 * The registry of webhook senders: every module of this folder that exports `source` (all but
 * this file and its helpers: types, fields, table), found when the process starts, so a new sender is one file. In
 * name order, which is also the order of the docs table and of the OpenAPI paths.
 */
const HELPERS = new Set(['index', 'types', 'fields', 'table']);
const here = new URL('.', import.meta.url);
const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
const modules = readdirSync(here)
  .filter((f) => f.endsWith(ext) && !f.endsWith(`.d${ext}`) && !HELPERS.has(f.slice(0, -ext.length)))
  .sort();

const loaded: Source[] = [];
for (const file of modules) {
  const mod = (await import(`./${file}`)) as { source?: Source };
  if (!mod.source) throw new Error(`src/sources/${file} exports no source`);
  loaded.push(mod.source);
}

export const SOURCES: readonly Source[] = checked(loaded);

function checked(sources: Source[]): Source[] {
  const seen = new Set<string>();
  for (const s of sources) {
    if (!/^[a-z][a-z0-9-]*$/.test(s.name)) throw new Error(`webhook source name ${JSON.stringify(s.name)} is not a path segment`);
    if (seen.has(s.name)) throw new Error(`webhook source ${s.name} is defined twice`);
    seen.add(s.name);
  }
  return sources;
}

/** Whether `name` is a sender of pushes (a deploy's `source` may also be a CI job's `ci`, no sender). */
export const isPushSender = (name: string): boolean => SOURCES.some((s) => s.name === name && s.kind === 'push');

/** Every environment variable that holds a sender's secret. */
export const SOURCE_SECRET_ENVS: readonly string[] = [...new Set(SOURCES.map((s) => s.secret.env))];

/**
 * The file-mode variable of a sender's secret variable (GITHUB_WEBHOOK_SECRET ->
 * GITHUB_WEBHOOK_SECRET_FILE): a file holding the secret, re-read while the API runs.
 */
export const secretFileVar = (env: string): string => `${env}_FILE`;

/** Every file-mode variable of the senders' secrets. */
export const SOURCE_SECRET_FILE_ENVS: readonly string[] = SOURCE_SECRET_ENVS.map(secretFileVar);
