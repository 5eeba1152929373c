// Ordering keys: `keys` ordering keys x `per_key` messages on a topic of `sources` publish
// message sources, published interleaved (key 0 #0, key 1 #0, ..., key 0 #1, ...) by a
// publisher with messageOrdering, all at once, into a subscription with message ordering; one
// streaming subscriber acks each message after a random few milliseconds. Prints how many
// first deliveries came out of their key's publish order (redeliveries counted apart), and what
// was lost or duplicated.
import { scenarioArgs, client, report, tally, waitFor, grpcError } from './lib.mjs';

const args = scenarioArgs();
const pubsub = client(args);
// A topic of `sources` publish message sources: each key goes to one of them.
const [topic] = await pubsub.createTopic({
  name: args.topic,
  labels: { 'pubsubd-publish-sources': String(args.sources ?? 1) },
});
await topic.createSubscription(args.subscription, {
  enableMessageOrdering: true,
  ackDeadlineSeconds: 30,
});
const ordered = pubsub.topic(args.topic, {
  messageOrdering: true,
  batching: { maxMessages: args.batch, maxMilliseconds: 10 },
});

const publishes = [];
for (let seq = 0; seq < args.per_key; seq += 1) {
  for (let key = 0; key < args.keys; key += 1) {
    publishes.push(
      ordered.publishMessage({
        data: Buffer.from(`k${key}-${seq}`),
        orderingKey: `key-${key}`,
        attributes: { seq: String(seq) },
      }),
    );
  }
}
const ids = await Promise.all(publishes);

const received = [];
const lastSeq = new Map(); // ordering key -> last seq received first-time
const firstTime = new Set();
let outOfOrder = 0;
const outOfOrderExamples = [];
let redeliveries = 0;
const errors = [];
const sub = pubsub.subscription(args.subscription, { flowControl: { maxMessages: 1000 } });
sub.on('message', (message) => {
  received.push(message.id);
  if (firstTime.has(message.id)) {
    redeliveries += 1;
  } else {
    firstTime.add(message.id);
    const seq = Number(message.attributes.seq);
    const previous = lastSeq.get(message.orderingKey) ?? -1;
    if (seq !== previous + 1) {
      outOfOrder += 1;
      if (outOfOrderExamples.length < 5) {
        outOfOrderExamples.push({ key: message.orderingKey, after: previous, got: seq });
      }
    }
    lastSeq.set(message.orderingKey, Math.max(previous, seq));
  }
  setTimeout(() => message.ack(), Math.floor(Math.random() * args.max_hold_ms));
});
sub.on('error', (err) => errors.push(grpcError(err)));
await waitFor(() => firstTime.size >= ids.length, args.receive_timeout_s * 1000);
await waitFor(() => false, args.settle_ms);
await sub.close();
await pubsub.close();

report({
  keys_seen: lastSeq.size,
  out_of_order: outOfOrder,
  out_of_order_examples: outOfOrderExamples,
  redeliveries,
  errors,
  ...tally(ids, received),
});
