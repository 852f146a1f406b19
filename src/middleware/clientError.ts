import type { Server } from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { errorBody, type ErrorCode } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import { lingeringClose } from './lingeringClose.js';

/** A whole HTTP answer with the API's JSON {detail, code} body, on a connection that closes after it. */
function answer(status: number, code: ErrorCode, detail: string): string {
  const body = JSON.stringify(errorBody(code, detail));
  const head = `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json; charset=utf-8\r\n`;
  return `${head}Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

/**
 * Requests that Node's HTTP parser refuses never reach Express (headers over 16 KiB, control characters in a header, a header
 * timeout), and Node answers them with a bare status line (CONNECT with nothing). These get the same status with the usual JSON
 * body, never echoing the request (nothing a client sent, secret or not, comes back), then a lingering close.
 */
export function jsonClientErrors(server: Server, logger?: Logger): void {
  // CONNECT never reaches Express either (without a listener Node just drops the socket).
  server.on('connect', (_req: unknown, socket: Duplex) => {
    socket.on('error', () => socket.destroy());
    socket.end(answer(405, 'method_not_allowed', 'method not allowed'));
  });
  // Node's parser reports an error again for every later chunk of a refused request: only the first answers.
  const answered = new WeakSet<Duplex>();
  server.on('clientError', (err: Error & { code?: string }, socket: Duplex) => {
    if (answered.has(socket)) return;
    // As Node's default handler: answer only if nothing was written yet (a second response would corrupt the stream).
    if (err.code === 'ECONNRESET' || !socket.writable || (socket as Duplex & { bytesWritten?: number }).bytesWritten) {
      socket.destroy();
      return;
    }
    let status = 400;
    let code: ErrorCode = 'malformed_request';
    let detail = 'malformed HTTP request';
    if (err.code === 'HPE_HEADER_OVERFLOW') {
      status = 431;
      code = 'headers_too_large';
      detail = 'request headers are too large';
    } else if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT' || err.code === 'HPE_TIMEOUT') {
      status = 408;
      code = 'request_timeout';
      detail = 'request timed out';
    } else if (err.code === 'HPE_INVALID_HEADER_TOKEN') {
      detail = 'malformed HTTP request: invalid character in a header';
    }
    logger?.debug('HTTP parser refused a request', { status, code: err.code });
    answered.add(socket);
    socket.on('error', () => socket.destroy());
    socket.write(answer(status, code, detail));
    // The rest of the refused request (its body, say) may still be arriving.
    lingeringClose(socket);
  });
}
