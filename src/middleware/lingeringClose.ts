import type { Duplex } from 'node:stream';

/*
 * Closing a connection whose request was answered before its body was read: a socket closed with
 * bytes unread sends a TCP reset, and a client that has not yet read the answer when the reset
 * arrives loses it (it sees a reset or EPIPE, not the 400 or 413). So the answer is followed by a
 * FIN, what the client still sends is read and dropped, at most LINGER_BYTES and LINGER_MS, and
 * then the socket is destroyed: the lingering close of Apache and nginx. The bounds keep a client
 * from making the server read a large body after all.
 */
const LINGER_MS = 2000;
const LINGER_BYTES = 16 * 1024 * 1024;

/**
 * Ends `socket` after what was written to it and closes it once the client has closed its side or
 * a bound is reached. `data` is where the client's further bytes arrive (the request while Node's
 * HTTP parser still owns the socket, else the socket itself).
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
