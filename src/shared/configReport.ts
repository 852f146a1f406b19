import type { ConfigError } from './errors.js';

/**
 * A configuration that stops the start, said before any logger exists (its settings may be what is wrong): one JSON line on
 * stdout in the logger's shape, and one line per problem on stderr for a person. Each names the variable, never a value.
 */
export function reportConfigError(processName: 'opsgate-api' | 'opsgate-worker', component: 'api' | 'worker', err: ConfigError): void {
  const line = { level: 'error', time: new Date().toISOString(), component, msg: 'configuration error', problems: err.problems };
  process.stdout.write(`${JSON.stringify(line)}\n`);
  process.stderr.write(err.problems.map((p) => `${processName}: configuration error: ${p.variable}: ${p.problem}\n`).join(''));
}
