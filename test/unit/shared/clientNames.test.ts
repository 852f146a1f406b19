import { describe, expect, it } from '@jest/globals';
import { matchAllowedName, parseAllowedNames, subjectAltNames } from '../../../src/api/clientNames.js';

/**
 * The list of allowed client certificates against what Node reports of a peer certificate
 * (getPeerCertificate(): `subject` an object, `subjectaltname` the text OpenSSL prints, a value
 * with a comma or a quote as a JSON string).
 */
const list = (text: string) => parseAllowedNames(text, 'TLS_CLIENT_ALLOWED_NAMES');
const peer = (subject: Record<string, string | string[]>, subjectaltname?: string) =>
  ({ subject, ...(subjectaltname !== undefined ? { subjectaltname } : {}) }) as unknown as Parameters<typeof matchAllowedName>[1];

describe('subjectAltNames', () => {
  it('reads the entries as Node prints them, a quoted value as one value', () => {
    expect(
      subjectAltNames(
        'DNS:a.svc, URI:"spiffe://a/b\\u002c URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager", IP Address:10.0.0.1, URI:spiffe://x/y',
      ),
    ).toEqual([
      ['DNS', 'a.svc'],
      ['URI', 'spiffe://a/b, URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager'],
      ['IP Address', '10.0.0.1'],
      ['URI', 'spiffe://x/y'],
    ]);
    expect(subjectAltNames(undefined)).toEqual([]);
  });
});

describe('matchAllowedName', () => {
  const names = list('DNS:alertmanager.monitoring.svc,URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager,CN=vmalert+O=monitoring');

  it('a DNS name without regard to case, a URI exactly, every attribute of a subject entry', () => {
    expect(matchAllowedName(names, peer({ CN: 'x' }, 'DNS:AlertManager.Monitoring.svc'))?.text).toBe('DNS:alertmanager.monitoring.svc');
    expect(matchAllowedName(names, peer({ CN: 'x' }, 'URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager'))?.kind).toBe('URI');
    expect(matchAllowedName(names, peer({ CN: 'vmalert', O: 'monitoring' }))?.text).toBe('CN=vmalert+O=monitoring');
    expect(matchAllowedName(names, peer({ CN: 'vmalert', O: ['billing', 'monitoring'] }))?.text).toBe('CN=vmalert+O=monitoring');
  });

  it('nothing else: another name, a longer or differently cased URI, one attribute of two, a name only in the CN, a smuggled one', () => {
    expect(matchAllowedName(names, peer({ CN: 'alertmanager.monitoring.svc' }))).toBeUndefined();
    expect(matchAllowedName(names, peer({ CN: 'x' }, 'DNS:billing.billing.svc'))).toBeUndefined();
    expect(matchAllowedName(names, peer({ CN: 'x' }, 'URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager2'))).toBeUndefined();
    expect(matchAllowedName(names, peer({ CN: 'x' }, 'URI:SPIFFE://cluster.local/ns/monitoring/sa/alertmanager'))).toBeUndefined();
    expect(matchAllowedName(names, peer({ CN: 'vmalert' }))).toBeUndefined();
    expect(matchAllowedName(names, peer({ CN: 'vmalert', O: 'monitoring-x' }))).toBeUndefined();
    // One URI whose text holds ", URI:<allowed>": Node quotes it; it is not the allowed URI.
    expect(
      matchAllowedName(names, peer({ CN: 'x' }, 'URI:"spiffe://evil/x\\u002c URI:spiffe://cluster.local/ns/monitoring/sa/alertmanager"')),
    ).toBeUndefined();
    expect(matchAllowedName(names, peer({}))).toBeUndefined();
  });
});
