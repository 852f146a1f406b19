import { secretFileVar } from './index.js';
import type { Source, Verification } from './types.js';

/** The senders table of docs/senders.md (`make docs-senders` writes it; docs.test.ts fails when the page's differs). */
export const TABLE_BEGIN = '<!-- senders:begin (make docs-senders) -->';
export const TABLE_END = '<!-- senders:end -->';

const table = (begin: string, head: string, rows: string[], end: string): string =>
  [begin, head, head.replace(/[^|]+/g, '---'), ...rows, end].join('\n');

function proof(v: Verification): string {
  switch (v.kind) {
    case 'token':
      return `\`${v.header}\` equal to the secret`;
    case 'hmac':
      return `\`${v.header}: ${v.prefix}<${v.encoding} HMAC-SHA256 of the body>\``;
    case 'timestamped-hmac':
      return `\`${v.header}: t=<unix s>,v1=<hex HMAC-SHA256 of "t.body">\`, ${v.toleranceSeconds / 60} min window, no reuse`;
    case 'bearer':
      return '`Authorization: Bearer` when the secret is set';
  }
}

export function sendersTable(sources: readonly Source[]): string {
  const rows = sources.map((s) => {
    const own = `\`${s.secret.env}\` or \`${secretFileVar(s.secret.env)}\``;
    const secret = s.secret.fallbackEnv ? `${own} (else \`${s.secret.fallbackEnv}\`)` : own;
    const event = s.kind === 'push' ? `\`${s.event.header}: ${s.event.push}\`` : 'firing alerts';
    const delivery = s.kind === 'push' && s.deliveryHeaders?.length ? s.deliveryHeaders.map((h) => `\`${h}\``).join(', ') : '—';
    return `| \`/webhook/${s.name}\` | ${s.title} | ${proof(s.verification)} | ${event} | ${delivery} | ${secret} | ${s.setup} |`;
  });
  const head =
    '| Path | Sender | Proof | Deploys / queues on | Delivery id (kept 30 days) | Secret variable, or its file | Where to set it up |';
  return table(TABLE_BEGIN, head, rows, TABLE_END);
}

/** The chart README's table of how an installation enables each sender (the chart's senders.test.ts checks the names). */
export const CHART_TABLE_BEGIN = '<!-- chart-senders:begin (make docs-senders) -->';
export const CHART_TABLE_END = '<!-- chart-senders:end -->';

export function chartSendersTable(sources: readonly Source[]): string {
  const rows = sources.map((s) => {
    const fallback = s.secret.fallbackEnv ? ` (unset: \`${s.secret.fallbackEnv}\`)` : '';
    return `| ${s.title} | \`webhooks.senders.${s.name}.enabled\` | \`secrets.webhookSecrets.${s.name}\` | \`${s.secret.env}\`${fallback} | \`/webhook/${s.name}\` |`;
  });
  return table(CHART_TABLE_BEGIN, '| Sender | Enable | Its secret | Secret key = variable | Ingress path (Exact) |', rows, CHART_TABLE_END);
}
