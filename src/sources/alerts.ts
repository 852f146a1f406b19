import type { AlertsSource } from './types.js';

/** Alertmanager's webhook receiver (`webhook_configs`); the bearer token is optional. */
export const source: AlertsSource = {
  kind: 'alerts',
  name: 'alerts',
  title: 'Alertmanager',
  verification: { kind: 'bearer', optional: true },
  secret: {
    env: 'ALERTS_WEBHOOK_TOKEN',
    description: 'bearer token of /webhook/alerts; unset: open (restrict it by network policy)',
  },
  setup: 'a `webhook_configs` receiver with `http_config.authorization.credentials` (k8s/examples/alertmanager-config.yaml)',
};
