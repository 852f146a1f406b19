import { cursorJson, keysetPage, nextCursorSchema, only, pageQueryShape, parseQuery } from './request.js';
import { Router } from 'express';
import { z } from 'zod';
import { keyChecks, type KeyedDeps } from '../middleware/auth.js';
import { redisCall } from '../domain/redisOps.js';
import type { ApiConfig } from '../api/config.js';
import { UnprocessableError } from '../shared/errors.js';
import type { RemediationBudgetUse } from '../shared/metrics.js';
import type { Redis } from 'ioredis';
import { decisionSchema, type RemediationStore } from '../remediation/store.js';

/**
 * GET /ops/remediations (any valid key): "why did (or didn't) opsgate restart X?": alert-driven
 * remediation's recent decisions, newest first, with the remediation budgets and their use now.
 */
interface RemediationRoutesDeps extends KeyedDeps {
  config: Pick<ApiConfig, 'apiKeys'>;
  redis: Redis;
  store: RemediationStore;
  budgetUses?: () => Promise<RemediationBudgetUse[]>;
}

export const remediationsQuerySchema = z.object({
  ...pageQueryShape(100, 500),
  rule: z.string().min(1).max(63).optional().describe("only this rule's decisions"),
});

const remediationBudgetSchema = z.object({
  budget: z.enum(['rule', 'namespace']).describe("rule: the rule's own; namespace: all rules of the namespace together"),
  name: z.string(),
  used: z.number().int().describe('restarts by remediation in the window now'),
  limit: z.number().int(),
  per: z.number().int().describe('the window, in seconds'),
});

export const remediationListSchema = z.object({
  remediations: z.array(decisionSchema),
  next_cursor: nextCursorSchema,
  budgets: z.array(remediationBudgetSchema).describe("the remediation budgets, apart from people's restart budget"),
});

/** The rule a cursor of this list was made for ('' = every rule): 422 invalid_cursor for another list or rule. */
function ruleOfCursor(cursor: string, given: string | undefined): string | undefined {
  const list = (cursorJson(cursor) as { l?: unknown } | undefined)?.l;
  const m = typeof list === 'string' ? /^remediations:(.*)$/.exec(list) : null;
  if (!m) throw new UnprocessableError('cursor is not a next_cursor of this list', 'invalid_cursor');
  const rule = m[1] === '' ? undefined : m[1];
  if (given !== undefined && given !== rule) {
    throw new UnprocessableError(
      'cursor continues another query (rule); give it alone, or with the rule of the query that answered it',
      'invalid_cursor',
    );
  }
  return rule;
}

export function remediationsRouter(deps: RemediationRoutesDeps): Router {
  const r = Router();
  const { anyKey } = keyChecks(deps);
  only(r, 'get', '/ops/remediations', anyKey, async (req, res) => {
    const q = parseQuery(remediationsQuerySchema, req.query);
    // A cursor carries the rule of the query that made it (in its list's name): alone it continues
    // that query; with another rule it is refused.
    const rule = q.cursor === undefined ? q.rule : ruleOfCursor(q.cursor, q.rule);
    const all = await redisCall(() => deps.store.decisions(), deps.redis);
    // Newest first: by time, then by place in the list (newest at its head), counted from its
    // oldest entry so that decisions recorded between two pages move no other one.
    const ranked = all.map((d, i) => ({ d, rank: all.length - 1 - i }));
    const mine = rule === undefined ? ranked : ranked.filter((e) => e.d.rule === rule);
    const page = keysetPage(`remediations:${rule ?? ''}`, mine, (e) => [-Date.parse(e.d.at), String(1e9 - e.rank).padStart(10, '0')], q);
    const budgets = deps.budgetUses ? await redisCall(() => deps.budgetUses!(), deps.redis) : [];
    const shown = rule === undefined ? budgets : budgets.filter((b) => b.budget === 'namespace' || b.name === rule);
    res.json({ remediations: page.items.map((e) => e.d), next_cursor: page.next_cursor, budgets: shown });
  });
  return r;
}
