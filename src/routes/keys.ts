import { keysetPage, nextCursorSchema, only, pageQueryShape, parseQuery } from './request.js';
import { Router } from 'express';
import { z } from 'zod';
import { keyChecks, type KeyedDeps } from '../middleware/auth.js';
import { keyStatus, rfc3339, type KeyUsage } from '../api/apiKeyLifetime.js';
import type { ApiConfig } from '../api/config.js';
import { RedisUnavailableError } from '../shared/errors.js';
import { describeIssuers, OIDC_KINDS } from '../api/oidcConfig.js';

/**
 * GET /ops/keys (operator): the configured API keys (never a key or a hash) with their last use by
 * any replica, beside the OIDC issuers and their claim rules, so an operator sees which keys callers
 * still use before one expires, and who holds each. In the order of the configuration.
 */
interface KeysDeps extends KeyedDeps {
  config: Pick<ApiConfig, 'apiKeys' | 'API_KEY_EXPIRY_WARNING_DAYS'> & { oidc?: ApiConfig['oidc'] };
  usage: Pick<KeyUsage, 'lastUsed'>;
}

const scopeView = z.object({
  hosts: z.array(z.string()).optional(),
  namespaces: z.array(z.string()).optional(),
  projects: z.array(z.string()).optional(),
});

export const keyListSchema = z.object({
  keys: z.array(
    z.object({
      id: z.string().describe('OPS_API_KEY_ROLES: the first 12 hex of the SHA-256 of the key; keys file: its id'),
      owner: z
        .string()
        .describe('who holds the key, a person or a service: keys file: its owner, else its id; OPS_API_KEY_ROLES: env:<id>'),
      role: z.enum(['readonly', 'operator']),
      source: z.enum(['env', 'file']).describe('env: OPS_API_KEY_ROLES; file: OPS_API_KEYS_FILE'),
      expires: z.string().nullable().describe('RFC 3339; null: the key does not expire'),
      status: z.enum(['active', 'expiring', 'expired']).describe('expiring: within API_KEY_EXPIRY_WARNING_DAYS of its expiry'),
      last_used: z
        .string()
        .nullable()
        .describe(
          'RFC 3339, by any replica, up to a minute early (each replica writes it at most once a minute per key); null: never used',
        ),
      scope: scopeView.nullable().describe('what the key may act on (keys file); null: everything its role allows'),
    }),
  ),
  oidc_issuers: z
    .array(
      z.object({
        issuer: z.string(),
        kind: z.enum(OIDC_KINDS),
        audience: z.string(),
        jwks_uri: z.string().nullable(),
        discovery_auth: z.literal('serviceaccount').nullable(),
        ca_file: z.string().nullable(),
        max_token_lifetime: z.number().int().describe('the longest lifetime (exp - iat, seconds) a token may have'),
        max_token_age: z.number().int().nullable().describe('how long after its iat a token is accepted (seconds); null: until its exp'),
        rules: z.array(
          z.object({
            name: z.string(),
            match: z.record(z.string(), z.string()).describe('claim (or JSON Pointer) -> value, glob:pattern or re:pattern'),
            owner: z.string().describe('the owner template, {claim} placeholders'),
            role: z.enum(['readonly', 'operator']),
            scope: scopeView.nullable(),
            deploy: z.record(z.string(), z.string()).nullable().describe('what a deploy is bound to: project, ref, sha templates'),
            person: z.string().nullable().describe('the person template four eyes compares with owners; null: its tokens name no person'),
            may_override: z.boolean().describe('whether its tokens may override a freeze or the change windows'),
            owner_claim: z.string().nullable().describe("a generic issuer's rule: the claim that binds the owner"),
          }),
        ),
      }),
    )
    .describe('the OIDC issuers of OPS_OIDC_FILE and their claim rules (empty without it); tokens are never listed'),
  next_cursor: nextCursorSchema,
});

export const listKeysQuerySchema = z.object(pageQueryShape(100, 500));

export function keysRouter(deps: KeysDeps): Router {
  const r = Router();
  const { operatorKey } = keyChecks(deps);
  const now = deps.apiKeyPolicy?.now ?? Date.now;

  only(r, 'get', '/ops/keys', operatorKey, async (req, res) => {
    const q = parseQuery(listKeysQuerySchema, req.query);
    // A snapshot: a reload of the keys file during the read below must not mix two sets.
    const indexed = deps.config.apiKeys.map((k, i) => ({ k, i }));
    const page = keysetPage('keys', indexed, ({ k, i }) => [i, k.id], q);
    const keys = page.items.map(({ k }) => k);
    let lastUsed: Map<string, number>;
    try {
      lastUsed = await deps.usage.lastUsed(keys.map((k) => k.id));
    } catch {
      throw new RedisUnavailableError('redis unavailable: the last use of the keys cannot be read; retry later');
    }
    const at = now();
    res.json({
      keys: keys.map((k) => {
        const seen = lastUsed.get(k.id);
        return {
          id: k.id,
          owner: k.owner,
          role: k.role,
          source: k.source,
          expires: k.expiresAt === undefined ? null : rfc3339(k.expiresAt),
          status: keyStatus(k, at, deps.config.API_KEY_EXPIRY_WARNING_DAYS),
          last_used: seen === undefined ? null : rfc3339(seen * 1000),
          scope: k.scope ? { ...k.scope } : null,
        };
      }),
      oidc_issuers: deps.config.oidc ? describeIssuers(deps.config.oidc) : [],
      next_cursor: page.next_cursor,
    });
  });

  return r;
}
