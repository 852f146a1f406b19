import type { PeerCertificate } from 'node:tls';
import { ConfigError } from '../shared/errors.js';
import type { CredentialFile } from '../shared/liveSecrets.js';
import { readCredentialFile } from '../shared/secrets.js';

/**
 * Which client certificates the CA of TLS_CLIENT_CA_FILE signed may call a route that asks for one: a CA that signs for many
 * workloads would otherwise let every one of them in. Entries `DNS:<name>` (any case), `URI:<uri>` or `<ATTR>=<value>` joined
 * by `+` (the subject holds each), compared as written, never as patterns: a certificate's own wildcard DNS name is not expanded.
 */

export type AllowedName =
  | { kind: 'DNS' | 'URI'; value: string; text: string }
  | { kind: 'subject'; attributes: ReadonlyArray<readonly [string, string]>; text: string };

export const ALLOWED_NAMES_VAR = 'TLS_CLIENT_ALLOWED_NAMES';
export const ALLOWED_NAMES_FILE_VAR = 'TLS_CLIENT_ALLOWED_NAMES_FILE';

const DNS_NAME = /^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$/;
const ATTRIBUTE = /^([A-Za-z][A-Za-z0-9.]*)=(.+)$/;

/** One entry, or the problem with it (never the entry's text: the message names its position). */
function parseEntry(text: string): AllowedName | string {
  const prefix = /^(DNS|URI):/i.exec(text);
  if (prefix) {
    const kind = prefix[1]!.toUpperCase() as 'DNS' | 'URI';
    const value = text.slice(prefix[0].length).trim();
    if (value === '') return `has an empty ${kind} name`;
    if (kind === 'DNS') {
      if (!DNS_NAME.test(value)) return 'has a DNS name with characters other than letters, digits, ".", "-" or "_" (no wildcards)';
      return { kind, value: value.toLowerCase(), text: `DNS:${value.toLowerCase()}` };
    }
    if (/\s/.test(value) || !URL.canParse(value))
      return 'has a URI that is not an absolute URI such as spiffe://cluster.local/ns/<namespace>/sa/<name>';
    return { kind, value, text: `URI:${value}` };
  }
  const attributes: Array<readonly [string, string]> = [];
  for (const part of text.split('+')) {
    const m = ATTRIBUTE.exec(part.trim());
    if (!m) return 'is not DNS:<name>, URI:<uri> or <ATTR>=<value> (such as CN=alertmanager)';
    attributes.push([m[1]!, m[2]!.trim()]);
  }
  return { kind: 'subject', attributes, text: attributes.map(([k, v]) => `${k}=${v}`).join('+') };
}

/** Parses a list (commas; in a file newlines too, `#` comments), by position; an entry listed twice hides the one meant: refused. */
export function parseAllowedNames(raw: string | undefined, variable: string, opts: { file?: boolean } = {}): AllowedName[] {
  const text = raw ?? '';
  const items = opts.file
    ? text
        .split(/\r?\n/)
        .filter((l) => !l.trim().startsWith('#'))
        .flatMap((l) => l.split(','))
        .map((s) => s.trim())
        .filter((s) => s !== '')
    : text.trim() === ''
      ? []
      : text.split(',').map((s) => s.trim());
  const problems: string[] = [];
  const out: AllowedName[] = [];
  items.forEach((item, i) => {
    // An empty item (",," or a trailing comma) is refused rather than guessed at.
    const entry = item === '' ? 'is empty' : parseEntry(item);
    if (typeof entry === 'string') problems.push(`entry ${i + 1} ${entry}`);
    else if (out.some((e) => e.text === entry.text)) problems.push(`entry ${i + 1} repeats an earlier entry`);
    else out.push(entry);
  });
  if (problems.length > 0) throw new ConfigError(problems.map((problem) => ({ variable, problem })));
  return out;
}

