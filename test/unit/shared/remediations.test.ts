import { describe, expect, it } from '@jest/globals';
import { parseInventory } from '../../../src/shared/inventory.js';
import { ConfigError } from '../../../src/shared/errors.js';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { policyFacts } from '../../../src/changes/facts.js';
import { matchesRule, remediationStartProblems } from '../../../src/shared/remediations.js';

/**
 * Remediation rules in the inventory (`remediations:`): the shape the docs give, its defaults,
 * durations in seconds for tests, matchers as Alertmanager writes them, every problem of the file
 * reported at once, and the start-up refusals.
 */
const HOSTS = `
hosts:
  web-1:
    namespace: shop
    deployments: [frontend, checkout]
`;

const ISSUE_EXAMPLE = `${HOSTS}
remediations:
  - name: storefront-unavailable
    match: {alertname: KubeDeploymentReplicasMismatch, labels: {severity: critical}}
    target: {namespace: namespace, deployment: deployment}
    targets: [web-1]
    trigger: {for: 2m, episodes: 1, within: 30m}
    cooldown: 15m
    escalate_after: 3
    escalation_window: 2h
    verify: 10m
    action: restart
    mode: act
    silence: true
`;

const problemsOf = (text: string): string[] => {
  try {
    parseInventory(text);
  } catch (err) {
    if (err instanceof ConfigError) return err.problems.map((p) => `${p.variable}: ${p.problem}`);
    throw err;
  }
  return [];
};

describe('the rule shape', () => {
  it("parses the issue's example, durations in seconds", () => {
    const [rule] = parseInventory(ISSUE_EXAMPLE).remediations;
    expect(rule).toEqual({
      name: 'storefront-unavailable',
      match: { alertname: 'KubeDeploymentReplicasMismatch', labels: { severity: 'critical' } },
      target: { namespace: 'namespace', deployment: 'deployment' },
      targets: ['web-1'],
      confirm: 'prometheus',
      budget: { restarts: 3, per: 3600 },
      trigger: { for: 120, episodes: 1, within: 1800 },
      cooldown: 900,
      escalate_after: 3,
      escalation_window: 7200,
      verify: 600,
      settle: 300,
      action: 'restart',
      mode: 'act',
      silence: true,
    });
  });

  it('defaults: restart, act, no silence, target labels namespace and deployment, for 0; seconds for tests', () => {
    const inv = parseInventory(`${HOSTS}
remediations:
  - name: quick
    match: {alertname: Down}
    targets: [shop/frontend]
    trigger: {for: 5s, episodes: 2, within: 30s}
    cooldown: 5s
    verify: 3s
    settle: 2s
`);
    expect(inv.remediations[0]).toMatchObject({
      action: 'restart',
      mode: 'act',
      silence: false,
      confirm: 'prometheus',
      budget: { restarts: 3, per: 3600 },
      target: { namespace: 'namespace', deployment: 'deployment' },
      trigger: { for: 5, episodes: 2, within: 30 },
      cooldown: 5,
      verify: 3,
      settle: 2,
      escalate_after: 3,
    });
    expect(
      parseInventory(`${HOSTS}\nremediations:\n  - {name: zero, match: {alertname: X}, targets: [web-1], trigger: {for: 0s}}\n`)
        .remediations[0]!.trigger.for,
    ).toBe(0);
    expect(parseInventory(HOSTS).remediations).toEqual([]);
  });

  it('matches the alert name and label matchers: exact, or an anchored =~regex; a missing label is the empty string', () => {
    const [rule] = parseInventory(`${HOSTS}
remediations:
  - name: m
    match: {alertname: Down, labels: {severity: "=~critical|page", team: shop}}
    targets: [web-1]
`).remediations;
    expect(matchesRule(rule!, { alertname: 'Down', severity: 'critical', team: 'shop', extra: 'x' })).toBe(true);
    expect(matchesRule(rule!, { alertname: 'Down', severity: 'page', team: 'shop' })).toBe(true);
    expect(matchesRule(rule!, { alertname: 'Down', severity: 'critical-ish', team: 'shop' })).toBe(false);
    expect(matchesRule(rule!, { alertname: 'Down', severity: 'critical' })).toBe(false);
    expect(matchesRule(rule!, { alertname: 'Other', severity: 'critical', team: 'shop' })).toBe(false);
  });
});

