import { githubShapedPush } from './fields.js';
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
  ...githubShapedPush(true),
  example: {
    ref: 'refs/heads/main',
    before: '6113728f27ae82c7b1a177c8d03f9e96e0adf246',
    after: '0000000000000000000000000000000000000001',
    deleted: false,
    repository: { full_name: 'Codertocat/Hello-World' },
  },
  replayGuard: true,
  deliveryHeaders: ['X-GitHub-Delivery'],
  formPayload: true,
  setup: 'repository → Settings → Webhooks: Payload URL `…/webhook/github`, Secret, "Just the push event"',
};
