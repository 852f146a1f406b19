import { describe, expect, it } from '@jest/globals';
import { run } from '../../helpers/cluster.js';

/**
 * test/helpers/cluster.ts run(): the tests' way of calling a tool. A tool that exits before it reads
 * its input is judged by its exit code and output, never by the EPIPE our write of that input meets.
 */
describe('run()', () => {
  it('returns the exit code of a child that closes its stdin and exits, fed 1 MiB of input', async () => {
    // exec 0<&- closes stdin before anything is read; the write of 1 MiB then meets a closed pipe.
    const r = await run('sh', ['-c', 'exec 0<&-; echo gone >&2; exit 3'], { input: 'x'.repeat(1 << 20) });
    expect(r).toEqual({ code: 3, stdout: '', stderr: 'gone\n' });
  });

  it('hands the input to a child that reads it', async () => {
    const input = 'y'.repeat(1 << 20);
    const r = await run('sh', ['-c', 'wc -c'], { input });
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(String(input.length));
  });

  it('gives a child without input an empty stdin', async () => {
    const r = await run('sh', ['-c', 'cat; echo done'], {});
    expect(r).toEqual({ code: 0, stdout: 'done\n', stderr: '' });
  });

  it('rejects when the tool cannot be started', async () => {
    await expect(run('/nonexistent/opsgate-tool', [])).rejects.toThrow(/ENOENT/);
  });
});
