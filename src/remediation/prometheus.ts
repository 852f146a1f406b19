import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import type { OutboundAuth } from '../shared/outboundAuth.js';
import { jsonApi, sameLabels, type Labels } from './api.js';

/**
 * A client of Prometheus's HTTP API (PROMETHEUS_URL; or any server answering its query API, such as
 * Thanos Query), where alerts are born. A notification's alert is one Prometheus fires when some
 * series ALERTS{alertstate="firing"} has labels (less alertstate) that all appear in the
 * notification, and its other labels are all Prometheus's external labels (PROMETHEUS_EXTERNAL_LABELS,
 * else /api/v1/status/config). It fires since ALERTS_FOR_STATE's active-since plus its rule's `for`.
 * Only Prometheus's rule evaluation writes those series: nothing posted to Alertmanager can make
 * them, and no notification's startsAt moves that time.
 */
export interface PrometheusClient {
  /** Since when (ms) the Prometheus alert these notified labels name fires; undefined: it does not. */
  firing(labels: Labels): Promise<number | undefined>;
}

class PrometheusError extends Error {
  override name = 'PrometheusError';
}

const vectorSchema = z.object({
  status: z.literal('success'),
  data: z.object({
    resultType: z.literal('vector'),
    result: z.array(z.object({ metric: z.record(z.string(), z.string()), value: z.tuple([z.number(), z.string()]) })),
  }),
});
const rulesSchema = z.object({
  status: z.literal('success'),
  data: z.object({
    groups: z.array(
      z.object({
        rules: z.array(
          z.object({
            type: z.string(),
            name: z.string(),
            duration: z.number().optional(),
            alerts: z.array(z.object({ labels: z.record(z.string(), z.string()) })).optional(),
          }),
        ),
      }),
    ),
  }),
});
const configSchema = z.object({ status: z.literal('success'), data: z.object({ yaml: z.string() }) });

/** How long external labels read from Prometheus are kept before they are read again. */
const EXTERNAL_LABELS_TTL_MS = 60_000;

const without = (m: Labels, ...names: string[]): Record<string, string> =>
  Object.fromEntries(Object.entries(m).filter(([k]) => !names.includes(k)));

/** A PromQL selector's string literal (Go's escapes, which JSON's quoting writes). */
const literal = (v: string): string => JSON.stringify(v);

/** Whether `series` (an ALERTS series, less alertstate) is the alert these notified labels name. */
function namesAlert(series: Labels, notified: Labels, external: Labels): boolean {
  for (const [k, v] of Object.entries(series)) if (!Object.hasOwn(notified, k) || notified[k] !== v) return false;
  for (const [k, v] of Object.entries(notified)) {
    if (Object.hasOwn(series, k)) continue;
    if (!Object.hasOwn(external, k) || external[k] !== v) return false;
  }
  return true;
}

export function createPrometheusClient(
  url: string,
  opts: { timeoutMs?: number; auth?: OutboundAuth; externalLabels?: Labels } = {},
): PrometheusClient {
  const api = jsonApi('Prometheus', url, opts, PrometheusError);
  let external: { labels: Record<string, string>; until: number } | undefined;
  const get = async <T>(path: string, schema: z.ZodType<T>, what: string) => api.parse(schema, await api.call('GET', path), what);
  const query = (q: string) => get(`/api/v1/query?${new URLSearchParams({ query: q }).toString()}`, vectorSchema, 'query result');

  async function externalLabels(): Promise<Labels> {
    if (opts.externalLabels) return opts.externalLabels;
    if (external && external.until > Date.now()) return external.labels;
    const cfg = await get('/api/v1/status/config', configSchema, 'configuration');
    let parsed: unknown;
    try {
      parsed = parseYaml(cfg.data.yaml);
    } catch {
      throw new PrometheusError('Prometheus answered a configuration that is not YAML');
    }
    const raw = (parsed as { global?: { external_labels?: unknown } } | null)?.global?.external_labels ?? {};
    const labels = z.record(z.string(), z.string()).safeParse(raw);
    if (!labels.success) throw new PrometheusError('Prometheus answered external labels that are not a map of strings');
    external = { labels: labels.data, until: Date.now() + EXTERNAL_LABELS_TTL_MS };
    return labels.data;
  }

  return {
    async firing(labels) {
      const alertname = labels.alertname;
      if (alertname === undefined || alertname === '') return undefined;
      const ext = await externalLabels();
      const alerts = await query(`ALERTS{alertstate="firing",alertname=${literal(alertname)}}`);
      const series = alerts.data.result.map((r) => without(r.metric, 'alertstate', '__name__')).find((m) => namesAlert(m, labels, ext));
      if (!series) return undefined;
      const [forState, rules] = await Promise.all([
        query(`ALERTS_FOR_STATE{alertname=${literal(alertname)}}`),
        get(`/api/v1/rules?type=alert`, rulesSchema, 'list of rules'),
      ]);
      const state = forState.data.result.find((r) => sameLabels(without(r.metric, '__name__'), series));
      const activeSince = state ? Number(state.value[1]) : NaN;
      if (!Number.isFinite(activeSince)) throw new PrometheusError(`Prometheus has no ALERTS_FOR_STATE of the firing alert ${alertname}`);
      const named = rules.data.groups.flatMap((g) => g.rules).filter((r) => r.type === 'alerting' && r.name === alertname);
      const rule = named.find((r) => r.alerts?.some((a) => sameLabels(a.labels, series))) ?? (named.length === 1 ? named[0] : undefined);
      if (!rule) throw new PrometheusError(`Prometheus names no single alerting rule ${alertname} that fires this alert`);
      return Math.round((activeSince + (rule.duration ?? 0)) * 1000);
    },
  };
}
