import { describe, expect, jest, test } from '@jest/globals';
import { loadApiConfig } from '../../../src/api/config.js';
import { SOURCES } from '../../../src/sources/index.js';
import { createSenderSecrets } from '../../../src/shared/liveSecrets.js';
import { containerEnv, find, one, render, renderError, renderNotes, secretData, type K8sObject } from '../../helpers/helm.js';

/**
 * The webhook senders in the chart (webhooks.senders, secrets.webhookSecrets, one helper in
 * _helpers.tpl): rendered with the real helm, every sender of src/sources gets the Secret key, the
 * api variable and the Ingress path its module names, so the chart's naming rule and the registry
 * cannot drift; senders beyond the defaults are a values change only; the values of earlier chart
 * versions keep their meaning.
 */
jest.setTimeout(120_000);

type Env = { name: string; valueFrom?: { secretKeyRef?: { name: string; key: string; optional?: boolean } } };

const apiEnv = (objs: K8sObject[]) => one(objs, 'Deployment', 'opsgate-api').spec.template.spec.containers[0].env as Env[];
const workerEnv = (objs: K8sObject[]) => one(objs, 'Deployment', 'opsgate-worker').spec.template.spec.containers[0].env as Env[];
const ingressPaths = (objs: K8sObject[]) =>
  (one(objs, 'Ingress', 'opsgate').spec.rules[0].http.paths as { path: string; pathType: string }[]).map((p) => `${p.pathType} ${p.path}`);
const webhookPaths = (objs: K8sObject[]) => ingressPaths(objs).filter((p) => p.includes('/webhook'));
/** The env entries of the api that are webhook senders' secrets, as name -> secretKeyRef. */
const senderRefs = (objs: K8sObject[]) =>
  Object.fromEntries(
    apiEnv(objs)
      .filter((e) => /_WEBHOOK_(SECRET|TOKEN)$/.test(e.name))
      .map((e) => [e.name, e.valueFrom?.secretKeyRef]),
  );
const senderKeys = (objs: K8sObject[]) =>
  Object.keys(secretData(objs))
    .filter((k) => /_WEBHOOK_(SECRET|TOKEN)$/.test(k))
    .sort();

const base = { files: ['defaults-values.yaml'] };
const ingressOn = { 'ingress.enabled': 'true', 'ingress.host': 'opsgate.example.com' };
/** A fake secret per sender name, recognisable in the output. */
const fakeSecret = (name: string) => `fake-${name}-secret-0011`;

describe('every sender of src/sources, enabled with a secret', () => {
  const set: Record<string, string> = { ...ingressOn };
  for (const s of SOURCES) {
    set[`webhooks.senders.${s.name}.enabled`] = 'true';
    set[`secrets.webhookSecrets.${s.name}`] = fakeSecret(s.name);
  }
  let objs: K8sObject[];

  test('renders', async () => {
    objs = await render({ ...base, set });
  });

  test("the Secret holds each sender's secret under the variable its module names (source.secret.env)", () => {
    const data = secretData(objs);
    for (const s of SOURCES) expect([s.name, data[s.secret.env]]).toEqual([s.name, fakeSecret(s.name)]);
    expect(senderKeys(objs)).toEqual(SOURCES.map((s) => s.secret.env).sort());
  });

  test("the api gets each sender's variable by secretKeyRef of the key of the same name, optional; the worker none", () => {
    const refs = senderRefs(objs);
    expect(Object.keys(refs).sort()).toEqual(SOURCES.map((s) => s.secret.env).sort());
    for (const s of SOURCES) expect(refs[s.secret.env]).toEqual({ name: 'opsgate', key: s.secret.env, optional: true });
    expect(workerEnv(objs).filter((e) => /_WEBHOOK_(SECRET|TOKEN)$/.test(e.name))).toEqual([]);
  });

  test('the Ingress routes each /webhook/<name> as an Exact path, and no /webhook prefix', () => {
    expect(webhookPaths(objs).sort()).toEqual(SOURCES.map((s) => `Exact /webhook/${s.name}`).sort());
    expect(ingressPaths(objs)).toEqual(expect.arrayContaining(['Prefix /ops', 'Exact /health']));
  });

  test("the API, started with the api container's environment, holds each sender's secret", () => {
    const env = containerEnv(objs, 'opsgate-api');
    const secrets = createSenderSecrets(loadApiConfig(env).senderSecrets);
    for (const s of SOURCES) expect([s.name, secrets.of(s)()[0]]).toEqual([s.name, fakeSecret(s.name)]);
  });
});

