import type { CommonConfig } from '../shared/config.js';
import type { Logger } from '../shared/logger.js';
import { authenticates, loadOutboundAuth } from '../shared/outboundAuth.js';
import type { ConfirmSources } from '../shared/remediations.js';
import { createAlertmanagerClient } from './alertmanager.js';
import type { RemediationDeps } from './engine.js';
import { createPrometheusClient } from './prometheus.js';

/**
 * The servers remediation asks, for the API and the worker alike: Prometheus (PROMETHEUS_URL) and
 * Alertmanager (ALERTMANAGER_URL; it confirms alerts only when asked with credentials). A problem
 * with their credentials is a ConfigError naming the variables.
 */
type RemediationSources = Pick<RemediationDeps, 'prometheus' | 'alertmanager'> & { alertmanagerAuthenticated: boolean };

export function remediationSources(
  config: Partial<Pick<CommonConfig, 'PROMETHEUS_URL' | 'ALERTMANAGER_URL' | 'PROMETHEUS_EXTERNAL_LABELS'>>,
  logger?: Pick<Logger, 'addSecrets' | 'error'>,
): RemediationSources {
  const env = config as Readonly<Record<string, string | undefined>>;
  const opts = {
    onSecret: (v: string) => logger?.addSecrets([v]),
    onRefused: (p: { variable: string; problem: string }) =>
      logger?.error('credentials reload refused: keeping the ones in use', { variable: p.variable, problems: [p] }),
  };
  const out: RemediationSources = { alertmanagerAuthenticated: false };
  if (config.PROMETHEUS_URL) {
    const auth = loadOutboundAuth(env, 'PROMETHEUS', { tenant: true, ...opts });
    const externalLabels = config.PROMETHEUS_EXTERNAL_LABELS;
    out.prometheus = createPrometheusClient(config.PROMETHEUS_URL, { auth, ...(externalLabels ? { externalLabels } : {}) });
  }
  if (config.ALERTMANAGER_URL) {
    const auth = loadOutboundAuth(env, 'ALERTMANAGER', opts);
    out.alertmanager = createAlertmanagerClient(config.ALERTMANAGER_URL, { auth });
    out.alertmanagerAuthenticated = authenticates(auth);
  }
  return out;
}

export const confirmSourcesOf = (s: RemediationSources): ConfirmSources => ({
  prometheus: s.prometheus !== undefined,
  alertmanagerAuthenticated: s.alertmanagerAuthenticated,
});
