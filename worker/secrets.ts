import { STATUS_HOSTS, type WorkerConfig } from '../src/shared/config.js';
import { outboundSecrets } from '../src/shared/outboundVariables.js';
import { redisPasswords } from '../src/shared/redis.js';

/**
 * What the worker's logger redacts: Redis passwords, the outbound tokens, and every notify endpoint
 * URL with its credential-looking parts (userinfo, long path segments and query values), since
 * on-call webhook URLs carry their token in the path.
 */
export function secretsForWorker(config: WorkerConfig): string[] {
  const out = [
    ...redisPasswords(config.REDIS_URL),
    ...['PROMETHEUS', 'ALERTMANAGER', ...STATUS_HOSTS].flatMap((prefix) => outboundSecrets(config, prefix)),
  ];
  for (const raw of config.NOTIFY_WEBHOOK_URLS) {
    out.push(raw);
    try {
      const u = new URL(raw);
      if (u.password) out.push(decodeURIComponent(u.password), u.password);
      if (u.username) out.push(decodeURIComponent(u.username), u.username);
      const rest = u.pathname + u.search;
      if (rest.length >= 8) out.push(rest);
      // Token-looking parts on their own (long, or with digits): not words like "services" or "hooks".
      const tokenish = (v: string) => v.length >= 12 || (v.length >= 8 && /\d/.test(v));
      for (const seg of u.pathname.split('/')) if (tokenish(seg)) out.push(seg);
      for (const v of u.searchParams.values()) if (tokenish(v)) out.push(v);
    } catch {
      /* validated by the config schema */
    }
  }
  return [...new Set(out)];
}