describe('gitea, bitbucket and generic added to an installation by values alone', () => {
  const added = ['gitea', 'bitbucket', 'generic'];
  const set: Record<string, string> = { ...ingressOn, 'secrets.webhookSecrets.alerts': 'fake-alerts-token-0011' };
  for (const name of added) {
    set[`webhooks.senders.${name}.enabled`] = 'true';
    set[`secrets.webhookSecrets.${name}`] = fakeSecret(name);
  }

  test('their Secret keys, api variables and Ingress paths join those of the default senders', async () => {
    const objs = await render({ ...base, set });
    const data = secretData(objs);
    expect(data).toMatchObject({
      GITEA_WEBHOOK_SECRET: fakeSecret('gitea'),
      BITBUCKET_WEBHOOK_SECRET: fakeSecret('bitbucket'),
      GENERIC_WEBHOOK_SECRET: fakeSecret('generic'),
      ALERTS_WEBHOOK_TOKEN: 'fake-alerts-token-0011',
    });
    expect(Object.keys(senderRefs(objs)).sort()).toEqual([
      'ALERTS_WEBHOOK_TOKEN',
      'BITBUCKET_WEBHOOK_SECRET',
      'GENERIC_WEBHOOK_SECRET',
      'GITEA_WEBHOOK_SECRET',
      'GITHUB_WEBHOOK_SECRET',
      'GITLAB_WEBHOOK_SECRET',
      'SCM_WEBHOOK_SECRET',
    ]);
    expect(webhookPaths(objs).sort()).toEqual(
      ['alerts', 'bitbucket', 'generic', 'gitea', 'github', 'gitlab', 'scm'].map((n) => `Exact /webhook/${n}`).sort(),
    );
    const secrets = createSenderSecrets(loadApiConfig(containerEnv(objs, 'opsgate-api')).senderSecrets);
    for (const name of added) expect(secrets.of(SOURCES.find((s) => s.name === name)!)()[0]).toBe(fakeSecret(name));
  });

  test('with secrets.existingSecret the same senders read the keys of that Secret', async () => {
    const objs = await render({
      set: { 'secrets.existingSecret': 'mine', ...Object.fromEntries(added.map((n) => [`webhooks.senders.${n}.enabled`, 'true'])) },
    });
    expect(find(objs, 'Secret')).toHaveLength(0);
    const refs = senderRefs(objs);
    for (const env of ['GITEA_WEBHOOK_SECRET', 'BITBUCKET_WEBHOOK_SECRET', 'GENERIC_WEBHOOK_SECRET', 'SCM_WEBHOOK_SECRET'])
      expect(refs[env]).toEqual({ name: 'mine', key: env, optional: true });
  });

  test('a name the chart has never seen needs no template either: its variable follows the rule, dashes as underscores', async () => {
    const objs = await render({
      ...base,
      set: { ...ingressOn, 'ingress.routeAlertsWebhook': 'false', 'webhooks.senders.acme-ci.enabled': 'true' },
      setString: { 'secrets.webhookSecrets.acme-ci': 'fake-acme-ci-secret-0011' },
    });
    expect(secretData(objs).ACME_CI_WEBHOOK_SECRET).toBe('fake-acme-ci-secret-0011');
    expect(senderRefs(objs).ACME_CI_WEBHOOK_SECRET).toEqual({ name: 'opsgate', key: 'ACME_CI_WEBHOOK_SECRET', optional: true });
    expect(webhookPaths(objs)).toContain('Exact /webhook/acme-ci');
  });
});

