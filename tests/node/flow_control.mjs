// Subscribe with flow control: `count` messages published, then read by two subscribers that
// hold each message `hold_ms` before acking, each with flowControl.maxMessages = `max_messages`:
// - "server": one stream, allowExcessMessages true (the client dispatches whatever arrives),
//   so only pubsubd honouring the stream's max_outstanding_messages keeps the bound;
// - "client": the default five streams, allowExcessMessages false (the client holds back
//   what exceeds the bound and extends its leases).
// Prints, for each, the most messages handed to user code and not yet acked at once, and what
// was lost or duplicated.
import { scenarioArgs, client, report, tally, waitFor, grpcError } from './lib.mjs';

const args = scenarioArgs();
const pubsub = client(args);
const [topic] = await pubsub.createTopic(args.topic);
const modes = {
  server: { streams: { maxStreams: 1 }, allowExcessMessages: true },
  client: { streams: { maxStreams: 5 }, allowExcessMessages: false },
};
for (const mode of Object.keys(modes)) {
  await topic.createSubscription(`${args.subscription}-${mode}`, { ackDeadlineSeconds: 30 });
}
const ids = await Promise.all(
  Array.from({ length: args.count }, (_, i) => topic.publishMessage({ data: Buffer.from(`m${i}`) })),
);

async function consume(mode) {
  const { streams, allowExcessMessages } = modes[mode];
  const sub = pubsub.subscription(`${args.subscription}-${mode}`, {
    flowControl: { maxMessages: args.max_messages, allowExcessMessages },
    streamingOptions: streams,
  });
  const received = [];
  const errors = [];
  let outstanding = 0;
  let maxOutstanding = 0;
  sub.on('message', (message) => {
    received.push(message.id);
    outstanding += 1;
    maxOutstanding = Math.max(maxOutstanding, outstanding);
    setTimeout(() => {
      outstanding -= 1;
      message.ack();
    }, args.hold_ms);
  });
  sub.on('error', (err) => errors.push(grpcError(err)));
  const started = Date.now();
  await waitFor(() => new Set(received).size >= ids.length, args.receive_timeout_s * 1000);
  const elapsedMs = Date.now() - started;
  await waitFor(() => outstanding === 0, 5000);
  await waitFor(() => false, args.settle_ms);
  await sub.close();
  return { max_outstanding: maxOutstanding, elapsed_ms: elapsedMs, errors, ...tally(ids, received) };
}

const results = {};
// One after the other: each subscriber's concurrency is its own.
for (const mode of Object.keys(modes)) results[mode] = await consume(mode);
await pubsub.close();
report(results);
