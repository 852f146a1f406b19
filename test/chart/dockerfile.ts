/**
 * A small Dockerfile reader (the subset opsgate's Dockerfile uses: ARG, FROM ... AS, WORKDIR, ENV,
 * COPY [--from] [--chown], RUN, USER, EXPOSE, CMD, ENTRYPOINT) and a .dockerignore matcher with
 * Docker's semantics (last matching pattern wins, `!` re-includes, a pattern matching a parent
 * directory matches everything below it). There is no container engine on this machine, so
 * test/chart/dockerfile.test.ts uses these to replay the build stage for real in a temp dir.
 */
export interface Instruction {
  keyword: string;
  /** Raw text after the keyword. */
  args: string;
  /** Parsed JSON array for exec-form RUN/CMD/ENTRYPOINT, else undefined. */
  exec?: string[];
  flags: Record<string, string>;
  line: number;
}

export interface Stage {
  index: number;
  name?: string;
  /** FROM image with global ARGs substituted. */
  base: string;
  instructions: Instruction[];
}

export interface Dockerfile {
  globalArgs: Record<string, string>;
  stages: Stage[];
}

function substitute(text: string, vars: Record<string, string>): string {
  return text.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (_m, a: string | undefined, b: string | undefined) => vars[(a ?? b)!] ?? '');
}

export function parseDockerfile(text: string): Dockerfile {
  // Join continuation lines, drop comments and blank lines, keep the starting line number.
  const logical: { text: string; line: number }[] = [];
  let buf = '';
  let start = 0;
  text.split('\n').forEach((raw, i) => {
    const trimmed = raw.trim();
    if (buf === '' && (trimmed === '' || trimmed.startsWith('#'))) return;
    if (buf !== '' && trimmed.startsWith('#')) return; // comment lines inside a continuation
    if (buf === '') start = i + 1;
    if (trimmed.endsWith('\\')) {
      buf += trimmed.slice(0, -1) + ' ';
      return;
    }
    buf += trimmed;
    logical.push({ text: buf, line: start });
    buf = '';
  });
  if (buf) throw new Error('Dockerfile ends inside a line continuation');

  const globalArgs: Record<string, string> = {};
  const stages: Stage[] = [];
  for (const { text: l, line } of logical) {
    const m = /^([A-Za-z]+)\s+([\s\S]*)$/.exec(l);
    if (!m) throw new Error(`Dockerfile line ${line}: cannot parse "${l}"`);
    const keyword = m[1]!.toUpperCase();
    let args = m[2]!.trim();
    const flags: Record<string, string> = {};
    while (/^--[a-z-]+(=\S+)?\s/.test(args)) {
      const fm = /^--([a-z-]+)(?:=(\S+))?\s+/.exec(args)!;
      flags[fm[1]!] = fm[2] ?? 'true';
      args = args.slice(fm[0].length);
    }
    let exec: string[] | undefined;
    if (['RUN', 'CMD', 'ENTRYPOINT', 'COPY', 'ADD'].includes(keyword) && args.startsWith('[')) {
      exec = JSON.parse(args) as string[];
    }
    const ins: Instruction = { keyword, args, exec, flags, line };
    if (keyword === 'ARG' && stages.length === 0) {
      const [k, ...v] = args.split('=');
      globalArgs[k!.trim()] = v.join('=').trim();
      continue;
    }
    if (keyword === 'FROM') {
      const fm = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args);
      if (!fm) throw new Error(`Dockerfile line ${line}: bad FROM "${args}"`);
      stages.push({ index: stages.length, base: substitute(fm[1]!, globalArgs), name: fm[2], instructions: [] });
      continue;
    }
    if (stages.length === 0) throw new Error(`Dockerfile line ${line}: ${keyword} before FROM`);
    stages[stages.length - 1]!.instructions.push(ins);
  }
  return { globalArgs, stages };
}

export function stageByName(df: Dockerfile, name: string): Stage | undefined {
  return df.stages.find((s) => s.name === name) ?? (/^\d+$/.test(name) ? df.stages[Number(name)] : undefined);
}

/** The stage and the stages it is built FROM (nearest first), ending at an external image. */
export function stageChain(df: Dockerfile, stage: Stage): Stage[] {
  const chain: Stage[] = [stage];
  let cur = stage;
  for (;;) {
    const parent = df.stages.find((s) => s.name === cur.base && s.index < cur.index);
    if (!parent) return chain;
    chain.push(parent);
    cur = parent;
  }
}

/** COPY sources and destination (shell form: whitespace-separated, last is the destination). */
export function copyParts(ins: Instruction): { sources: string[]; dest: string } {
  const parts = ins.exec ?? ins.args.split(/\s+/);
  return { sources: parts.slice(0, -1), dest: parts[parts.length - 1]! };
}

/** ENV key=value pairs (the form this Dockerfile uses). */
export function envPairs(ins: Instruction): Record<string, string> {
  const out: Record<string, string> = {};
  for (const m of ins.args.matchAll(/([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)/g)) out[m[1]!] = m[2]!.replace(/^"|"$/g, '');
  return out;
}

export function posixJoin(base: string, p: string): string {
  const parts = (p.startsWith('/') ? p : `${base}/${p}`).split('/');
  const out: string[] = [];
  for (const x of parts) {
    if (x === '' || x === '.') continue;
    if (x === '..') out.pop();
    else out.push(x);
  }
  return `/${out.join('/')}`;
}

function globToRegExp(pattern: string): RegExp {
  let re = '';
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === '*') {
      if (pattern[i + 1] === '*') {
        re += '.*';
        i++;
        if (pattern[i + 1] === '/') i++; // "**/" also matches zero directories
      } else re += '[^/]*';
    } else if (c === '?') re += '[^/]';
    else re += c.replace(/[.+^${}()|[\]\\]/g, '\\$&');
  }
  return new RegExp(`^${re}$`);
}

export interface IgnoreRule {
  negate: boolean;
  re: RegExp;
  depth: number;
}

export function parseDockerignore(text: string): IgnoreRule[] {
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((l) => {
      const negate = l.startsWith('!');
      const p = posixJoin('/', negate ? l.slice(1).trim() : l).slice(1);
      return { negate, re: globToRegExp(p), depth: p.split('/').length };
    });
}

/** Docker's rule: the last pattern that matches the path (or one of its parent dirs) decides. */
export function isIgnored(rules: IgnoreRule[], relPath: string): boolean {
  const parts = relPath.split('/');
  let ignored = false;
  for (const r of rules) {
    let match = r.re.test(relPath);
    if (!match && parts.length > r.depth) match = r.re.test(parts.slice(0, r.depth).join('/'));
    if (match) ignored = !r.negate;
  }
  return ignored;
}
