import { describe, expect, test } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml } from 'yaml';
import { docBlocks, docBlocksOf, docFiles, markerProblem, where } from '../../helpers/docBlocks.js';
import { SOURCES, SOURCE_SECRET_ENVS, SOURCE_SECRET_FILE_ENVS } from '../../../src/sources/index.js';
import { API_VARIABLES } from '../../../src/api/config.js';
import { WORKER_VARIABLES } from '../../../src/shared/config.js';
import { ERROR_CODES, ERROR_CODE_LIST } from '../../../src/shared/errors.js';
import { CHART_TABLE_BEGIN, CHART_TABLE_END, TABLE_BEGIN, TABLE_END, chartSendersTable, sendersTable } from '../../../src/sources/table.js';

/**
 * The documentation cannot drift from the code: every shell block says how it is tested (or why
 * not), the variable tables of docs/configuration.md list exactly what the config schema and `make dev` read,
 * the monitoring README lists exactly the metrics and alerts that exist, and no document points
 * outside this repository or to an issue number.
 */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
const read = (f: string) => readFileSync(join(ROOT, f), 'utf8');

/** Backticked names in the first column of the Markdown table that follows `heading` (a line prefix). */
function tableNames(md: string, heading: string, pattern: RegExp, nth = 0): string[] {
  const start = md.indexOf(heading);
  expect(start).toBeGreaterThanOrEqual(0);
  const lines = md.slice(start).split('\n');
  const tables: string[][] = [];
  let current: string[] | undefined;
  for (const line of lines.slice(1)) {
    if (/^#{1,3} /.test(line)) break;
    if (line.startsWith('|')) {
      if (!current) tables.push((current = []));
      current.push(line);
    } else current = undefined;
  }
  const table = tables[nth];
  expect(table).toBeDefined();
  const names = new Set<string>();
  for (const row of table!.slice(2)) {
    const first = row.split('|')[1] ?? '';
    for (const m of first.matchAll(/`([^`]+)`/g)) if (pattern.test(m[1]!)) names.add(m[1]!);
  }
  return [...names].sort();
}

describe('shell blocks in the documentation', () => {
  const files = docFiles(ROOT);

  test('cover the READMEs, the setup guides and the pages under docs/', () => {
    expect(files).toEqual(
      expect.arrayContaining([
        'README.md',
        'charts/opsgate/README.md',
        'k8s/README.md',
        'worker/README.md',
        'monitoring/README.md',
        'k8s/examples/gitlab-webhook.md',
        'docs/configuration.md',
        'docs/senders.md',
      ]),
    );
  });

  test('each carries exactly one known marker', () => {
    const problems = files
      .flatMap((f) => docBlocks(join(ROOT, f)).map((b) => ({ ...b, file: f })))
      .flatMap((b) => {
        const p = markerProblem(b);
        return p ? [`${where(b)}: ${p}`] : [];
      });
    expect(problems).toEqual([]);
  });

  test('a block without a marker, with an unknown one or with two is reported', () => {
    const md = [
      '```sh\necho none\n```',
      '<!-- doc-test: cluster -->\n```bash\necho unknown\n```',
      '<!-- doc-test: dev -->\n<!-- illustration: why -->\n```console\n$ echo two\n```',
      '<!-- doc-test: helm install-everywhere -->\n```shell\nhelm version\n```',
      '<!-- illustration: -->\n```sh\necho no reason\n```',
      '<!-- doc-test: dev -->\n```sh\necho fine\n```',
      '```yaml\nnot: shell\n```',
    ].join('\n\n');
    const blocks = docBlocksOf('x.md', md);
    expect(blocks.map((b) => b.lang)).toEqual(['sh', 'bash', 'console', 'shell', 'sh', 'sh']);
    expect(blocks.map((b) => markerProblem(b) === undefined)).toEqual([false, false, false, false, false, true]);
    expect(blocks.map((b) => b.line)).toEqual([1, 6, 12, 17, 22, 27]);
  });
});

describe('the tables the code renders or reads', () => {
  const configuration = read('docs/configuration.md');
  const senders = read('docs/senders.md');
  const api = read('docs/api.md');

  test("the processes' table lists exactly the variables their configuration reads (src/shared/config.ts, src/api/config.ts)", () => {
    const config = read('src/shared/config.ts') + read('src/api/config.ts');
    const schemaKeys = [...config.matchAll(/^\s+([A-Z][A-Z0-9_]+): /gm)].map((m) => m[1]!);
    const direct = [...config.matchAll(/\benv\.([A-Z][A-Z0-9_]+)/g)].map((m) => m[1]!);
    // The schemas' keys as the processes see them too: variables the text does not spell (the senders' _FILE ones).
    const vars = [...new Set([...schemaKeys, ...direct, ...API_VARIABLES, ...WORKER_VARIABLES])].sort();
    expect(vars).toEqual(
      expect.arrayContaining(['REDIS_URL', 'OPS_API_KEY_ROLES', 'LOG_LEVEL', 'OPSGATE_VERSION', 'SECRETS_RELOAD_INTERVAL_MS']),
    );
    expect(vars).toEqual(expect.arrayContaining([...SOURCE_SECRET_FILE_ENVS]));
    // The senders' secrets and their files are listed in the table of webhook senders (below), one row per sender.
    const senderVars = [...SOURCE_SECRET_ENVS, ...SOURCE_SECRET_FILE_ENVS];
    expect(tableNames(configuration, '## Configuration', /^[A-Z][A-Z0-9_]+$/)).toEqual(vars.filter((v) => !senderVars.includes(v)));
  });

  test('the table of webhook senders is the one the registry renders (make docs-senders), naming every secret variable', () => {
    const start = senders.indexOf(TABLE_BEGIN);
    const end = senders.indexOf(TABLE_END);
    expect(start).toBeGreaterThan(0);
    expect(senders.slice(start, end + TABLE_END.length)).toBe(sendersTable(SOURCES));
    for (const env of [...SOURCE_SECRET_ENVS, ...SOURCE_SECRET_FILE_ENVS]) expect(sendersTable(SOURCES)).toContain(`\`${env}\``);
  });

  test("the chart README's table of senders is the one the registry renders (make docs-senders)", () => {
    const md = read('charts/opsgate/README.md');
    const start = md.indexOf(CHART_TABLE_BEGIN);
    const end = md.indexOf(CHART_TABLE_END);
    expect(start).toBeGreaterThan(0);
    expect(md.slice(start, end + CHART_TABLE_END.length)).toBe(chartSendersTable(SOURCES));
    for (const s of SOURCES) expect(chartSendersTable(SOURCES)).toContain(`\`webhooks.senders.${s.name}.enabled\``);
  });

  test('the table of error codes is the catalog of src/shared/errors.ts: every code, its status and meaning, in its order', () => {
    const begin = '<!-- errors:begin (src/shared/errors.ts) -->\n';
    const start = api.indexOf(begin);
    const end = api.indexOf('<!-- errors:end -->');
    expect(start).toBeGreaterThan(0);
    const rows = ERROR_CODE_LIST.map((c) => `| \`${c}\` | ${ERROR_CODES[c].status} | ${ERROR_CODES[c].meaning} |`);
    expect(api.slice(start + begin.length, end)).toBe(['| Code | Status | Meaning |', '|---|---|---|', ...rows, ''].join('\n'));
  });

  test('the make dev table lists exactly the variables hack/dev.sh reads', () => {
    const dev = read('hack/dev.sh');
    const vars = [...new Set([...dev.matchAll(/\$\{([A-Z][A-Z0-9_]+):-/g)].map((m) => m[1]!))].sort();
    expect(vars).toEqual(expect.arrayContaining(['PORT', 'REDIS_PORT', 'DEV_DIR']));
    expect(tableNames(configuration, '## Configuration', /^[A-Z][A-Z0-9_]+$/, 1)).toEqual(vars);
  });
});