describe('the defaults and the values of earlier chart versions', () => {
  test('defaults: scm, github, gitlab and alerts, as before; no other sender', async () => {
    const objs = await render(base);
    expect(Object.keys(senderRefs(objs)).sort()).toEqual([
      'ALERTS_WEBHOOK_TOKEN',
      'GITHUB_WEBHOOK_SECRET',
      'GITLAB_WEBHOOK_SECRET',
      'SCM_WEBHOOK_SECRET',
    ]);
    expect(senderKeys(objs)).toEqual([]);
  });

  test('secrets.scmWebhookSecret, githubWebhookSecret, gitlabWebhookSecret and alertsWebhookToken fill the same keys', async () => {
    // A fixed Redis password: the chart would generate one per render.
    const legacy = await render({
      ...base,
      set: {
        'redis.auth.password': 'fake-redis-password-0011',
        'secrets.scmWebhookSecret': 'fake-scm-0011',
        'secrets.githubWebhookSecret': 'fake-github-0011',
        'secrets.gitlabWebhookSecret': 'fake-gitlab-0011',
        'secrets.alertsWebhookToken': 'fake-alerts-0011',
      },
    });
    const current = await render({
      ...base,
      set: {
        'redis.auth.password': 'fake-redis-password-0011',
        'secrets.webhookSecrets.scm': 'fake-scm-0011',
        'secrets.webhookSecrets.github': 'fake-github-0011',
        'secrets.webhookSecrets.gitlab': 'fake-gitlab-0011',
        'secrets.webhookSecrets.alerts': 'fake-alerts-0011',
      },
    });
    expect(secretData(legacy)).toMatchObject({
      SCM_WEBHOOK_SECRET: 'fake-scm-0011',
      GITHUB_WEBHOOK_SECRET: 'fake-github-0011',
      GITLAB_WEBHOOK_SECRET: 'fake-gitlab-0011',
      ALERTS_WEBHOOK_TOKEN: 'fake-alerts-0011',
    });
    expect(secretData(legacy)).toEqual(secretData(current));
    // Same Secret, same checksum: moving to the new values does not roll the pods.
    const sum = (o: K8sObject[]) => one(o, 'Deployment', 'opsgate-api').spec.template.metadata.annotations['checksum/secret'];
    expect(sum(legacy)).toBe(sum(current));
  });

  test('both forms with the same value render; with different values the render fails naming both', async () => {
    const same = await render({
      ...base,
      set: { 'secrets.scmWebhookSecret': 'fake-scm-0011', 'secrets.webhookSecrets.scm': 'fake-scm-0011' },
    });
    expect(secretData(same).SCM_WEBHOOK_SECRET).toBe('fake-scm-0011');
    const err = await renderError({
      ...base,
      set: { 'secrets.scmWebhookSecret': 'fake-scm-0011', 'secrets.webhookSecrets.scm': 'fake-other-0011' },
    });
    expect(err).toMatch(/secrets\.webhookSecrets\.scm and secrets\.scmWebhookSecret are both set, to different values/);
    expect(err).not.toMatch(/fake-/);
  });
});

