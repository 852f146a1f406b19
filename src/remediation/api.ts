import type { z } from 'zod';
import { outboundCall, OutboundError, type OutboundAuth } from '../shared/outboundAuth.js';

/**
 * Bounded JSON calls to Prometheus's or Alertmanager's API with their credentials
 * (src/shared/outboundAuth.ts): no answer, one that is not 2xx, not JSON, or not the documented
 * shape throws an `Err` naming the call. `absent`: a GET answered 404, or an empty answer, is undefined.
 */
export function jsonApi(
  name: string,
  url: string,
  opts: { timeoutMs?: number; auth?: OutboundAuth },
  Err: new (message: string) => Error,
  absent = false,
) {
  const base = url.replace(/\/+$/, '');
  async function call(method: string, path: string, body?: unknown): Promise<unknown> {
    const where = `${name} ${method} ${path.split('?')[0]}`;
    let res: { status: number; text: string };
    try {
      const text = body === undefined ? undefined : JSON.stringify(body);
      res = await outboundCall(name, base, opts.auth, opts.timeoutMs ?? 3000, method, path, text);
    } catch (err) {
      throw new Err(err instanceof OutboundError ? err.message : `${where}: unreachable`);
    }
    if (absent && res.status === 404 && method === 'GET') return undefined;
    if (res.status < 200 || res.status > 299) throw new Err(`${where} answered ${res.status}: ${res.text.slice(0, 200)}`);
    if (absent && res.text === '') return undefined;
    try {
      return JSON.parse(res.text) as unknown;
    } catch {
      throw new Err(`${where} answered something that is not JSON`);
    }
  }
  function parse<T>(schema: z.ZodType<T>, v: unknown, what: string): T {
    const p = schema.safeParse(v);
    if (!p.success) throw new Err(`${name} answered an unexpected ${what}`);
    return p.data;
  }
  return { call, parse };
}

export type Labels = Readonly<Record<string, string>>;

export const sameLabels = (a: Labels, b: Labels): boolean =>
  Object.keys(a).length === Object.keys(b).length && Object.entries(a).every(([k, v]) => Object.hasOwn(b, k) && b[k] === v);