describe('monitoring/README.md', () => {
  const md = read('monitoring/README.md');

  test('lists exactly the opsgate_* metrics of src/shared/metrics.ts', () => {
    const defined = [...new Set([...read('src/shared/metrics.ts').matchAll(/'(opsgate_[a-z0-9_]+)'/g)].map((m) => m[1]!))].sort();
    expect(defined.length).toBeGreaterThan(10);
    expect(tableNames(md, '## Metrics', /^opsgate_/)).toEqual(defined);
  });

  test('lists exactly the alerts of charts/opsgate/files/prometheus-rules.yaml', () => {
    const rules = parseYaml(read('charts/opsgate/files/prometheus-rules.yaml')) as { groups: { rules: { alert?: string }[] }[] };
    const alerts = rules.groups.flatMap((g) => g.rules.flatMap((r) => (r.alert ? [r.alert] : []))).sort();
    const start = md.indexOf('## Alerts');
    const rows = md
      .slice(start)
      .split('\n')
      .filter((l) => /^\| Opsgate\w+ \|/.test(l));
    expect(rows.map((l) => l.split('|')[1]!.trim()).sort()).toEqual(alerts);
  });

  test("names the worker's /livez", () => {
    expect(md).toMatch(/\/livez/);
  });
});

describe('CHANGELOG.md and LICENSE', () => {
  test('the newest release names the chart version and the app version of Chart.yaml and package.json', () => {
    const md = read('CHANGELOG.md');
    expect(md).toMatch(/^## \[Unreleased\]$/m);
    const chart = parseYaml(read('charts/opsgate/Chart.yaml')) as { version: string; appVersion: string };
    const pkg = JSON.parse(read('package.json')) as { version: string; license: string };
    expect(chart.appVersion).toBe(pkg.version);
    const release = /^## \[(\d+\.\d+\.\d+)\][^\n]*\n+([^\n]+)/m.exec(md);
    expect(release?.[1]).toBe(pkg.version);
    expect(release?.[2]).toBe(`Chart version ${chart.version}, app version ${chart.appVersion}.`);
  });

  test('LICENSE is the Apache License 2.0 that package.json names', () => {
    expect(JSON.parse(read('package.json')).license).toBe('Apache-2.0');
    const text = read('LICENSE');
    expect(text).toMatch(/Apache License\s+Version 2\.0, January 2004/);
    expect(text).toMatch(/END OF TERMS AND CONDITIONS/);
    expect(text.length).toBeGreaterThan(10_000);
  });
});

describe('the documents stay inside the repository', () => {
  const tracked = execFileSync(
    'git',
    [
      'ls-files',
      '-co',
      '--exclude-standard',
      '*.md',
      'charts/opsgate/templates/NOTES.txt',
      'charts/opsgate/values.yaml',
      'k8s/examples/*.yaml',
    ],
    { cwd: ROOT, encoding: 'utf8' },
  )
    .split('\n')
    .filter((f) => f && !f.startsWith('node_modules/') && existsSync(join(ROOT, f)));

  test('there are documents to check', () => {
    expect(tracked).toEqual(expect.arrayContaining(['README.md', 'CHANGELOG.md', 'charts/opsgate/README.md', 'monitoring/README.md']));
  });

  test('no path or link leads outside it, and every relative link resolves', () => {
    const problems: string[] = [];
    for (const f of tracked) {
      const text = read(f);
      text.split('\n').forEach((line, i) => {
        const at = `${f}:${i + 1}`;
        if (/(^|[\s`'"(])\/work\//.test(line)) problems.push(`${at}: a path of a workspace, not of the repository`);
        for (const m of line.matchAll(/`(\.\.\/[^`\s]+)`/g)) {
          if (relative(ROOT, resolve(dirname(join(ROOT, f)), m[1]!)).startsWith('..'))
            problems.push(`${at}: ${m[1]} is outside the repository`);
        }
        for (const m of line.matchAll(/\]\(([^)#\s]+)(#[^)]*)?\)/g)) {
          const target = m[1]!;
          if (/^[a-z]+:/.test(target)) continue; // an absolute URL
          const abs = resolve(dirname(join(ROOT, f)), target);
          if (relative(ROOT, abs).startsWith('..')) problems.push(`${at}: link ${target} is outside the repository`);
          else if (!existsSync(abs)) problems.push(`${at}: link ${target} does not exist`);
        }
      });
    }
    expect(problems).toEqual([]);
  });

  test('no issue numbers, no spec sections, no shared/ of a workspace', () => {
    const problems: string[] = [];
    for (const f of tracked) {
      read(f)
        .split('\n')
        .forEach((line, i) => {
          for (const re of [/\bissues? #?\d+/i, /\bspec(ification)? section \d/i, /(^|[^\w/])#\d{1,5}\b(?!-)/, /\.\.\/shared\b/]) {
            const m = re.exec(line);
            if (m) problems.push(`${f}:${i + 1}: "${m[0].trim()}"`);
          }
        });
    }
    expect(problems).toEqual([]);
  });
});
