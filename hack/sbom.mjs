#!/usr/bin/env node
// CycloneDX SBOM of one opsgate image: npm's own SBOM of the production tree, plus what the image
// itself reports: the Node.js runtime (process.version inside the image) and the Debian packages its
// files come from (/var/lib/dpkg/status.d, written by hack/rootfs.sh).
//
//   node hack/sbom.mjs <image ref> <npm-sbom.json> <out.cdx.json> [digest]
//
// <npm-sbom.json> is `npm sbom --sbom-format cyclonedx` run in the production tree (hack/release.sh
// makes it). The SBOM's subject (metadata.component) is the image: its name, tag, image id and,
// when given, the registry digest it was pushed as.
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';

const [image, npmSbomFile, out, digest] = process.argv.slice(2);
if (!image || !npmSbomFile || !out) {
  console.error('usage: sbom.mjs <image ref> <npm-sbom.json> <out.cdx.json> [sha256:digest]');
  process.exit(2);
}

const podman = (args) => execFileSync('podman', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
const [inspect] = JSON.parse(podman(['image', 'inspect', image]));
// Read inside the image, with the image's own node (it has no shell): what actually ships.
const facts = JSON.parse(
  podman([
    'run',
    '--rm',
    '--network',
    'none',
    '--read-only',
    '--platform',
    `${inspect.Os}/${inspect.Architecture}`,
    '--user',
    '1000:1000',
    '--entrypoint',
    'node',
    image,
    '-e',
    `const fs = require('fs'), d = '/var/lib/dpkg/status.d';
     process.stdout.write(JSON.stringify({
       node: process.versions.node, arch: process.arch,
       osRelease: fs.readFileSync('/etc/os-release', 'utf8'),
       dpkg: fs.readdirSync(d).map((f) => fs.readFileSync(d + '/' + f, 'utf8')),
     }));`,
  ]),
);

const field = (text, name) => new RegExp(`^${name}: (.*)$`, 'm').exec(text)?.[1]?.trim();
const os = Object.fromEntries(
  facts.osRelease
    .split('\n')
    .filter((l) => l.includes('='))
    .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1).replace(/^"|"$/g, '')]),
);
const debs = facts.dpkg.map((text) => {
  const name = field(text, 'Package');
  const version = field(text, 'Version');
  const arch = field(text, 'Architecture');
  const source = field(text, 'Source');
  return {
    'bom-ref': `pkg:deb/${os.ID}/${name}@${version}?arch=${arch}`,
    type: 'library',
    name,
    version,
    purl: `pkg:deb/${os.ID}/${name}@${encodeURIComponent(version)}?arch=${arch}&distro=${os.ID}-${os.VERSION_ID}`,
    ...(source ? { properties: [{ name: 'debian:source', value: source }] } : {}),
  };
});

const npm = JSON.parse(readFileSync(npmSbomFile, 'utf8'));
const app = npm.metadata.component;
const repo = image.replace(/^localhost\//, '').replace(/:[^/:]*$/, '');
const localTag = /:([^/:]+)$/.exec(image)?.[1] ?? 'latest';
// hack/images.sh tags another architecture's image <version>-<arch>; the release's tag is <version>.
const tag = localTag.endsWith(`-${inspect.Architecture}`) ? localTag.slice(0, -inspect.Architecture.length - 1) : localTag;
const name = repo.slice(repo.lastIndexOf('/') + 1);
const subjectRef = `pkg:oci/${name}@${encodeURIComponent(digest ?? inspect.Id.replace(/^(sha256:)?/, 'sha256:'))}?arch=${inspect.Architecture}&tag=${tag}`;
const nodeRef = `pkg:generic/node@${facts.node}`;
const runtime = {
  'bom-ref': nodeRef,
  type: 'platform',
  name: 'node',
  version: facts.node,
  description: 'Node.js runtime (/usr/local/bin/node)',
  purl: nodeRef,
  externalReferences: [{ type: 'distribution', url: `https://nodejs.org/dist/v${facts.node}/` }],
};
const osComponent = {
  'bom-ref': `os:${os.ID}@${os.VERSION_ID}`,
  type: 'operating-system',
  name: os.ID,
  version: os.VERSION_ID,
  description: os.PRETTY_NAME,
};

const bom = {
  $schema: 'http://cyclonedx.org/schema/bom-1.5.schema.json',
  bomFormat: 'CycloneDX',
  specVersion: '1.5',
  serialNumber: `urn:uuid:${randomUUID()}`,
  version: 1,
  metadata: {
    timestamp: new Date().toISOString(),
    lifecycles: [{ phase: 'post-build' }],
    tools: [...(npm.metadata.tools ?? []), { vendor: 'opsgate', name: 'hack/sbom.mjs' }],
    component: {
      'bom-ref': subjectRef,
      type: 'container',
      name,
      version: tag,
      purl: subjectRef,
      properties: [
        { name: 'oci:image:id', value: inspect.Id.replace(/^(sha256:)?/, 'sha256:') },
        ...(digest ? [{ name: 'oci:image:digest', value: digest }] : []),
        { name: 'oci:image:architecture', value: inspect.Architecture },
        { name: 'oci:image:os', value: inspect.Os },
      ],
    },
  },
  components: [{ ...app, type: 'application', name: 'opsgate' }, runtime, osComponent, ...debs, ...npm.components],
  dependencies: [
    { ref: subjectRef, dependsOn: [app['bom-ref'], nodeRef, osComponent['bom-ref'], ...debs.map((d) => d['bom-ref'])] },
    { ref: nodeRef, dependsOn: debs.map((d) => d['bom-ref']) },
    ...npm.dependencies,
  ],
};
writeFileSync(out, JSON.stringify(bom, null, 2) + '\n');
console.log(
  `sbom.mjs: ${out}: ${npm.components.length} npm packages, node ${facts.node} (${facts.arch}), ${debs.length} Debian packages (${os.PRETTY_NAME})`,
);
