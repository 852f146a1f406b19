import { z } from 'zod';
import { objectPayload, stringField } from './fields.js';
import type { PushSource } from './types.js';

/** In-house senders: a timestamped HMAC (5-minute window, no reuse) over opsgate's own {"project", "ref", "sha"}. */
export const source: PushSource = {
  kind: 'push',
  name: 'generic',
  title: 'Generic HMAC (in-house senders)',
  verification: { kind: 'timestamped-hmac', header: 'X-Opsgate-Signature', toleranceSeconds: 300 },
  secret: { env: 'GENERIC_WEBHOOK_SECRET', description: 'secret of /webhook/generic (X-Opsgate-Signature)' },
  event: { header: 'X-Opsgate-Event', push: 'push' },
  eventPrefix: 'generic',
  commitField: 'sha',
  commitForm: 'any',
  example: { project: 'team/app', ref: 'refs/heads/main', sha: '2f1c6a7d0b1e4f3a9c8d7e6f5a4b3c2d1e0f9a8b' },
  payload: z.looseObject({
    project: z.string().optional().describe('the inventory project; default "unknown"'),
    ref: z.string().optional().describe('branch reference; only refs/heads/main deploys'),
    sha: z.string().describe('the pushed commit; required for a push to main'),
  }),
  deliveryHeaders: ['X-Opsgate-Delivery'],
  setup: 'your own sender: sign `<t>.<body>` with HMAC-SHA256, as the list below the table shows',
  map(payload) {
    const p = objectPayload(payload);
    return {
      kind: 'push',
      fields: { ref: stringField(p, 'ref', ''), project: stringField(p, 'project', 'unknown'), sha: p.sha },
    };
  },
};
