/** The processor's own failures of an attempt (worker/processor.ts). */
export class JobTimeoutError extends Error {
  override name = 'JobTimeoutError';
  constructor(seconds: number) {
    super(`timed out after ${seconds}s`);
  }
}

export class JobCancelledError extends Error {
  override name = 'JobCancelledError';
}
