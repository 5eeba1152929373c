// Nack redelivery, three subscriptions of one topic read at the same time:
// - "plain": every message nacked on its first delivery, acked on its second;
// - "ordered" (message ordering; `keys` ordering keys): the message `nack_seq` of each key
//   nacked once, every other acked `ack_delay_ms` later; pubsubd redelivers the nacked one and
//   every later one of its key still outstanding, in order, before anything newer of the key;
// - "dead_letter" (max_delivery_attempts 5, a dead-letter topic with its own subscription):
//   every delivery nacked, so each message reaches the dead-letter subscription after its
//   fifth attempt.
// Prints counts per subscription: lost, deliveries per message, order violations, the delivery
// attempts seen, and the time from a nack to its redelivery.
import { scenarioArgs, client, report, tally, waitFor, grpcError } from './lib.mjs';

const args = scenarioArgs();
const pubsub = client(args);
const MAX_ATTEMPTS = 5;
const [topic] = await pubsub.createTopic(args.topic);
const [deadTopic] = await pubsub.createTopic(`${args.topic}-dead`);
await deadTopic.createSubscription(`${args.subscription}-dead`, { ackDeadlineSeconds: 30 });
await topic.createSubscription(`${args.subscription}-plain`, { ackDeadlineSeconds: 30 });
await topic.createSubscription(`${args.subscription}-ordered`, {
  ackDeadlineSeconds: 30,
  enableMessageOrdering: true,
});
await topic.createSubscription(`${args.subscription}-dead-letter`, {
  ackDeadlineSeconds: 30,
  deadLetterPolicy: { deadLetterTopic: deadTopic.name, maxDeliveryAttempts: MAX_ATTEMPTS },
});

const publisher = pubsub.topic(args.topic, { messageOrdering: true });
const publishes = [];
for (let seq = 0; seq < args.per_key; seq += 1) {
  for (let key = 0; key < args.keys; key += 1) {
    publishes.push(
      publisher.publishMessage({
        data: Buffer.from(`k${key}-${seq}`),
        orderingKey: `key-${key}`,
        attributes: { seq: String(seq), key: String(key) },
      }),
    );
  }
}
const ids = await Promise.all(publishes);
const errors = [];

function open(name) {
  const sub = pubsub.subscription(name, { flowControl: { maxMessages: 1000 } });
  sub.on('error', (err) => errors.push({ subscription: name, ...grpcError(err) }));
  return sub;
}

function percentile(values, q) {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

// plain: nack the first delivery, ack the second.
const plain = { deliveries: new Map(), nackedAt: new Map(), redeliveryMs: [], acked: new Set() };
const plainSub = open(`${args.subscription}-plain`);
plainSub.on('message', (message) => {
  const n = (plain.deliveries.get(message.id) ?? 0) + 1;
  plain.deliveries.set(message.id, n);
  if (n === 1) {
    plain.nackedAt.set(message.id, Date.now());
    message.nack();
  } else {
    if (n === 2) plain.redeliveryMs.push(Date.now() - plain.nackedAt.get(message.id));
    plain.acked.add(message.id);
    message.ack();
  }
});

// ordered: per key, every delivery is the next seq, or a rewind to the nacked seq.
const ordered = {
  received: [],
  last: new Map(),
  nacked: new Set(),
  redelivered: new Map(), // key -> the seqs delivered from the nacked one's redelivery on
  violations: [],
  acked: new Set(),
};
const orderedSub = open(`${args.subscription}-ordered`);
orderedSub.on('message', (message) => {
  ordered.received.push(message.id);
  const key = message.orderingKey;
  const seq = Number(message.attributes.seq);
  const previous = ordered.last.get(key) ?? -1;
  const rewind = seq === args.nack_seq && ordered.nacked.has(key);
  if (rewind) ordered.redelivered.set(key, []);
  ordered.redelivered.get(key)?.push(seq);
  if (seq !== previous + 1 && !rewind) {
    ordered.violations.push({ key, after: previous, got: seq });
  }
  ordered.last.set(key, seq);
  if (seq === args.nack_seq && !ordered.nacked.has(key)) {
    ordered.nacked.add(key);
    message.nack();
  } else {
    setTimeout(() => {
      ordered.acked.add(message.id);
      message.ack();
    }, args.ack_delay_ms);
  }
});

// dead_letter: nack everything; record each delivery's attempt number.
const dead = { attempts: new Map(), deadLettered: [], deadAttributes: 0 };
const idOf = new Map(); // "key/seq" -> the message ID published on the topic
ids.forEach((id, i) => idOf.set(`${i % args.keys}/${Math.floor(i / args.keys)}`, id));

const deadLetterSub = open(`${args.subscription}-dead-letter`);
deadLetterSub.on('message', (message) => {
  const seen = dead.attempts.get(message.id) ?? [];
  seen.push(message.deliveryAttempt);
  dead.attempts.set(message.id, seen);
  message.nack();
});
const deadSub = open(`${args.subscription}-dead`);
deadSub.on('message', (message) => {
  // A dead-lettered message is a new message of the dead-letter topic, with the original's
  // data and attributes.
  dead.deadLettered.push(idOf.get(`${message.attributes.key}/${message.attributes.seq}`) ?? '?');
  if (
    message.attributes.CloudPubSubDeadLetterSourceDeliveryCount === String(MAX_ATTEMPTS) &&
    message.attributes.CloudPubSubDeadLetterSourceSubscription?.endsWith('-dead-letter')
  ) {
    dead.deadAttributes += 1;
  }
  message.ack();
});

const done = () =>
  plain.acked.size >= ids.length &&
  ordered.acked.size >= ids.length &&
  new Set(dead.deadLettered).size >= ids.length;
await waitFor(done, args.receive_timeout_s * 1000);
await waitFor(() => false, args.settle_ms);
await Promise.all([plainSub.close(), orderedSub.close(), deadLetterSub.close(), deadSub.close()]);
await pubsub.close();

const plainCounts = [...plain.deliveries.values()];
const laterSeqs = Array.from({ length: args.per_key - args.nack_seq }, (_, i) => args.nack_seq + i);
const attemptLists = [...dead.attempts.values()];
const expectedAttempts = Array.from({ length: MAX_ATTEMPTS }, (_, i) => i + 1).join(',');
report({
  errors,
  plain: {
    ...tally(ids, [...plain.acked]),
    delivered_once: plainCounts.filter((n) => n === 1).length,
    delivered_twice: plainCounts.filter((n) => n === 2).length,
    delivered_more: plainCounts.filter((n) => n > 2).length,
    redelivery_ms_p50: percentile(plain.redeliveryMs, 0.5),
    redelivery_ms_max: percentile(plain.redeliveryMs, 1),
  },
  ordered: {
    ...tally(ids, [...ordered.acked]),
    deliveries: ordered.received.length,
    keys_nacked: ordered.nacked.size,
    violations: ordered.violations.length,
    violation_examples: ordered.violations.slice(0, 5),
    keys_nacked_redelivered: ordered.redelivered.size,
    // Keys whose redelivery went from the nacked message through the key's last message, in
    // order, although the application had acked the later ones after its nack.
    keys_redelivered_through_last: [...ordered.redelivered.values()].filter(
      (seqs) => seqs.join(',') === laterSeqs.join(','),
    ).length,
  },
  dead_letter: {
    ...tally(ids, dead.deadLettered),
    with_source_attributes: dead.deadAttributes,
    attempts_1_to_5: attemptLists.filter((a) => a.join(',') === expectedAttempts).length,
    attempts_other_examples: attemptLists.filter((a) => a.join(',') !== expectedAttempts).slice(0, 5),
  },
});
