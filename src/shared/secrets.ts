import { existsSync } from 'node:fs';
import { ConfigError, type ConfigProblem } from './errors.js';
import { contentsDigest, FileProblem, readWatchedFile } from './fileReload.js';
import type { CredentialFile, SecretValues } from './liveSecrets.js';
import { secretFileVar, SOURCE_SECRET_ENVS } from '../sources/index.js';

/** The secrets as read at start. Messages name the variable, the file or the line, never a value. */

/** The plain manifests' fake secrets start with this; they are public, so a process holding one would accept anyone. */
export const PLACEHOLDER_PREFIX = 'CHANGE-ME';
export const isPlaceholder = (v: string): boolean => v.trim().toUpperCase().startsWith(PLACEHOLDER_PREFIX);
export const PLACEHOLDER_PROBLEM = `still holds the ${PLACEHOLDER_PREFIX} placeholder of the plain manifests; set a real secret`;
/** Keys (and the bearer token) shorter than this are accepted but logged as a warning at start. */
export const MIN_SECRET_LENGTH = 16;

/** A secret file: the secret, then in a rotation the previous one. Spaces around a value: a pasting mistake, refused. */
export function parseSecretFile(text: string, variable: string): string[] {
  const lines = text.split('\n').map((l) => (l.endsWith('\r') ? l.slice(0, -1) : l));
  if (lines.length > 1 && lines[lines.length - 1] === '') lines.pop();
  const fail = (problem: string): never => {
    throw new ConfigError(variable, problem);
  };
  if (lines[0] === '') fail('holds no secret (its first line is empty)');
  if (lines.length > 2) fail('holds more than two lines (the secret in use, then at most the previous one)');
  lines.forEach((l, i) => {
    if (l === '') fail(`line ${i + 1} is empty`);
    if (l.trim() !== l) fail(`line ${i + 1} has spaces or tabs around the secret`);
    if (isPlaceholder(l)) fail(`line ${i + 1} ${PLACEHOLDER_PROBLEM}`);
  });
  return lines;
}

export function readCredentialFile(variable: string, path: string): { text: string; file: CredentialFile } {
  let bytes: Buffer;
  try {
    bytes = readWatchedFile({ variable, path });
  } catch (err) {
    if (err instanceof FileProblem) throw new ConfigError(variable, err.problem.problem);
    throw err;
  }
  return { text: bytes.toString('utf8'), file: { variable, path, digest: contentsDigest([bytes]) } };
}

/**
 * The senders' secrets, each from its variable or its file. An absent file (an optional key of a Secret) leaves its sender
 * unconfigured, is named in `absent`, and is watched, so its sender is configured when it appears.
 */
export function loadSenderSecrets(
  env: Record<string, string | undefined>,
  problems: ConfigProblem[],
  files: CredentialFile[],
  absent: string[],
): Record<string, SecretValues> {
  const out: Record<string, SecretValues> = {};
  for (const name of SOURCE_SECRET_ENVS) {
    const fileVar = secretFileVar(name);
    const path = (env[fileVar] ?? '').trim();
    if (path === '') {
      const value = env[name];
      if (value !== undefined && value !== '' && !isPlaceholder(value)) out[name] = [value];
      continue;
    }
    if ((env[name] ?? '').trim() !== '') {
      problems.push({ variable: fileVar, problem: `is set together with ${name}; set one of them` });
      continue;
    }
    if (!existsSync(path)) {
      absent.push(fileVar);
      files.push({ variable: fileVar, path, digest: contentsDigest([undefined]), optional: true });
      continue;
    }
    try {
      const { text, file } = readCredentialFile(fileVar, path);
      out[name] = parseSecretFile(text, fileVar);
      files.push({ ...file, optional: true });
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      problems.push(...err.problems);
    }
  }
  return out;
}

export function absentSecretFileWarnings(config: { readonly absentSecretFiles: readonly string[] }): string[] {
  return config.absentSecretFiles.map(
    (v) =>
      `${v} names a file that does not exist: its sender is not configured, as if ${v.replace(/_FILE$/, '')} were unset, until the file appears`,
  );
}
