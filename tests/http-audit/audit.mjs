// Runs the graphql-http server audit suite against a live gateway and fails
// on any error or warning. Usage: node audit.mjs URL
import { auditServer } from 'graphql-http';

const url = process.argv[2];
if (!url) {
  console.error('usage: node audit.mjs URL');
  process.exit(2);
}
const results = await auditServer({ url });
const counts = { ok: 0, warn: 0, error: 0 };
for (const result of results) {
  counts[result.status] += 1;
  if (result.status !== 'ok') {
    let detail = '';
    if (result.response) {
      const body = await result.response.text().catch(() => '');
      detail = ` [HTTP ${result.response.status} ${result.response.headers.get('content-type')}] ${body.slice(0, 300)}`;
    }
    console.log(`${result.status.toUpperCase()} ${result.id} ${result.name}: ${result.reason}${detail}`);
  }
}
console.log(`graphql-http audit: ${counts.ok} ok, ${counts.warn} warnings, ${counts.error} errors`);
process.exit(counts.warn + counts.error === 0 ? 0 : 1);