describe('validation at start, every problem at once', () => {
  it('names each bad field of each rule in one report', () => {
    const problems = problemsOf(`${HOSTS}
remediations:
  - name: Bad_Name
    match: {alertname: X, labels: {"bad-label": y, ok: "=~(unclosed"}}
    action: delete
    mode: maybe
    cooldown: soon
`);
    expect(problems).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/^OPS_INVENTORY_FILE: invalid at remediations\.0\.name: must be a DNS-1123 label/),
        expect.stringMatching(/^OPS_INVENTORY_FILE: invalid at remediations\.0\.match\.labels\.bad-label/),
        expect.stringMatching(/^OPS_INVENTORY_FILE: invalid at remediations\.0\.match\.labels\.ok: is not a valid regular expression/),
        expect.stringMatching(/^OPS_INVENTORY_FILE: invalid at remediations\.0\.action/),
        expect.stringMatching(/^OPS_INVENTORY_FILE: invalid at remediations\.0\.mode/),
        expect.stringMatching(/^OPS_INVENTORY_FILE: invalid at remediations\.0\.cooldown: cooldown must be a duration/),
      ]),
    );
    expect(problems.length).toBeGreaterThanOrEqual(6);
  });

  it('a rule reaches no further than the inventory: a pinned namespace or Deployment must be a host’s; names are unique', () => {
    const problems = problemsOf(`${HOSTS}
remediations:
  - {name: a, match: {alertname: X, labels: {namespace: payments}}, targets: [web-1]}
  - {name: b, match: {alertname: X, labels: {namespace: shop, deployment: ledger}}, targets: [web-1]}
  - {name: b, match: {alertname: X, labels: {namespace: shop, deployment: frontend}}, targets: [web-1]}
  - {name: c, match: {alertname: X}, target: {namespace: app, deployment: app}, targets: [web-1]}
  - {name: d, match: {alertname: X}, targets: [web-2, shop/ledger, shop/frontend]}
`);
    expect(problems).toEqual([
      'OPS_INVENTORY_FILE: invalid at remediations.0.match.labels: pins namespace payments, which no inventory host has',
      'OPS_INVENTORY_FILE: invalid at remediations.1.match.labels: pins Deployment ledger, which no inventory host of namespace shop lists',
      'OPS_INVENTORY_FILE: invalid at remediations.2.name: repeats the rule name b',
      'OPS_INVENTORY_FILE: invalid at remediations.3.target: namespace and deployment must be two different labels',
      'OPS_INVENTORY_FILE: invalid at remediations.4.targets.0: names host "web-2", which the inventory lacks',
      'OPS_INVENTORY_FILE: invalid at remediations.4.targets.1: names Deployment shop/ledger, which no inventory host lists',
    ]);
    expect(problemsOf(`${HOSTS}\nremediations:\n  - {name: e, match: {alertname: X}}\n`)).toEqual([
      'OPS_INVENTORY_FILE: invalid at remediations.0.targets: is required: list what the rule may restart (inventory hosts, namespace/Deployment pairs)',
    ]);
  });
});

