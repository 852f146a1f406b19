import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * Extracts the shell blocks of a Markdown file with the marker that says how the tests treat each one.
 *
 * A shell block (```sh, ```bash, ```shell, ```console) is preceded by exactly one HTML comment,
 * blank lines allowed in between:
 *   <!-- doc-test: dev [label] -->              run against a running API + worker + Redis (make dev)
 *   <!-- doc-test: helm -->                     run with real helm, offline
 *   <!-- doc-test: helm install-as-template --> `helm install` run as `helm template`, same arguments,
 *                                               and installed as written on the real node by the e2e suite
 *   <!-- doc-test: helm template-only -->       `helm install` run as `helm template` only: it renders a
 *                                               resource whose operator the test node does not run (cert-manager)
 *   <!-- doc-test: node [label] -->             run on the real node by the e2e suite
 *   <!-- illustration: <short reason> -->       not run
 *
 * `marker` is the kind (`dev`, `helm`, `node`, `illustration`) and `arg` the rest of the comment.
 * A block without a marker has marker `''`; a block preceded by more than one comment has marker
 * `'multiple'`; any other comment text is returned as the marker so a test can name it.
 * Use `markerProblem()` to decide whether a block's marker is acceptable.
 */
export interface DocBlock {
  /** The path as given. */
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  marker: string;
  arg?: string;
  lang: string;
  /** The block's lines, fence indentation removed, joined with '\n' (no trailing newline). */
  code: string;
}

export const SHELL_LANGS = ['sh', 'bash', 'shell', 'console'] as const;
export const MARKERS = ['dev', 'helm', 'node', 'illustration'] as const;
/**
 * The arguments a doc-test marker accepts: `helm` only `install-as-template` or `template-only`; `dev` and `node` a
 * label (letters, digits, dashes) a test may use to check that block's answers; illustrations free text.
 */
export const MARKER_ARGS: Record<string, RegExp> = {
  dev: /^[\w-]+$/,
  helm: /^(install-as-template|template-only)$/,
  node: /^[\w-]+$/,
};

const FENCE = /^(\s*)(`{3,}|~{3,})\s*([\w+-]*)[^`]*$/;
const COMMENT = /^\s*<!--\s*([\s\S]*?)\s*-->\s*$/;

function parseMarker(comment: string): { marker: string; arg?: string } {
  const test = /^doc-test:\s*(\S+)(?:\s+(.*))?$/.exec(comment);
  if (test) return test[2] ? { marker: test[1]!, arg: test[2].trim() } : { marker: test[1]! };
  const illustration = /^illustration:\s*(.*)$/.exec(comment);
  if (illustration) return { marker: 'illustration', arg: illustration[1]!.trim() };
  return { marker: comment };
}

/**
 * Parses Markdown text; `file` only labels the blocks. `langs` names the fenced blocks returned
 * (default the shell ones, whose markers every document must carry); a test that applies a
 * manifest the docs show asks for `['yaml']` and finds its block by its marker.
 */
export function docBlocksOf(file: string, text: string, langs: readonly string[] = SHELL_LANGS): DocBlock[] {
  const lines = text.split(/\r?\n/);
  const blocks: DocBlock[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = FENCE.exec(lines[i]!);
    if (!open) continue;
    const [, indent = '', fence = '', lang = ''] = open;
    let end = i + 1;
    const closing = new RegExp(`^\\s*${fence[0] === '`' ? '`' : '~'}{${fence.length},}\\s*$`);
    while (end < lines.length && !closing.test(lines[end]!)) end++;
    if (langs.includes(lang.toLowerCase())) {
      const comments: string[] = [];
      for (let j = i - 1; j >= 0; j--) {
        const above = lines[j]!;
        if (above.trim() === '') continue;
        const comment = COMMENT.exec(above);
        if (!comment) break;
        comments.unshift(comment[1]!);
      }
      const relevant = comments.filter((c) => /^(doc-test|illustration)\s*:/.test(c));
      const parsed =
        comments.length === 0
          ? { marker: '' }
          : relevant.length > 1
            ? { marker: 'multiple', arg: relevant.join(' | ') }
            : parseMarker(relevant[0] ?? comments[comments.length - 1]!);
      const code = lines
        .slice(i + 1, end)
        .map((l) => (l.startsWith(indent) ? l.slice(indent.length) : l.trimStart()))
        .join('\n');
      blocks.push({ file, line: i + 1, ...parsed, lang: lang.toLowerCase(), code });
    }
    i = end;
  }
  return blocks;
}

