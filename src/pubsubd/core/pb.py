"""Raw protobuf classes of google.pubsub.v1, taken from the official client package.

The official ``google-cloud-pubsub`` package ships its wire types as proto-plus wrappers; ``.pb()``
returns the raw protobuf class behind each one. The server works on the raw classes only: they are
C-backed (upb) and several times faster than the wrappers. Importing them from one place keeps the
dependency on the client package's layout in one module.
"""

from __future__ import annotations

from typing import Any

from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.protobuf import duration_pb2, empty_pb2, field_mask_pb2, timestamp_pb2
from google.pubsub_v1 import types as _t
from google.pubsub_v1.types import schema as _schema

# The raw classes are created dynamically, so static typing sees them as Any.
Topic: Any = _t.Topic.pb()
Subscription: Any = _t.Subscription.pb()
PubsubMessage: Any = _t.PubsubMessage.pb()
ReceivedMessage: Any = _t.ReceivedMessage.pb()
PushConfig: Any = _t.PushConfig.pb()

PublishRequest: Any = _t.PublishRequest.pb()
PublishResponse: Any = _t.PublishResponse.pb()
GetTopicRequest: Any = _t.GetTopicRequest.pb()
UpdateTopicRequest: Any = _t.UpdateTopicRequest.pb()
ListTopicsRequest: Any = _t.ListTopicsRequest.pb()
ListTopicsResponse: Any = _t.ListTopicsResponse.pb()
ListTopicSubscriptionsRequest: Any = _t.ListTopicSubscriptionsRequest.pb()
ListTopicSubscriptionsResponse: Any = _t.ListTopicSubscriptionsResponse.pb()
ListTopicSnapshotsRequest: Any = _t.ListTopicSnapshotsRequest.pb()
ListTopicSnapshotsResponse: Any = _t.ListTopicSnapshotsResponse.pb()
DeleteTopicRequest: Any = _t.DeleteTopicRequest.pb()
DetachSubscriptionRequest: Any = _t.DetachSubscriptionRequest.pb()
DetachSubscriptionResponse: Any = _t.DetachSubscriptionResponse.pb()

GetSubscriptionRequest: Any = _t.GetSubscriptionRequest.pb()
UpdateSubscriptionRequest: Any = _t.UpdateSubscriptionRequest.pb()
ListSubscriptionsRequest: Any = _t.ListSubscriptionsRequest.pb()
ListSubscriptionsResponse: Any = _t.ListSubscriptionsResponse.pb()
DeleteSubscriptionRequest: Any = _t.DeleteSubscriptionRequest.pb()
ModifyAckDeadlineRequest: Any = _t.ModifyAckDeadlineRequest.pb()
AcknowledgeRequest: Any = _t.AcknowledgeRequest.pb()
PullRequest: Any = _t.PullRequest.pb()
PullResponse: Any = _t.PullResponse.pb()
StreamingPullRequest: Any = _t.StreamingPullRequest.pb()
StreamingPullResponse: Any = _t.StreamingPullResponse.pb()
ModifyPushConfigRequest: Any = _t.ModifyPushConfigRequest.pb()

Snapshot: Any = _t.Snapshot.pb()
CreateSnapshotRequest: Any = _t.CreateSnapshotRequest.pb()
GetSnapshotRequest: Any = _t.GetSnapshotRequest.pb()
UpdateSnapshotRequest: Any = _t.UpdateSnapshotRequest.pb()
ListSnapshotsRequest: Any = _t.ListSnapshotsRequest.pb()
ListSnapshotsResponse: Any = _t.ListSnapshotsResponse.pb()
DeleteSnapshotRequest: Any = _t.DeleteSnapshotRequest.pb()
SeekRequest: Any = _t.SeekRequest.pb()
SeekResponse: Any = _t.SeekResponse.pb()

Empty: Any = empty_pb2.Empty
FieldMask: Any = field_mask_pb2.FieldMask
Timestamp: Any = timestamp_pb2.Timestamp
Duration: Any = duration_pb2.Duration

# google.pubsub.v1.SchemaService (not served yet: README, "Not built yet"; the REST front still
# transcodes its calls, which the gRPC port answers UNIMPLEMENTED) and google.iam.v1.IAMPolicy.
Schema: Any = _t.Schema.pb()
CreateSchemaRequest: Any = _t.CreateSchemaRequest.pb()
GetSchemaRequest: Any = _t.GetSchemaRequest.pb()
ListSchemasRequest: Any = _t.ListSchemasRequest.pb()
ListSchemasResponse: Any = _t.ListSchemasResponse.pb()
ListSchemaRevisionsRequest: Any = _t.ListSchemaRevisionsRequest.pb()
ListSchemaRevisionsResponse: Any = _t.ListSchemaRevisionsResponse.pb()
CommitSchemaRequest: Any = _t.CommitSchemaRequest.pb()
RollbackSchemaRequest: Any = _t.RollbackSchemaRequest.pb()
DeleteSchemaRevisionRequest: Any = _t.DeleteSchemaRevisionRequest.pb()
DeleteSchemaRequest: Any = _t.DeleteSchemaRequest.pb()
ValidateSchemaRequest: Any = _t.ValidateSchemaRequest.pb()
ValidateSchemaResponse: Any = _t.ValidateSchemaResponse.pb()
ValidateMessageRequest: Any = _schema.ValidateMessageRequest.pb()
ValidateMessageResponse: Any = _schema.ValidateMessageResponse.pb()

GetIamPolicyRequest: Any = iam_policy_pb2.GetIamPolicyRequest
SetIamPolicyRequest: Any = iam_policy_pb2.SetIamPolicyRequest
TestIamPermissionsRequest: Any = iam_policy_pb2.TestIamPermissionsRequest
TestIamPermissionsResponse: Any = iam_policy_pb2.TestIamPermissionsResponse
Policy: Any = policy_pb2.Policy
