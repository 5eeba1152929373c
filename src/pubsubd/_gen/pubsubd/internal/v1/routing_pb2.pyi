from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Load(_message.Message):
    __slots__ = ("messages_per_s", "bytes_per_s", "outstanding_messages")
    MESSAGES_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages_per_s: float
    bytes_per_s: float
    outstanding_messages: int
    def __init__(self, messages_per_s: _Optional[float] = ..., bytes_per_s: _Optional[float] = ..., outstanding_messages: _Optional[int] = ...) -> None: ...

class ForwarderInfo(_message.Message):
    __slots__ = ("protocol_version", "forwarder_id", "address", "zone", "version", "publishing", "subscribing", "load")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PUBLISHING_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBING_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    forwarder_id: str
    address: str
    zone: str
    version: str
    publishing: bool
    subscribing: bool
    load: Load
    def __init__(self, protocol_version: _Optional[int] = ..., forwarder_id: _Optional[str] = ..., address: _Optional[str] = ..., zone: _Optional[str] = ..., version: _Optional[str] = ..., publishing: _Optional[bool] = ..., subscribing: _Optional[bool] = ..., load: _Optional[_Union[Load, _Mapping]] = ...) -> None: ...

class RoutingConstraints(_message.Message):
    __slots__ = ("protocol_version", "drained_forwarders", "drained_zones", "pinned_topics")
    class PinnedTopicsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FORWARDERS_FIELD_NUMBER: _ClassVar[int]
    DRAINED_ZONES_FIELD_NUMBER: _ClassVar[int]
    PINNED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    drained_forwarders: _containers.RepeatedScalarFieldContainer[str]
    drained_zones: _containers.RepeatedScalarFieldContainer[str]
    pinned_topics: _containers.ScalarMap[str, str]
    def __init__(self, protocol_version: _Optional[int] = ..., drained_forwarders: _Optional[_Iterable[str]] = ..., drained_zones: _Optional[_Iterable[str]] = ..., pinned_topics: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Route(_message.Message):
    __slots__ = ("unit", "forwarders", "moved_at_unix_s", "spread", "spread_width")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    FORWARDERS_FIELD_NUMBER: _ClassVar[int]
    MOVED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SPREAD_FIELD_NUMBER: _ClassVar[int]
    SPREAD_WIDTH_FIELD_NUMBER: _ClassVar[int]
    unit: str
    forwarders: _containers.RepeatedScalarFieldContainer[str]
    moved_at_unix_s: float
    spread: bool
    spread_width: int
    def __init__(self, unit: _Optional[str] = ..., forwarders: _Optional[_Iterable[str]] = ..., moved_at_unix_s: _Optional[float] = ..., spread: _Optional[bool] = ..., spread_width: _Optional[int] = ...) -> None: ...

class AssignmentShard(_message.Message):
    __slots__ = ("protocol_version", "generation", "router_id", "routes")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    generation: int
    router_id: str
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    def __init__(self, protocol_version: _Optional[int] = ..., generation: _Optional[int] = ..., router_id: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("protocol_version", "forwarder_id", "at_unix_s", "topics", "subscriptions", "backlogs", "backlogs_left_out")
    class TopicsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Load
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Load, _Mapping]] = ...) -> None: ...
    class SubscriptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Load
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Load, _Mapping]] = ...) -> None: ...
    class BacklogsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: BacklogShare
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[BacklogShare, _Mapping]] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_ID_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    BACKLOGS_FIELD_NUMBER: _ClassVar[int]
    BACKLOGS_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    forwarder_id: str
    at_unix_s: float
    topics: _containers.MessageMap[str, Load]
    subscriptions: _containers.MessageMap[str, Load]
    backlogs: _containers.MessageMap[str, BacklogShare]
    backlogs_left_out: int
    def __init__(self, protocol_version: _Optional[int] = ..., forwarder_id: _Optional[str] = ..., at_unix_s: _Optional[float] = ..., topics: _Optional[_Mapping[str, Load]] = ..., subscriptions: _Optional[_Mapping[str, Load]] = ..., backlogs: _Optional[_Mapping[str, BacklogShare]] = ..., backlogs_left_out: _Optional[int] = ...) -> None: ...

class BacklogShare(_message.Message):
    __slots__ = ("subscription", "sources", "topic_sources", "messages", "bytes", "oldest_unacked_age_s", "spread")
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    TOPIC_SOURCES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNACKED_AGE_S_FIELD_NUMBER: _ClassVar[int]
    SPREAD_FIELD_NUMBER: _ClassVar[int]
    subscription: str
    sources: _containers.RepeatedScalarFieldContainer[int]
    topic_sources: int
    messages: int
    bytes: int
    oldest_unacked_age_s: float
    spread: bool
    def __init__(self, subscription: _Optional[str] = ..., sources: _Optional[_Iterable[int]] = ..., topic_sources: _Optional[int] = ..., messages: _Optional[int] = ..., bytes: _Optional[int] = ..., oldest_unacked_age_s: _Optional[float] = ..., spread: _Optional[bool] = ...) -> None: ...

class RoutingSummary(_message.Message):
    __slots__ = ("protocol_version", "generation", "router_id", "at_unix_s", "publishing_units", "subscribing_units", "publishing_capacity", "subscribing_capacity", "publishing_loads", "subscribing_loads", "moves", "total_moves", "publishing_weights", "subscribing_weights", "load_half_life_s")
    class PublishingLoadsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SubscribingLoadsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class PublishingWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SubscribingWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    PUBLISHING_UNITS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBING_UNITS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHING_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBING_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PUBLISHING_LOADS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBING_LOADS_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MOVES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHING_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBING_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    LOAD_HALF_LIFE_S_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    generation: int
    router_id: str
    at_unix_s: float
    publishing_units: int
    subscribing_units: int
    publishing_capacity: int
    subscribing_capacity: int
    publishing_loads: _containers.ScalarMap[str, int]
    subscribing_loads: _containers.ScalarMap[str, int]
    moves: int
    total_moves: int
    publishing_weights: _containers.ScalarMap[str, int]
    subscribing_weights: _containers.ScalarMap[str, int]
    load_half_life_s: float
    def __init__(self, protocol_version: _Optional[int] = ..., generation: _Optional[int] = ..., router_id: _Optional[str] = ..., at_unix_s: _Optional[float] = ..., publishing_units: _Optional[int] = ..., subscribing_units: _Optional[int] = ..., publishing_capacity: _Optional[int] = ..., subscribing_capacity: _Optional[int] = ..., publishing_loads: _Optional[_Mapping[str, int]] = ..., subscribing_loads: _Optional[_Mapping[str, int]] = ..., moves: _Optional[int] = ..., total_moves: _Optional[int] = ..., publishing_weights: _Optional[_Mapping[str, int]] = ..., subscribing_weights: _Optional[_Mapping[str, int]] = ..., load_half_life_s: _Optional[float] = ...) -> None: ...
