"""The generated Pulsar protocol messages (proto/pubsubd/pulsar/api.proto), from one place."""

from __future__ import annotations

from typing import Any

from pubsubd._gen.pubsubd.pulsar import api_pb2 as _pb

BaseCommand: Any = _pb.BaseCommand
MessageMetadata: Any = _pb.MessageMetadata
SingleMessageMetadata: Any = _pb.SingleMessageMetadata
MessageIdData: Any = _pb.MessageIdData
KeyValue: Any = _pb.KeyValue
CommandSubscribe: Any = _pb.CommandSubscribe
CommandAck: Any = _pb.CommandAck
CommandLookupTopicResponse: Any = _pb.CommandLookupTopicResponse
CommandPartitionedTopicMetadataResponse: Any = _pb.CommandPartitionedTopicMetadataResponse

Type: Any = _pb.BaseCommand.Type
ServerError: Any = _pb.ServerError
CompressionType: Any = _pb.CompressionType
