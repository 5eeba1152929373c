// What every scenario script shares: its arguments (one JSON object in argv[2]), a PubSub
// client that reaches pubsubd through PUBSUB_EMULATOR_HOST (as users point it at us), a watchdog
// that ends a stuck scenario with a message, and the one JSON line of results on stdout that
// tests/integration/test_node_client.py reads.
import { PubSub } from '@google-cloud/pubsub';

export function scenarioArgs() {
  const args = JSON.parse(process.argv[2] ?? '{}');
  if (!process.env.PUBSUB_EMULATOR_HOST) {
    fail('PUBSUB_EMULATOR_HOST is not set');
  }
  const watchdogMs = (args.timeout_s ?? 30) * 1000;
  setTimeout(() => fail(`scenario still running after ${watchdogMs} ms`), watchdogMs).unref();
  return args;
}

export function client(args) {
  // No projectId from the environment or credentials: the emulator host mode needs neither.
  return new PubSub({ projectId: args.project });
}

export function report(result) {
  process.stdout.write(JSON.stringify(result) + '\n');
}

export function fail(message) {
  process.stderr.write(`scenario failed: ${message}\n`);
  process.exit(2);
}

// The gRPC status of a client error: what Node code sees (`err.code`), and its details.
export function grpcError(err) {
  return { code: err?.code ?? null, details: String(err?.details ?? err?.message ?? err) };
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Waits until `predicate()` holds, polling every 10 ms; false once `timeoutMs` has passed.
export async function waitFor(predicate, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (predicate()) return true;
    await sleep(10);
  }
  return predicate();
}

// Counts what a subscriber received against what was published: lost (published, never
// received), duplicated (received more than once), unexpected (received, never published).
export function tally(publishedIds, receivedIds) {
  const seen = new Map();
  for (const id of receivedIds) seen.set(id, (seen.get(id) ?? 0) + 1);
  const published = new Set(publishedIds);
  let lost = 0;
  for (const id of published) if (!seen.has(id)) lost += 1;
  let duplicated = 0;
  let unexpected = 0;
  for (const [id, count] of seen) {
    if (count > 1) duplicated += count - 1;
    if (!published.has(id)) unexpected += 1;
  }
  return { published: published.size, received: receivedIds.length, lost, duplicated, unexpected };
}
