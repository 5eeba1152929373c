// Publish with batching: `count` messages published at once through a batching publisher
// (`max_messages` per batch, `max_ms` at most held), then received by a streaming subscriber
// that acks each one. Prints the message IDs' uniqueness, what was lost or duplicated, and the
// topic's name so the test can read pubsubd's count of Publish requests for it.
import { scenarioArgs, client, report, tally, waitFor, grpcError } from './lib.mjs';

const args = scenarioArgs();
const pubsub = client(args);
const [topic] = await pubsub.createTopic(args.topic);
const [subscription] = await topic.createSubscription(args.subscription, {
  ackDeadlineSeconds: 60,
});

const batched = pubsub.topic(args.topic, {
  batching: { maxMessages: args.max_messages, maxMilliseconds: args.max_ms },
});
const started = Date.now();
const publishes = [];
for (let i = 0; i < args.count; i += 1) {
  publishes.push(
    batched.publishMessage({ data: Buffer.from(`message ${i}`), attributes: { seq: String(i) } }),
  );
}
const outcomes = await Promise.allSettled(publishes);
const publishMs = Date.now() - started;
const ids = outcomes.filter((o) => o.status === 'fulfilled').map((o) => o.value);
const failures = outcomes.filter((o) => o.status === 'rejected').map((o) => grpcError(o.reason));

const received = [];
let dataMismatches = 0;
const sub = pubsub.subscription(args.subscription, { flowControl: { maxMessages: 1000 } });
sub.on('message', (message) => {
  received.push(message.id);
  if (message.data.toString() !== `message ${message.attributes.seq}`) dataMismatches += 1;
  message.ack();
});
const errors = [];
sub.on('error', (err) => errors.push(grpcError(err)));
const distinct = new Set(ids);
await waitFor(() => new Set(received).size >= distinct.size, args.receive_timeout_s * 1000);
// Anything redelivered shortly after the last first delivery would count as a duplicate.
await waitFor(() => false, args.settle_ms);
await sub.close();
await pubsub.close();

report({
  topic: topic.name,
  publish_ms: publishMs,
  publish_failures: failures.slice(0, 5),
  publish_failure_count: failures.length,
  distinct_ids: distinct.size,
  data_mismatches: dataMismatches,
  subscriber_errors: errors,
  ...tally(ids, received),
});
