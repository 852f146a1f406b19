/** The processor's own failures of an attempt (worker/processor.ts). */
export class JobTimeoutError extends Error {
  constructor(seconds: number) {
    super(`timed out after ${seconds}s`);
    this.name = 'JobTimeoutError';
  }
}

export class JobCancelledError extends Error {
  constructor(reason: string) {
    super(reason);
    this.name = 'JobCancelledError';
  }
}
