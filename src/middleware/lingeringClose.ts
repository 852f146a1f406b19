import type { Duplex } from 'node:stream';

const LINGER_MS = 2000;
const LINGER_BYTES = 16 * 1024 * 1024;

/**
 * Ends `socket` after its answer, drops what the client still sends (`data`: the request while Node's parser owns the socket),
 * and destroys it once the client closed its side or a bound is reached: a socket closed with bytes unread sends a TCP reset,
 * and a client that has not yet read the answer loses it. The bounds keep a client from making the server read a large body.
 */
export function lingeringClose(socket: Duplex, data: NodeJS.ReadableStream = socket): void {
  let dropped = 0;
  const destroy = () => {
    clearTimeout(timer);
    socket.destroy();
  };
  const timer = setTimeout(destroy, LINGER_MS);
  timer.unref();
  socket.once('close', () => clearTimeout(timer));
  data.on('data', (chunk: Buffer) => {
    dropped += chunk.length;
    if (dropped > LINGER_BYTES) destroy();
  });
  data.once('end', destroy);
  data.resume();
  socket.end();
}
