import { describe, expect, it } from '@jest/globals';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { createLogger } from '../../../src/shared/logger.js';
import { secretsForWorker } from '../../../worker/secrets.js';

/** What the worker's logger redacts: the Redis password and the secret parts of webhook URLs. */
describe('secretsForWorker', () => {
  const config = loadWorkerConfig({
    REDIS_URL: 'redis://:p%40ss-word-1@redis:6379/0',
    NOTIFY_WEBHOOK_URLS:
      'https://hooks.slack.com/services/T0AAA1111/B0BBB2222/xoxXyZsecretTokenValue, https://user:pagerpw99@pager.example/hook?routing_key=rk-0123456789',
  });
  const secrets = secretsForWorker(config);

  it('covers the Redis password (decoded), whole URLs, tokens in paths and query strings, URL credentials', () => {
    expect(secrets).toEqual(
      expect.arrayContaining([
        'p@ss-word-1',
        'https://hooks.slack.com/services/T0AAA1111/B0BBB2222/xoxXyZsecretTokenValue',
        'xoxXyZsecretTokenValue',
        'T0AAA1111',
        'pagerpw99',
        'rk-0123456789',
      ]),
    );
  });

  it('does not turn ordinary words of a URL into redactions', () => {
    expect(secrets).not.toContain('services');
    expect(secrets).not.toContain('hooks.slack.com');
    const lines: string[] = [];
    const log = createLogger({ secrets, write: (l) => lines.push(l) });
    log.info('3 services down', { summary: 'token xoxXyZsecretTokenValue and pw p@ss-word-1 leaked' });
    expect(lines[0]).toContain('3 services down');
    expect(lines[0]).toContain('token [REDACTED] and pw [REDACTED] leaked');
  });
});
