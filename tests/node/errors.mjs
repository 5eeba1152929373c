// Errors as Node code sees them: each case makes one call pubsubd must refuse and records the
// gRPC status the client surfaced (`err.code`, `err.details`); a case that unexpectedly
// succeeds records code 0. Afterwards a message is published and received on the same server,
// to show it still serves, and a publish with an ordering key that failed is resumed.
import { scenarioArgs, client, report, waitFor, grpcError } from './lib.mjs';

const args = scenarioArgs();
const pubsub = client(args);
const name = (tag) => `${tag}-${args.suffix}`;
const [topic] = await pubsub.createTopic(name('errors'));
await topic.createSubscription(name('errors-sub'), { ackDeadlineSeconds: 10 });

async function outcome(call) {
  try {
    await call();
    return { code: 0, details: 'succeeded' };
  } catch (err) {
    return grpcError(err);
  }
}

// A streaming subscriber's failure arrives as an 'error' event, not a rejected promise.
function streamingError(subscriptionName) {
  return new Promise((resolve) => {
    const sub = pubsub.subscription(subscriptionName);
    const timer = setTimeout(() => {
      sub.close().then(() => resolve({ code: 0, details: 'no error within 10 s' }));
    }, 10000);
    sub.on('error', (err) => {
      clearTimeout(timer);
      sub.close().catch(() => {});
      resolve(grpcError(err));
    });
    sub.on('message', (message) => message.ack());
  });
}

const cases = {
  publish_to_missing_topic: () =>
    pubsub.topic(name('missing')).publishMessage({ data: Buffer.from('x') }),
  publish_to_invalid_topic_name: () =>
    pubsub.topic('bad topic name!').publishMessage({ data: Buffer.from('x') }),
  publish_to_too_short_topic_name: () =>
    pubsub.topic('ab').publishMessage({ data: Buffer.from('x') }),
  publish_attribute_key_too_long: () =>
    topic.publishMessage({ data: Buffer.from('x'), attributes: { ['k'.repeat(300)]: 'v' } }),
  // 10.5 MB: over the 10 MB a Publish request may carry.
  publish_too_large: () => topic.publishMessage({ data: Buffer.alloc(10_500_000, 97) }),
  create_existing_topic: () => pubsub.createTopic(name('errors')),
  delete_missing_topic: () => pubsub.topic(name('missing')).delete(),
  create_subscription_of_missing_topic: () =>
    pubsub.topic(name('missing')).createSubscription(name('orphan')),
  create_subscription_ack_deadline_too_long: () =>
    topic.createSubscription(name('slow'), { ackDeadlineSeconds: 601 }),
  create_subscription_bad_filter: () =>
    topic.createSubscription(name('filtered'), { filter: 'attributes.k = ' }),
  get_missing_subscription: () => pubsub.subscription(name('missing-sub')).getMetadata(),
  seek_to_missing_snapshot: () =>
    pubsub.subscription(name('errors-sub')).seek(`projects/${args.project}/snapshots/${name('none')}`),
  subscribe_to_missing_subscription: () => streamingError(name('missing-sub')),
};

const results = {};
for (const [label, call] of Object.entries(cases)) {
  results[label] = label.startsWith('subscribe_') ? await call() : await outcome(call);
}

// An ordering key whose publish failed is paused in the client until resumePublishing.
const orderedMissing = pubsub.topic(name('ordered-later'), { messageOrdering: true });
const orderedKey = 'key-1';
results.ordered_publish_to_missing_topic = await outcome(() =>
  orderedMissing.publishMessage({ data: Buffer.from('first'), orderingKey: orderedKey }),
);
await pubsub.createTopic(name('ordered-later'));
orderedMissing.resumePublishing(orderedKey);
results.ordered_publish_after_resume = await outcome(() =>
  orderedMissing.publishMessage({ data: Buffer.from('second'), orderingKey: orderedKey }),
);

// The server is still serving: publish and receive one message.
const id = await topic.publishMessage({ data: Buffer.from('still up') });
const received = [];
const sub = pubsub.subscription(name('errors-sub'));
sub.on('message', (message) => {
  received.push({ id: message.id, data: message.data.toString() });
  message.ack();
});
await waitFor(() => received.length > 0, 10000);
await sub.close();
await pubsub.close();

report({ cases: results, after: { published_id: id, received } });
