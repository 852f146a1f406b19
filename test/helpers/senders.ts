import { createHmac } from 'node:crypto';
import { SOURCES, type PushSource, type Source } from '../../src/sources/index.js';
import type { ApiConfig } from '../../src/api/config.js';
import { createSenderSecrets } from '../../src/shared/liveSecrets.js';

/**
 * Deliveries as each sender of the registry (src/sources) makes them: its proof over a body, its
 * push event header, its documented example payload. Tests iterate the registry, so a new sender
 * is covered without a change here.
 */

/** The test secret of a sender's own variable (the harness sets it for every push sender without a fallback). */
export const testSecretOf = (env: string): string => `${env.toLowerCase().replace(/_/g, '-')}-0009`;

/** Env entries for every push sender's secret that has no fallback (alerts stay open unless a test sets its token). */
export function senderSecretsEnv(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const s of SOURCES) if (s.kind === 'push' && !s.secret.fallbackEnv) out[s.secret.env] = testSecretOf(s.secret.env);
  return out;
}

/** The proof header(s) a sender puts on `body` with `secret`. */
export function proofHeaders(source: Source, secret: string, body: string, nowMs = Date.now()): Record<string, string> {
  const v = source.verification;
  switch (v.kind) {
    case 'token':
      return { [v.header]: secret };
    case 'hmac':
      return { [v.header]: v.prefix + createHmac('sha256', secret).update(body).digest(v.encoding) };
    case 'timestamped-hmac': {
      const t = Math.floor(nowMs / 1000);
      return { [v.header]: `t=${t},v1=${createHmac('sha256', secret).update(`${t}.${body}`).digest('hex')}` };
    }
    case 'bearer':
      return { Authorization: `Bearer ${secret}` };
  }
}

/** A proof of the right form but not from the secret (passes the checks made before the body is read). */
export function wrongProofHeaders(source: Source, body: string): Record<string, string> {
  return proofHeaders(source, 'not-the-secret', body);
}

/** The headers of a push delivery: the proof and the push event. */
export function pushHeaders(source: PushSource, secret: string, body: string, nowMs = Date.now()): Record<string, string> {
  return { ...proofHeaders(source, secret, body, nowMs), [source.event.header]: source.event.push, 'Content-Type': 'application/json' };
}

/** The secret in use for a sender (its own variable's, else its fallback's), as the API resolves it from its config. */
export function harnessSecretOf(source: Source, config: Pick<ApiConfig, 'senderSecrets'>): string {
  const s = createSenderSecrets(config.senderSecrets).of(source)()[0];
  if (!s) throw new Error(`no secret configured for ${source.name}`);
  return s;
}

export const pushSources = (): PushSource[] => SOURCES.filter((s): s is PushSource => s.kind === 'push');