/** The subjectAltName entries as Node prints them (`DNS:a, URI:b`; a value holding a comma or a quote is a JSON string). */
export function subjectAltNames(text: string | undefined): Array<[string, string]> {
  const s = text ?? '';
  const out: Array<[string, string]> = [];
  let i = 0;
  while (i < s.length) {
    const colon = s.indexOf(':', i);
    if (colon < 0) break;
    const type = s.slice(i, colon);
    let value: string | undefined;
    let end: number;
    if (s[colon + 1] === '"') {
      let j = colon + 2;
      while (j < s.length && s[j] !== '"') j += s[j] === '\\' ? 2 : 1;
      try {
        value = JSON.parse(s.slice(colon + 1, j + 1)) as string;
      } catch {
        value = undefined;
      }
      end = j + 1;
    } else {
      const comma = s.indexOf(', ', colon + 1);
      end = comma < 0 ? s.length : comma;
      value = s.slice(colon + 1, end);
    }
    if (value !== undefined) out.push([type, value]);
    i = s.startsWith(', ', end) ? end + 2 : end + 1;
  }
  return out;
}

export function matchAllowedName(
  list: readonly AllowedName[],
  peer: Pick<PeerCertificate, 'subject' | 'subjectaltname'>,
): AllowedName | undefined {
  const sans = subjectAltNames(peer.subjectaltname);
  const subject = (peer.subject ?? {}) as unknown as Record<string, string | string[] | undefined>;
  const attribute = (name: string): string[] => {
    const key = Object.keys(subject).find((k) => k.toLowerCase() === name.toLowerCase());
    const v = key === undefined ? undefined : subject[key];
    return v === undefined ? [] : Array.isArray(v) ? v : [v];
  };
  return list.find((e) => {
    if (e.kind === 'subject') return e.attributes.every(([k, v]) => attribute(k).includes(v));
    if (e.kind === 'DNS') return sans.some(([t, v]) => t === 'DNS' && v.toLowerCase() === e.value);
    return sans.some(([t, v]) => t === 'URI' && v === e.value);
  });
}

/** The list in use, replaced whole when its file changes (src/server.ts). */
export type AllowedNames = ReturnType<typeof createAllowedNames>;
export function createAllowedNames(initial: readonly AllowedName[]) {
  let list: readonly AllowedName[] = Object.freeze([...initial]);
  return {
    current: () => list,
    set: (next: readonly AllowedName[]) => void (list = Object.freeze([...next])),
  };
}

/** The allowed-names file must name someone: an emptied one (a key gone from a ConfigMap) is refused, not read as any certificate. */
export function parseAllowedNamesFile(text: string): AllowedName[] {
  const list = parseAllowedNames(text, ALLOWED_NAMES_FILE_VAR, { file: true });
  if (list.length === 0) {
    throw new ConfigError(ALLOWED_NAMES_FILE_VAR, `lists no name (to accept any certificate of the CA, unset ${ALLOWED_NAMES_FILE_VAR})`);
  }
  return list;
}

/** TLS_CLIENT_ALLOWED_NAMES, or its file (not both). */
export function loadAllowedNames(env: Record<string, string | undefined>): { list: AllowedName[]; file?: CredentialFile } {
  const path = (env[ALLOWED_NAMES_FILE_VAR] ?? '').trim();
  if (path === '') return { list: parseAllowedNames(env[ALLOWED_NAMES_VAR], ALLOWED_NAMES_VAR) };
  if ((env[ALLOWED_NAMES_VAR] ?? '').trim() !== '') {
    throw new ConfigError(ALLOWED_NAMES_FILE_VAR, `is set together with ${ALLOWED_NAMES_VAR}; set one of them`);
  }
  const { text, file } = readCredentialFile(ALLOWED_NAMES_FILE_VAR, path);
  return { list: parseAllowedNamesFile(text), file };
}

/** Start-up warning: every certificate the CA signed is accepted (with a CA that signs for other workloads, any of them can post alerts). */
export function clientCertificateWarnings(config: {
  readonly TLS_CLIENT_CA_FILE?: string | undefined;
  readonly clientAllowedNames: readonly AllowedName[];
}): string[] {
  if (!config.TLS_CLIENT_CA_FILE || config.clientAllowedNames.length > 0) return [];
  return [
    `TLS_CLIENT_CA_FILE is set without ${ALLOWED_NAMES_VAR}: /webhook/alerts accepts every client certificate its CA signed; list the names of Alertmanager's certificate (DNS:<name>, URI:<uri> or CN=<name>)`,
  ];
}