describe('start-up refusals', () => {
  const rules = parseInventory(ISSUE_EXAMPLE).remediations;

  const none = { prometheus: false, alertmanagerAuthenticated: false };
  const prometheus = { prometheus: true, alertmanagerAuthenticated: false };

  it('rules without an authenticated alerts sender, and silences without ALERTMANAGER_URL', () => {
    expect(remediationStartProblems(rules, { alertsAuthenticated: false, confirm: prometheus })).toEqual([
      {
        variable: 'ALERTS_WEBHOOK_TOKEN',
        problem: expect.stringContaining('anyone could post a firing alert that restarts a Deployment'),
      },
      { variable: 'ALERTMANAGER_URL', problem: expect.stringContaining('storefront-unavailable') },
    ]);
    expect(remediationStartProblems(rules, { alertsAuthenticated: true, alertmanagerUrl: 'http://am:9093', confirm: prometheus })).toEqual(
      [],
    );
    expect(remediationStartProblems([], { alertsAuthenticated: false, confirm: none })).toEqual([]);
  });

  it('an act rule with no way to confirm its alerts, naming both ways; a dry-run rule may run unconfirmed', () => {
    const [rule] = rules;
    const ok = { alertsAuthenticated: true, alertmanagerUrl: 'http://am:9093' };
    const problems = remediationStartProblems(rules, { ...ok, confirm: none });
    expect(problems).toEqual([{ variable: 'PROMETHEUS_URL', problem: expect.stringContaining('(storefront-unavailable)') }]);
    expect(problems[0]!.problem).toMatch(
      /set PROMETHEUS_URL .* or, for alerts born elsewhere, give the rule confirm: alertmanager with ALERTMANAGER_URL and credentials/,
    );
    const byAm = [{ ...rule!, confirm: 'alertmanager' as const }];
    expect(remediationStartProblems(byAm, { ...ok, confirm: prometheus })).toEqual([
      {
        variable: 'ALERTMANAGER_URL',
        problem: expect.stringMatching(/^has no credentials of its API .*confirm: prometheus with PROMETHEUS_URL/),
      },
    ]);
    expect(remediationStartProblems(byAm, { ...ok, confirm: { prometheus: false, alertmanagerAuthenticated: true } })).toEqual([]);
    expect(remediationStartProblems([{ ...rule!, mode: 'dry-run' as const }], { ...ok, confirm: none })).toEqual([]);
  });
});

describe('ALERTMANAGER_URL', () => {
  it('optional in both processes; an http(s) URL, its trailing slash dropped; anything else names the variable', () => {
    const redis = { REDIS_URL: 'redis://127.0.0.1:6379' };
    expect(loadWorkerConfig(redis).ALERTMANAGER_URL).toBeUndefined();
    expect(loadWorkerConfig({ ...redis, ALERTMANAGER_URL: 'http://alertmanager.monitoring:9093/' }).ALERTMANAGER_URL).toBe(
      'http://alertmanager.monitoring:9093',
    );
    expect(() => loadWorkerConfig({ ...redis, ALERTMANAGER_URL: 'alertmanager:9093' })).toThrow('ALERTMANAGER_URL: must be an http(s) URL');
  });
});

describe("a rule's approval", () => {
  const inv = parseInventory(`
hosts:
  web-1: {namespace: shop, deployments: [frontend]}
  pay-1: {namespace: payments, deployments: [api], policy: {approval: {required: 2, ttl: 10m}}}
`);
  const change = (host: string, service: string, namespace: string, approval?: { required: number; ttl: number }) => ({
    target: { kind: 'restart' as const, host, service, namespace },
    requester: { principal: 'remediation:r', credential: '', owner: 'remediation:r', ownerKnown: true },
    origin: 'remediation' as const,
    auditId: 'a',
    ...(approval ? { approval } : {}),
  });

  it('is asked for where the host has none, and the stricter of the two wins where it has one', () => {
    expect(policyFacts(inv, [], change('web-1', 'frontend', 'shop'), 0).approval).toBeUndefined();
    expect(policyFacts(inv, [], change('web-1', 'frontend', 'shop', { required: 1, ttl: 3600 }), 0).approval).toEqual({
      required: 1,
      ttl: 3600,
    });
    expect(policyFacts(inv, [], change('pay-1', 'api', 'payments', { required: 1, ttl: 3600 }), 0).approval).toEqual({
      required: 2,
      ttl: 600,
    });
    expect(policyFacts(inv, [], change('pay-1', 'api', 'payments', { required: 3, ttl: 3600 }), 0).approval).toEqual({
      required: 3,
      ttl: 3600,
    });
  });
});
