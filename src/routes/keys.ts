import { invalidInput } from './invalid.js';
import { Router } from 'express';
import { z } from 'zod';
import { requireApiKey, type ApiKeyPolicy } from '../middleware/auth.js';
import { methodNotAllowed } from '../middleware/errors.js';
import { keyStatus, rfc3339, type KeyUsage } from '../shared/apiKeyLifetime.js';
import type { ApiConfig } from '../shared/config.js';
import { RedisUnavailableError } from '../shared/errors.js';
import type { Metrics } from '../shared/metrics.js';
import { keysetPage, nextCursorSchema, pageQueryShape, singleValued } from './paging.js';

/**
 * GET /ops/keys (operator): the configured API keys by id, owner, role, source, expiry and last use
 * (any replica's, from Redis), so an operator sees which keys callers still use before one expires,
 * and who holds each. Never a key or a hash. In the order of the configuration, paged with limit and
 * cursor (src/routes/paging.ts).
 */
export interface KeysDeps {
  config: Pick<ApiConfig, 'apiKeys' | 'API_KEY_EXPIRY_WARNING_DAYS'>;
  metrics: Pick<Metrics, 'authFailures'>;
  usage: Pick<KeyUsage, 'lastUsed'>;
  apiKeyPolicy?: ApiKeyPolicy;
}

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
    }),
  ),
  next_cursor: nextCursorSchema,
});

/** Query of GET /ops/keys. */
export const listKeysQuerySchema = z.object(pageQueryShape(100, 500));

export function keysRouter(deps: KeysDeps): Router {
  const r = Router();
  const operatorKey = requireApiKey(deps.config.apiKeys, deps.metrics, 'operator', deps.apiKeyPolicy);
  const now = deps.apiKeyPolicy?.now ?? Date.now;

  r.route('/ops/keys')
    .get(operatorKey, async (req, res) => {
      singleValued(req.query);
      const q = listKeysQuerySchema.safeParse(req.query);
      if (!q.success) throw invalidInput(q.error, 'query parameter');
      // A snapshot: a reload of the keys file during the read below must not mix two sets.
      const page = keysetPage(
        'keys',
        deps.config.apiKeys.map((k, i) => ({ k, i })),
        ({ k, i }) => [i, k.id],
        q.data,
      );
      const keys = page.items.map(({ k }) => k);
      let lastUsed: Map<string, number>;
      try {
        lastUsed = await deps.usage.lastUsed(keys.map((k) => k.id));
      } catch {
        throw new RedisUnavailableError('redis unavailable: the last use of the keys cannot be read; retry later');
      }
      const at = now();
      const body: z.infer<typeof keyListSchema> = {
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
          };
        }),
        next_cursor: page.next_cursor,
      };
      res.json(body);
    })
    .all(methodNotAllowed(['GET']));

  return r;
}
