"""The OpenAPI document describes exactly the routes the app serves."""

from __future__ import annotations

import json
import re
from typing import Any

import falcon
import pytest
from falcon import inspect, testing

from queen.app import create_app
from queen.config import Settings
from queen.store import Store

HTTP_METHODS = {"get", "head", "post", "put", "patch", "delete"}


@pytest.fixture(scope="module")
def app() -> falcon.App:
    settings = Settings.from_env({}, database_url="postgresql://nobody@127.0.0.1:1/none")
    return create_app(settings, store=Store.from_settings(settings))  # pool never opened


@pytest.fixture(scope="module")
def document(app: falcon.App) -> dict[str, Any]:
    resp = testing.TestClient(app).simulate_get("/api/v1/openapi.json")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/json")
    return json.loads(resp.content)


def shape(path: str) -> str:
    """Compare paths without their parameter names: /messages/{txid} == /messages/{x}."""
    return re.sub(r"\{[^}]+\}", "{}", path)


def served(app: falcon.App) -> set[tuple[str, str]]:
    """(path shape, method) of every route, responders falcon adds itself left out."""
    pairs = set()
    for route in inspect.inspect_routes(app):
        for method in route.methods:
            if method.internal or method.method.lower() not in HTTP_METHODS:
                continue
            pairs.add((shape(route.path), method.method.lower()))
    for static in inspect.inspect_static_routes(app):
        pairs.add((shape(static.prefix.rstrip("/") + "/{path}"), "get"))
    return pairs


def documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (shape(path), method)
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def test_every_route_is_documented_and_nothing_else(app, document):
    routes, docs = served(app), documented(document)
    assert routes - docs == set(), "routes missing from queen/api/openapi.json"
    assert docs - routes == set(), "documented operations the app does not serve"


def test_document_is_openapi_3_with_unique_operation_ids(document):
    assert document["openapi"].startswith("3.")
    ids = [
        op["operationId"]
        for item in document["paths"].values()
        for method, op in item.items()
        if method in HTTP_METHODS
    ]
    assert len(ids) == len(set(ids))
    assert all(op_id for op_id in ids)
    assert "/ws/dashboard" in document["info"]["description"]


def test_document_validates_when_a_validator_is_installed(document):
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(document)


def test_path_parameters_are_declared(document):
    for path, item in document["paths"].items():
        wanted = set(re.findall(r"\{([^}]+)\}", path))
        for method, op in item.items():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == wanted, f"{method.upper()} {path}"
