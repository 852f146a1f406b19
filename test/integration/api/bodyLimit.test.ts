import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { startApi, type OpsProcess } from '../../helpers/processes.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { apiEnv, makeSecrets } from '../../helpers/reliability.js';

/**
 * An over-limit body is answered 413 at once and its connection closed, on the real API process
 * (BODY_LIMIT 256kb) over raw TCP:
 * - a declared Content-Length of 5 GB with 2 bytes sent: 413 within seconds (not a 408 when the
 *   request times out), then the server closes the connection;
 * - a chunked body the client keeps writing (up to 256 MB): 413 once the limit is passed, and the
 *   server closes the connection while the client is still writing, having read a small part;
 * - a client that reads its answer only after it has sent a 4 MB body still gets the answer (413,
 *   or 400 for a request line Node's parser refuses): the server's close lingers, so no TCP reset
 *   discards the answer before the client reads it.
 */
const secrets = makeSecrets('bodylimit');
const LIMIT = 256 * 1024;
const HEAD = (extra: string) => `POST /webhook/alerts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n${extra}\r\n`;

let redis: RedisServer;
let api: OpsProcess & { baseUrl: string };
let port = 0;

beforeAll(async () => {
  redis = await startRedis();
  const env = await apiEnv(redis.url, secrets, { BODY_LIMIT: '256kb' });
  api = await startApi({ env });
  port = Number(env.PORT);
}, 60_000);

afterAll(async () => {
  await api?.stop();
  await redis?.destroy();
});

interface Exchange {
  socket: Socket;
  answer: Promise<{ text: string; closedAfterMs: number }>;
  startedAt: number;
}

function open(head: string): Promise<Exchange> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    const startedAt = Date.now();
    let text = '';
    const answer = new Promise<{ text: string; closedAfterMs: number }>((done) => {
      socket.on('data', (c: Buffer) => (text += c.toString('latin1')));
      socket.on('error', () => undefined); // a reset while writing is one way the server closes
      socket.on('close', () => done({ text, closedAfterMs: Date.now() - startedAt }));
    });
    socket.once('connect', () => {
      socket.write(head);
      resolve({ socket, answer, startedAt });
    });
    socket.once('error', reject);
  });
}

describe('BODY_LIMIT is enforced before the body is read', () => {
  test('Content-Length 5 GB with 2 bytes sent: 413 {detail} at once, and the server closes the connection', async () => {
    const ex = await open(HEAD('Content-Length: 5000000000\r\n'));
    ex.socket.write('{}');
    const deadline = setTimeout(() => ex.socket.destroy(), 10_000);
    const { text, closedAfterMs } = await ex.answer;
    clearTimeout(deadline);
    expect(text).toMatch(/^HTTP\/1\.1 413 /);
    expect(text).toMatch(/\r\nconnection: close\r\n/i);
    expect(text).toMatch(/"detail":"request body is larger than the limit of 256kb"/);
    // closed by the server well before the client's 10 s deadline (and far from the 47 s request timeout)
    expect(closedAfterMs).toBeLessThan(5_000);
  });

  test('a chunked body over the limit: 413, and the connection is closed while the client still writes', async () => {
    const ex = await open(HEAD('Transfer-Encoding: chunked\r\n'));
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    const frame = Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')]);
    const total = 256 * 1024 * 1024;
    let written = 0;
    let closed = false;
    ex.socket.on('close', () => (closed = true));
    const writer = (async () => {
      while (!closed && written < total) {
        const more = ex.socket.write(frame);
        written += chunk.length;
        if (!more)
          await new Promise<void>((r) => (closed ? r() : (ex.socket.once('drain', () => r()), ex.socket.once('close', () => r()))));
      }
      if (!closed) ex.socket.end('0\r\n\r\n');
    })();
    const deadline = setTimeout(() => ex.socket.destroy(), 30_000);
    const { text } = await ex.answer;
    clearTimeout(deadline);
    await writer;
    expect(text).toMatch(/^HTTP\/1\.1 413 /);
    expect(text).toMatch(/\r\nconnection: close\r\n/i);
    // the client was stopped by the server's close long before it had sent the whole body
    expect(written).toBeGreaterThan(LIMIT);
    expect(written).toBeLessThan(total / 4);
  });

  test('a chunked body under the limit is read whole and answered as usual (202)', async () => {
    const ex = await open(HEAD('Transfer-Encoding: chunked\r\nConnection: close\r\n'));
    const body = JSON.stringify({
      alerts: [{ status: 'resolved', labels: { alertname: 'X' }, annotations: { pad: 'p'.repeat(100_000) } }],
    });
    const half = Math.floor(body.length / 2);
    for (const part of [body.slice(0, half), body.slice(half)]) ex.socket.write(`${Buffer.byteLength(part).toString(16)}\r\n${part}\r\n`);
    ex.socket.end('0\r\n\r\n');
    const { text } = await ex.answer;
    expect(text).toMatch(/^HTTP\/1\.1 202 /);
    expect(text).toMatch(/"received":1/);
  });

  /** Sends `head` and a body of `bodyLength` bytes without reading, then reads what came once `readAfterMs` passed. */
  function lateReader(head: string, bodyLength: number, readAfterMs: number): Promise<string> {
    return new Promise((resolve) => {
      const socket = connect(port, '127.0.0.1');
      let text = '';
      let error = '';
      socket.pause();
      socket.on('error', (e) => (error = e.message));
      socket.once('connect', () => {
        socket.write(`${head}Content-Length: ${bodyLength}\r\n\r\n`);
        socket.write(Buffer.alloc(bodyLength, 0x61), () => undefined);
        setTimeout(() => {
          socket.on('data', (c: Buffer) => (text += c.toString('latin1')));
          socket.resume();
        }, readAfterMs);
      });
      socket.on('close', () => resolve(text || `nothing read (${error || 'closed'})`));
    });
  }

  test('a client that reads late still gets the 413 of a 4 MB body', async () => {
    expect(
      await lateReader('POST /webhook/alerts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n', 4 * 1024 * 1024, 1000),
    ).toMatch(/^HTTP\/1\.1 413 /);
  });

  test('a client that reads late still gets the 400 of a refused request line with a 4 MB body', async () => {
    expect(await lateReader('get /version HTTP/1.1\r\nHost: 127.0.0.1\r\n', 4 * 1024 * 1024, 1000)).toMatch(/^HTTP\/1\.1 400 /);
  });
});