/** The shell blocks of a Markdown file (or those of `langs`). */
export function docBlocks(file: string, langs?: readonly string[]): DocBlock[] {
  return docBlocksOf(file, readFileSync(file, 'utf8'), langs);
}

/** Why a block's marker is not acceptable, or undefined when it is. */
export function markerProblem(block: DocBlock): string | undefined {
  if (block.marker === '') return 'no marker (<!-- doc-test: dev|helm|node --> or <!-- illustration: reason -->)';
  if (block.marker === 'multiple') return `more than one marker: ${block.arg ?? ''}`;
  if (!(MARKERS as readonly string[]).includes(block.marker)) return `unknown marker "${block.marker}"`;
  if (block.marker === 'illustration') return block.arg ? undefined : 'an illustration needs a reason';
  if (block.arg !== undefined && !MARKER_ARGS[block.marker]!.test(block.arg)) {
    return `unknown argument "${block.arg}" for doc-test: ${block.marker}`;
  }
  return undefined;
}

/**
 * The script a block runs: a ```console block keeps only its `$ ` command lines (and their `\`
 * continuations), other shell blocks run as written.
 */
export function blockScript(block: DocBlock): string {
  if (block.lang !== 'console') return block.code;
  const out: string[] = [];
  let continuing = false;
  for (const line of block.code.split('\n')) {
    if (continuing || /^\$ /.test(line)) {
      out.push(continuing ? line : line.slice(2));
      continuing = /\\$/.test(line);
    }
  }
  return out.join('\n');
}

/**
 * The documentation whose shell blocks must carry a marker, relative to the repository root:
 * the READMEs, the setup guides under k8s/examples/ and the pages under docs/.
 */
export function docFiles(root: string): string[] {
  const mdIn = (dir: string) =>
    readdirSync(join(root, dir))
      .filter((f) => f.endsWith('.md'))
      .sort()
      .map((f) => `${dir}/${f}`);
  return [
    'README.md',
    'charts/opsgate/README.md',
    'k8s/README.md',
    'worker/README.md',
    'monitoring/README.md',
    ...mdIn('k8s/examples'),
    ...mdIn('docs'),
  ];
}

/** Every shell block of the documentation (`docFiles`), each with its path relative to `root`. */
export function allDocBlocks(root: string): DocBlock[] {
  return docFiles(root).flatMap((f) => docBlocks(join(root, f)).map((b) => ({ ...b, file: f })));
}

export interface ShellResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * A documented command as a reader runs it: a clean bash (no rc files, `-euo pipefail`) in `cwd` with
 * only `env`, killed after `timeoutMs`.
 */
export function runCleanBash(script: string, cwd: string, env: Record<string, string>, timeoutMs: number): Promise<ShellResult> {
  return new Promise((res) => {
    const p = spawn('bash', ['--norc', '--noprofile', '-euo', 'pipefail', '-c', script], {
      cwd,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: timeoutMs,
      killSignal: 'SIGKILL',
    });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    p.on('close', (code) => res({ code, stdout, stderr }));
  });
}

/**
 * A temporary directory whose entries link to the repository's top level, so a block's relative paths
 * (`charts/opsgate`, `k8s/examples/...`) resolve and the files it writes stay out of the repository.
 */
export function mirrorRepo(root: string, prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  for (const entry of readdirSync(root)) if (entry !== '.git') symlinkSync(join(root, entry), join(dir, entry));
  return dir;
}

/** `file:line` of a block, for failure messages. */
export function where(block: DocBlock): string {
  return `${block.file}:${block.line}`;
}
