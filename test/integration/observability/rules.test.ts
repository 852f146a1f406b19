import { execFileSync, spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, test } from '@jest/globals';
import { parse as parseYaml } from 'yaml';
import { createMetrics } from '../../../src/shared/metrics.js';

/**
 * The alert rules shipped in the chart (charts/opsgate/files/prometheus-rules.yaml) are checked
 * and unit-tested with the real promtool (`make tools-prom`): `promtool check rules` and
 * `promtool test rules monitoring/tests/*.yaml`.
 */
const ROOT = resolve(import.meta.dirname, '../../..');
const RULES = join(ROOT, 'charts/opsgate/files/prometheus-rules.yaml');
const TESTS_DIR = join(ROOT, 'monitoring/tests');
const PROMTOOL = process.env.PROMTOOL ?? 'promtool';

function promtool(args: string[], cwd = ROOT) {
  const r = spawnSync(PROMTOOL, args, { cwd, encoding: 'utf8', timeout: 60000 });
  if (r.error) throw new Error(`cannot run ${PROMTOOL} (make tools-prom): ${r.error.message}`);
  return { code: r.status, out: `${r.stdout}${r.stderr}` };
}

interface Rule {
  alert?: string;
  record?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}
const doc = parseYaml(readFileSync(RULES, 'utf8')) as { groups: { name: string; rules: Rule[] }[] };
const alerts = doc.groups.flatMap((g) => g.rules).filter((r) => r.alert);
const testFiles = readdirSync(TESTS_DIR)
  .filter((f) => /\.ya?ml$/.test(f))
  .map((f) => join(TESTS_DIR, f));

const tmp: string[] = [];
afterAll(() => tmp.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe('prometheus rules', () => {
  test('promtool is the real one', () => {
    expect(execFileSync(PROMTOOL, ['--version'], { encoding: 'utf8' })).toMatch(/promtool, version \d+\.\d+/);
  });

  test('promtool check rules: the file is valid as-is for plain Prometheus', () => {
    const r = promtool(['check', 'rules', RULES]);
    expect(r.out).toMatch(/SUCCESS: \d+ rules found/);
    expect(r.code).toBe(0);
  });

  test('promtool test rules: every unit test file passes', () => {
    expect(testFiles.length).toBeGreaterThan(0);
    const r = promtool(['test', 'rules', ...testFiles]);
    expect(r.out).not.toMatch(/FAILED/);
    expect(r.code).toBe(0);
  });

  test('the required alerts exist, each with severity, summary, description and a runbook hint', () => {
    const names = alerts.map((a) => a.alert);
    for (const required of [
      'OpsgateDeadLetterJobsPresent',
      'OpsgateQueueBacklogGrowing',
      'OpsgateWorkerDown',
      'OpsgateHigh5xxRatio',
      'OpsgateAuthFailureSpike',
    ]) {
      expect(names).toContain(required);
    }
    for (const a of alerts) {
      expect(['critical', 'warning', 'info']).toContain(a.labels?.severity);
      expect(a.annotations?.summary).toBeTruthy();
      expect(a.annotations?.description).toBeTruthy();
      expect(a.annotations?.runbook).toMatch(/\S{10,}/);
    }
  });

  test('every alert is exercised by a promtool unit test', () => {
    const tested = new Set<string>();
    for (const f of testFiles) {
      const t = parseYaml(readFileSync(f, 'utf8')) as { tests: { alert_rule_test?: { alertname: string; exp_alerts: unknown[] }[] }[] };
      for (const c of t.tests) for (const art of c.alert_rule_test ?? []) if (art.exp_alerts.length > 0) tested.add(art.alertname);
    }
    for (const a of alerts) expect([...tested]).toContain(a.alert);
  });

  test('every opsgate_* metric a rule uses is defined by the service', async () => {
    const m = createMetrics('api', 'test', { defaults: false });
    const families = new Set((await m.registry.getMetricsAsJSON()).map((x) => x.name));
    const used = new Set(alerts.flatMap((a) => a.expr.match(/\bopsgate_[a-z0-9_]+/g) ?? []));
    expect(used.size).toBeGreaterThan(3);
    for (const name of used) expect([...families]).toContain(name);
  });

  test('the unit tests catch a broken rule (thresholds raised -> promtool test fails)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-rules-'));
    tmp.push(dir);
    mkdirSync(join(dir, 'charts/opsgate/files'), { recursive: true });
    cpSync(TESTS_DIR, join(dir, 'monitoring/tests'), { recursive: true });
    const broken = readFileSync(RULES, 'utf8')
      .replace('> 0.05', '> 0.5')
      .replace('max by (queue) (opsgate_dead_letter_jobs) > 0', 'max by (queue) (opsgate_dead_letter_jobs) > 5');
    writeFileSync(join(dir, 'charts/opsgate/files/prometheus-rules.yaml'), broken);
    const r = promtool(['test', 'rules', ...testFiles.map((f) => join(dir, 'monitoring/tests', f.split('/').pop()!))], dir);
    expect(r.code).not.toBe(0);
    expect(r.out).toMatch(/alertname: OpsgateHigh5xxRatio/);
    expect(r.out).toMatch(/alertname: OpsgateDeadLetterJobsPresent/);
  });
});
