import { z } from 'zod';
import { HEX_COMMIT, commitOrNone, isZeroSha, nestedString, objectPayload, stringField } from './fields.js';
import type { PushSource } from './types.js';

/** GitHub: HMAC-SHA256 signature, `push` events, sha from `after`, project from repository.full_name. */
export const source: PushSource = {
  kind: 'push',
  name: 'github',
  title: 'GitHub',
  verification: { kind: 'hmac', header: 'X-Hub-Signature-256', algorithm: 'sha256', prefix: 'sha256=', encoding: 'hex' },
  secret: { env: 'GITHUB_WEBHOOK_SECRET', description: 'secret of /webhook/github (X-Hub-Signature-256)' },
  event: { header: 'X-GitHub-Event', push: 'push' },
  eventPrefix: 'github',
  commitField: 'after',
  commitForm: 'hex',
  example: {
    ref: 'refs/heads/main',
    before: '6113728f27ae82c7b1a177c8d03f9e96e0adf246',
    after: '0000000000000000000000000000000000000001',
    deleted: false,
    repository: { full_name: 'Codertocat/Hello-World' },
  },
  payload: z.looseObject({
    ref: z.string().optional().describe('branch reference; only refs/heads/main deploys'),
    before: z
      .string()
      .optional()
      .describe('the branch before the push: a push of the same before and after is deployed once by a delivery in 30 days'),
    after: z.string().regex(HEX_COMMIT).describe('the pushed commit, 7 to 64 hex digits; required for a push to main'),
    deleted: z.boolean().optional().describe('a branch deletion is ignored'),
    repository: z.looseObject({ full_name: z.string().optional() }).optional(),
  }),
  replayGuard: true,
  deliveryHeaders: ['X-GitHub-Delivery'],
  formPayload: true,
  setup: 'repository → Settings → Webhooks: Payload URL `…/webhook/github`, Secret, "Just the push event"',
  map(payload) {
    const p = objectPayload(payload);
    const sha = p.after;
    return {
      kind: 'push',
      fields: {
        ref: stringField(p, 'ref', ''),
        project: nestedString(p, 'repository', 'full_name', 'unknown'),
        sha,
        before: commitOrNone(p.before),
        // A branch deletion: nothing to deploy.
        deleted: p.deleted === true || (typeof sha === 'string' && isZeroSha(sha)),
      },
    };
  },
};
