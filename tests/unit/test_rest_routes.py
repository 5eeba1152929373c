"""The REST front's HTTP rules (api/rest/routes.py) against Google's, and request matching; the
gRPC -> HTTP status map against google-api-core's."""

from __future__ import annotations

import importlib

import grpc
import pytest
from google.api_core import exceptions as api_exceptions

from pubsubd.api.grpc.status import HTTP_STATUS
from pubsubd.api.rest import routes

pytestmark = pytest.mark.unit


def _google_rules() -> set[tuple[str, str, str, str]]:
    """(verb, template, body, method) of every HTTP rule in the official client's REST
    transports (generated from the protos' google.api.http annotations and pubsub_v1.yaml)."""
    services = {
        "publisher": "google.pubsub.v1.Publisher",
        "subscriber": "google.pubsub.v1.Subscriber",
        "schema_service": "google.pubsub.v1.SchemaService",
    }
    rules = set()
    for module, service in services.items():
        rest_base = importlib.import_module(
            f"google.pubsub_v1.services.{module}.transports.rest_base"
        )
        (transport,) = (
            c for n, c in vars(rest_base).items() if n.startswith("_Base") and "RestTransport" in n
        )
        for name, cls in vars(transport).items():
            if not (name.startswith("_Base") and hasattr(cls, "_get_http_options")):
                continue
            method = name.removeprefix("_Base")
            iam = method in ("GetIamPolicy", "SetIamPolicy", "TestIamPermissions")
            full = f"/google.iam.v1.IAMPolicy/{method}" if iam else f"/{service}/{method}"
            for option in cls._get_http_options():
                rules.add((option["method"].upper(), option["uri"], option.get("body", ""), full))
    return rules


def test_the_table_is_googles() -> None:
    ours = {(r.verb, r.template, r.body, r.method) for r in routes.RULES}
    assert len(ours) == len(routes.RULES)  # no rule twice
    assert ours == _google_rules()


def test_each_rule_matches_itself_only() -> None:
    for rule in routes.RULES:
        # Fill the template: "/v1/{topic=projects/*/topics/*}:publish" -> a concrete path.
        concrete = rule.template
        start, end = concrete.index("{"), concrete.index("}")
        pattern = concrete[start + 1 : end].split("=", 1)[1]
        value = pattern.replace("*", "abc-1", 1).replace("*", "xyz.2")
        concrete = concrete[:start] + value + concrete[end + 1 :]
        found = routes.match(rule.verb, concrete)
        assert found is not None and found.rule is rule, concrete
        assert found.value == value


def test_matching_binds_the_decoded_name() -> None:
    found = routes.match("POST", "/v1/projects/my-p/topics/a%25b~c:publish")
    assert found is not None
    assert found.rule.method == "/google.pubsub.v1.Publisher/Publish"
    assert (found.field, found.value) == ("topic", "projects/my-p/topics/a%b~c")
    found = routes.match("PATCH", "/v1/projects/p/subscriptions/s-1")
    assert found is not None and found.field == "subscription.name"
    found = routes.match("GET", "/v1/projects/p/topics")
    assert found is not None and (found.field, found.value) == ("project", "projects/p")


@pytest.mark.parametrize(
    "verb,path",
    [
        ("GET", "/v1/projects/p/topics/t:publish"),  # publish is POST
        ("POST", "/v1/projects/p/topics/t:nosuchverb"),
        ("GET", "/v1/projects/p/topics/t/extra/segments"),
        ("GET", "/v1/projects//topics/t"),  # an empty segment is no ID
        ("GET", "/v1/projects/p/queues/q"),
        ("GET", "/v2/projects/p/topics/t"),
        ("GET", "/v1/"),
    ],
)
def test_no_rule_matches(verb: str, path: str) -> None:
    assert routes.match(verb, path) is None


def test_verbs_for_explains_a_wrong_verb() -> None:
    assert routes.verbs_for("/v1/projects/p/topics/t:publish") == ["POST"]
    assert routes.verbs_for("/v1/projects/p/topics/t") == ["DELETE", "GET", "PATCH", "PUT"]
    assert routes.verbs_for("/v1/nothing") == []


def test_http_status_is_googles_for_every_code() -> None:
    for code in grpc.StatusCode:
        expected = api_exceptions.exception_class_for_grpc_status(code).code
        if expected is not None:  # api-core leaves OK, UNKNOWN and DATA_LOSS without one
            assert HTTP_STATUS[code] == expected, code
    assert HTTP_STATUS[grpc.StatusCode.UNKNOWN] == 500
    assert HTTP_STATUS[grpc.StatusCode.DATA_LOSS] == 500