describe('refusals', () => {
  test('a secret for a sender that is not enabled (new or earlier form)', async () => {
    expect(await renderError({ ...base, set: { 'secrets.webhookSecrets.gitea': 'fake-gitea-0011' } })).toMatch(
      /a secret is given for the webhook sender "gitea", which is not enabled: set webhooks\.senders\.gitea\.enabled=true/,
    );
    expect(
      await renderError({
        ...base,
        set: { 'webhooks.senders.github.enabled': 'false', 'secrets.githubWebhookSecret': 'fake-github-0011' },
      }),
    ).toMatch(/webhook sender "github", which is not enabled/);
  });

  test('a sender name that is not a path segment, or an entry without enabled, by the schema', async () => {
    const badNames: Record<string, string>[] = [
      { 'webhooks.senders.Gitea.enabled': 'true' },
      { 'webhooks.senders.git_ea.enabled': 'true' },
    ];
    for (const set of badNames) {
      const err = await renderError({ ...base, set });
      expect(err).toMatch(/values don't meet the specifications of the schema/);
      expect(err).toMatch(/webhooks\/senders/);
    }
    expect(await renderError({ ...base, set: { 'webhooks.senders.gitea.on': 'true' } })).toMatch(/webhooks\/senders\/gitea/);
    expect(await renderError({ ...base, setString: { 'secrets.webhookSecrets.Gitea': 'x' } })).toMatch(/secrets\/webhookSecrets/);
  });

  test("a sender's secret variable cannot be set through extraEnv, whatever the sender", async () => {
    for (const name of ['GITEA_WEBHOOK_SECRET', 'ACME_CI_WEBHOOK_SECRET', 'ALERTS_WEBHOOK_TOKEN']) {
      const err = await renderError({ ...base, set: { 'api.extraEnv[0].name': name, 'api.extraEnv[0].value': 'plain' } });
      expect([name, /extraEnv/.test(err)]).toEqual([name, true]);
    }
  });
});

describe('/webhook/alerts and the Ingress', () => {
  test('routed only with its token; without one the render fails; routeAlertsWebhook=false or alerts not enabled leaves it out', async () => {
    expect(await renderError({ ...base, set: ingressOn })).toMatch(
      /ingress\.enabled would route \/webhook\/alerts to the outside without a token: set secrets\.webhookSecrets\.alerts/,
    );
    const [routed, notRouted, disabled] = await Promise.all([
      render({ ...base, set: { ...ingressOn, 'secrets.webhookSecrets.alerts': 'fake-alerts-token-0011' } }),
      render({ ...base, set: { ...ingressOn, 'ingress.routeAlertsWebhook': 'false' } }),
      render({ ...base, set: { ...ingressOn, 'webhooks.senders.alerts.enabled': 'false' } }),
    ]);
    expect(webhookPaths(routed)).toContain('Exact /webhook/alerts');
    expect(webhookPaths(notRouted).sort()).toEqual(['Exact /webhook/github', 'Exact /webhook/gitlab', 'Exact /webhook/scm']);
    expect(webhookPaths(disabled)).toEqual(webhookPaths(notRouted));
    // Routed or not, an enabled alerts sender still gets its token inside the cluster.
    expect(senderRefs(notRouted).ALERTS_WEBHOOK_TOKEN).toBeDefined();
    expect(senderRefs(disabled).ALERTS_WEBHOOK_TOKEN).toBeUndefined();
  });

  test('a sender that is not enabled is not routed', async () => {
    const objs = await render({
      ...base,
      set: { ...ingressOn, 'ingress.routeAlertsWebhook': 'false', 'webhooks.senders.github.enabled': 'false' },
    });
    expect(webhookPaths(objs).sort()).toEqual(['Exact /webhook/gitlab', 'Exact /webhook/scm']);
    expect(senderRefs(objs).GITHUB_WEBHOOK_SECRET).toBeUndefined();
  });
});

describe('NOTES.txt', () => {
  test('lists each enabled sender with its variable and whether it is set, never a secret', async () => {
    const notes = await renderNotes('defaults-values.yaml', {
      'webhooks.senders.gitea.enabled': 'true',
      'secrets.webhookSecrets.gitea': 'fake-gitea-0011',
      'secrets.webhookSecrets.scm': 'fake-scm-0011',
    });
    expect(notes).toMatch(/POST \/webhook\/gitea {2}GITEA_WEBHOOK_SECRET: set$/m);
    expect(notes).toMatch(/POST \/webhook\/github {2}GITHUB_WEBHOOK_SECRET: not set, every delivery answers 403$/m);
    expect(notes).toMatch(/POST \/webhook\/gitlab {2}GITLAB_WEBHOOK_SECRET: not set, SCM_WEBHOOK_SECRET is used$/m);
    expect(notes).toMatch(/POST \/webhook\/alerts {2}Alertmanager webhook_configs \(no ALERTS_WEBHOOK_TOKEN: open\)/);
    expect(notes).not.toMatch(/bitbucket/);
    expect(notes).not.toMatch(/fake-/);
    expect(notes).toMatch(/WARNING: secrets\.webhookSecrets\.alerts \(ALERTS_WEBHOOK_TOKEN\) is empty/);
  });

  test('warns that /webhook/alerts is open when the alerts sender is not enabled', async () => {
    const notes = await renderNotes('existing-secret-values.yaml', { 'webhooks.senders.alerts.enabled': 'false' });
    expect(notes).toMatch(/WARNING: webhooks\.senders\.alerts is not enabled, so no ALERTS_WEBHOOK_TOKEN reaches the API/);
    expect(notes).toMatch(/POST \/webhook\/scm {2}SCM_WEBHOOK_SECRET: key SCM_WEBHOOK_SECRET of the Secret "opsgate-credentials"/);
  });
});
