import { githubShapedPush } from './fields.js';
import type { PushSource } from './types.js';

/** Gitea and Forgejo (which sends X-Gitea-Signature beside its own): GitHub's payload, an unprefixed signature. */
export const source: PushSource = {
  kind: 'push',
  name: 'gitea',
  title: 'Gitea / Forgejo',
  verification: { kind: 'hmac', header: 'X-Gitea-Signature', algorithm: 'sha256', prefix: '', encoding: 'hex' },
  secret: { env: 'GITEA_WEBHOOK_SECRET', description: 'secret of /webhook/gitea (X-Gitea-Signature)' },
  event: { header: 'X-Gitea-Event', push: 'push' },
  eventPrefix: 'gitea',
  ...githubShapedPush(false),
  example: {
    ref: 'refs/heads/main',
    before: '28e1879d029cb852e4844d9c718537df08844e03',
    after: 'bffeb74224043ba2feb48d137756c8a9331c449a',
    repository: { full_name: 'gitea/webhooks' },
  },
  replayGuard: true,
  deliveryHeaders: ['X-Gitea-Delivery'],
  setup:
    'repository → Settings → Webhooks → Add webhook → Gitea (or Forgejo): Target URL `…/webhook/gitea`, POST, application/json, Secret, "Push events"',
};
