import { existsSync } from 'node:fs';
import { join } from 'node:path';

/** The node is started by `make e2e` (hack/node.sh up), which also tears it down whatever happens. */
export default async function globalSetup(): Promise<void> {
  const dir = process.env.OPSGATE_NODE_DIR ?? '/tmp/opsgate-node';
  if (!existsSync(join(dir, 'up'))) {
    throw new Error(`no test node at ${dir}: run the suite with \`make e2e\` (it starts hack/node.sh and stops it afterwards)`);
  }
}
