import { z } from 'zod';
import { UnprocessableError } from '../shared/errors.js';
import { HEX_COMMIT, commitOrNone, isObject, nestedString, objectPayload } from './fields.js';
import type { PushSource } from './types.js';

/**
 * Bitbucket Cloud. One delivery may carry several pushes (`push.changes`): the one to the deploy branch counts;
 * a null `new` deleted its branch; `old.target.hash` is the commit before it.
 */
export const source: PushSource = {
  kind: 'push',
  name: 'bitbucket',
  title: 'Bitbucket Cloud',
  verification: { kind: 'hmac', header: 'X-Hub-Signature', algorithm: 'sha256', prefix: 'sha256=', encoding: 'hex' },
  secret: { env: 'BITBUCKET_WEBHOOK_SECRET', description: 'secret of /webhook/bitbucket (X-Hub-Signature)' },
  event: { header: 'X-Event-Key', push: 'repo:push' },
  eventPrefix: 'bitbucket',
  commitField: 'push.changes[].new.target.hash',
  commitForm: 'hex',
  example: {
    repository: { full_name: 'team/app' },
    push: {
      changes: [
        {
          new: { type: 'branch', name: 'main', target: { hash: '709d658dc5b6d6afcd46049c2f332ee3f515a67d' } },
          old: { type: 'branch', name: 'main', target: { hash: '1e65c05c1d5171631d92438a13901ca7dae9618c' } },
        },
      ],
    },
  },
  payload: z.looseObject({
    repository: z.looseObject({ full_name: z.string().optional() }).optional(),
    push: z.looseObject({
      changes: z.array(
        z.looseObject({
          new: z
            .looseObject({
              type: z.string(),
              name: z.string(),
              target: z.looseObject({ hash: z.string().regex(HEX_COMMIT).describe('the pushed commit, 7 to 64 hex digits') }),
            })
            .nullable()
            .describe('the branch after the push; null when it was deleted'),
          old: z
            .looseObject({ type: z.string(), name: z.string(), target: z.looseObject({ hash: z.string() }).optional() })
            .nullable()
            .optional()
            .describe(
              'the branch before the push; null when it was created. A push of the same old and new commit is deployed once by a delivery in 30 days',
            ),
        }),
      ),
    }),
  }),
  replayGuard: true,
  deliveryHeaders: ['X-Request-UUID'],
  setup: 'repository → Repository settings → Webhooks → Add webhook: URL `…/webhook/bitbucket`, Secret, trigger "Repository push"',
  map(payload, deployRef) {
    const p = objectPayload(payload);
    const project = nestedString(p, 'repository', 'full_name', 'unknown');
    const push = p.push;
    if (!isObject(push) || !Array.isArray(push.changes)) throw new UnprocessableError('push.changes must be an array', 'invalid_payload');
    const changes = push.changes.map((c, i) => {
      if (!isObject(c)) throw new UnprocessableError(`push.changes[${i}] must be an object`, 'invalid_payload');
      const side = isObject(c.new) ? c.new : isObject(c.old) ? c.old : undefined;
      const name = side && typeof side.name === 'string' ? side.name : '';
      const isBranch = side?.type === 'branch';
      const target = isObject(c.new) && isObject(c.new.target) ? c.new.target : undefined;
      const before = isObject(c.old) && isObject(c.old.target) ? commitOrNone(c.old.target.hash) : '';
      return { ref: isBranch ? `refs/heads/${name}` : name, sha: target?.hash, before, deleted: !isObject(c.new) };
    });
    if (changes.length === 0) return { kind: 'ignored', reason: 'push.changes is empty' };
    const chosen = changes.find((c) => c.ref === deployRef) ?? changes[0]!;
    return { kind: 'push', fields: { project, ref: chosen.ref, sha: chosen.sha, before: chosen.before, deleted: chosen.deleted } };
  },
};
