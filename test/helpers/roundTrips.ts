import { createConnection, createServer, type Server, type Socket } from 'node:net';

/**
 * A TCP relay in front of a real redis-server that counts Redis round trips as the wire shows
 * them. It parses RESP in both directions (commands sent, replies received) per connection: a
 * round trip starts when the client sends a command while none of its commands is waiting for a
 * reply. Pipelined commands are one round trip however TCP splits them; a command sent after
 * waiting for a reply is a new one. Summed over every connection of the process under test, the
 * increase across one request is the number of round trips it cost. Nothing about ioredis or
 * BullMQ is assumed.
 */
export interface RoundTripCounter {
  url: string;
  /** Round trips counted so far, all connections. */
  turns(): number;
  /** Commands relayed so far, all connections. */
  commands(): number;
  close(): Promise<void>;
}

/**
 * Counts complete RESP values in a byte stream (RESP2 and the RESP3 types Redis may send).
 * Returns the number completed by `chunk`; keeps partial state between chunks.
 */
function respCounter(): { count: (chunk: Buffer) => number; partial: () => boolean } {
  let buf: Buffer = Buffer.alloc(0);
  /** Index after one value starting at `i`, or -1 if incomplete. */
  const skip = (i: number): number => {
    if (i >= buf.length) return -1;
    const type = String.fromCharCode(buf[i]!);
    const eol = buf.indexOf('\r\n', i);
    if (eol < 0) return -1;
    const head = buf.toString('latin1', i + 1, eol);
    let next = eol + 2;
    switch (type) {
      case '+':
      case '-':
      case ':':
      case '_':
      case '#':
      case ',':
      case '(':
        return next;
      case '$':
      case '=':
      case '!': {
        const len = Number(head);
        if (len < 0) return next;
        return next + len + 2 <= buf.length ? next + len + 2 : -1;
      }
      case '*':
      case '~':
      case '>':
      case '%':
      case '|': {
        let n = Number(head);
        if (n < 0) return next;
        if (type === '%' || type === '|') n *= 2;
        for (let k = 0; k < n; k++) {
          next = skip(next);
          if (next < 0) return -1;
        }
        return next;
      }
      default:
        // Inline command (no RESP type byte): one line.
        return next;
    }
  };
  const count = (chunk: Buffer): number => {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    let done = 0;
    let at = 0;
    for (;;) {
      const end = skip(at);
      if (end < 0) break;
      done++;
      at = end;
    }
    buf = buf.subarray(at);
    return done;
  };
  return { count, partial: () => buf.length > 0 };
}

export async function startRoundTripCounter(targetPort: number): Promise<RoundTripCounter> {
  let turns = 0;
  let commands = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = createConnection({ host: '127.0.0.1', port: targetPort });
    sockets.add(client).add(upstream);
    const sentCount = respCounter();
    const replyCount = respCounter();
    let outstanding = 0;
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    client.on('data', (chunk: Buffer) => {
      // A chunk that continues a command begun in an earlier chunk is the rest of one write (the
      // relay reads a large write in pieces, and Redis may have answered every complete command
      // of the first pieces before the next is read): the same round trip. A chunk that begins a
      // command while nothing is awaited begins a round trip, complete or not.
      if (!sentCount.partial() && outstanding === 0) turns++;
      const n = sentCount.count(chunk);
      outstanding += n;
      commands += n;
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      outstanding = Math.max(0, outstanding - replyCount.count(chunk));
      client.write(chunk);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('close', end).on('error', end);
    upstream.on('close', end).on('error', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const addr = server.address();
  if (typeof addr !== 'object' || !addr) throw new Error('no address');
  return {
    url: `redis://127.0.0.1:${addr.port}`,
    turns: () => turns,
    commands: () => commands,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
