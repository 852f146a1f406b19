import type { Server } from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { errorBody, type ErrorCode } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import { lingeringClose } from './lingeringClose.js';

/**
 * Requests that Node's HTTP parser refuses never reach Express: headers over the 16 KiB limit,
 * control characters in a header value, a malformed request line, a header timeout. Node's
 * default answer is a bare status line with no body (and CONNECT gets no answer at all); this
 * one answers the same status with the
 * API's usual JSON {detail, code} body (src/shared/errors.ts; never echoing the request, so nothing a client sent, secret or
 * not, comes back), then closes the connection (lingering: src/middleware/lingeringClose.ts).
 */
export function jsonClientErrors(server: Server, logger?: Logger): void {
  // CONNECT never reaches Express either (without a listener Node just drops the socket).
  server.on('connect', (_req: unknown, socket: Duplex) => {
    const body = JSON.stringify(errorBody('method_not_allowed', 'method not allowed'));
    socket.on('error', () => socket.destroy());
    socket.end(
      'HTTP/1.1 405 Method Not Allowed\r\n' +
        'Content-Type: application/json; charset=utf-8\r\n' +
        `Content-Length: ${Buffer.byteLength(body)}\r\n` +
        'Connection: close\r\n\r\n' +
        body,
    );
  });
  // Node's parser reports an error again for every later chunk of a refused request: the first
  // answers, the rest are the lingering close's to drop.
  const answered = new WeakSet<Duplex>();
  server.on('clientError', (err: Error & { code?: string }, socket: Duplex) => {
    if (answered.has(socket)) return;
    // As Node's default handler: answer only if nothing was written on this connection yet
    // (otherwise a response is already out and a second one would corrupt the stream).
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
    const body = JSON.stringify(errorBody(code, detail));
    answered.add(socket);
    socket.on('error', () => socket.destroy());
    socket.write(
      `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\n` +
        'Content-Type: application/json; charset=utf-8\r\n' +
        `Content-Length: ${Buffer.byteLength(body)}\r\n` +
        'Connection: close\r\n\r\n' +
        body,
    );
    // The rest of the refused request (its body, say) may still be arriving.
    lingeringClose(socket);
  });
}
