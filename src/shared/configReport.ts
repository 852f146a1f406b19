import type { ConfigError } from './errors.js';

/**
 * How a process that cannot start for its configuration says so, before any logger exists (its
 * own settings may be what is wrong): one JSON line on stdout in the logger's shape, for log
 * pipelines, and one human line per problem on stderr, for a person at a terminal or reading
 * `kubectl logs --previous`. Each names the variable and the problem, never a value.
 */
export function reportConfigError(processName: 'opsgate-api' | 'opsgate-worker', component: 'api' | 'worker', err: ConfigError): void {
  const line = { level: 'error', time: new Date().toISOString(), component, msg: 'configuration error', problems: err.problems };
  process.stdout.write(`${JSON.stringify(line)}\n`);
  process.stderr.write(err.problems.map((p) => `${processName}: configuration error: ${p.variable}: ${p.problem}\n`).join(''));
}
