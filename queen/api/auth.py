"""Authentication, roles and queue scopes over HTTP (QUEEN_AUTH=on), and JSON-only bodies.

Every route has one entry in POLICY: the permission it needs and how a token limited to
some queues (`--queues`) is held to them. A route without an entry needs admin.

    PATH      the route's {queue} must be one of the token's queues
    QUERY     the request must name one of them (?queue=); others are refused, not filtered
    RESOURCE  the resource checks the queues it touches (push items, acked messages, ...)
    ALL       covers every queue (or none in particular): refused to a limited token
    NONE      nothing queue-specific (process metrics, the API description)

401 for a missing, malformed, unknown or revoked token, 403 for a role or a queue
outside the token, 429 past its rate; each a JSON error.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from typing import Any

import falcon

from queen.api import send_json
from queen.auth import EVERY_QUEUE, ROLES, Permission, Principal, well_formed
from queen.auth.cache import RateLimiter, TokenVerifier, retry_after
from queen.store import Store


class Scope(enum.Enum):
    PATH = "path"
    QUERY = "query"
    RESOURCE = "resource"
    ALL = "all"
    NONE = "none"


Rule = tuple[Permission, Scope]
READ_ALL: Rule = (Permission.READ, Scope.ALL)
READ_QUERY: Rule = (Permission.READ, Scope.QUERY)
PUBLIC: Rule = (Permission.PUBLIC, Scope.NONE)
ADMIN_RESOURCE: Rule = (Permission.ADMIN, Scope.RESOURCE)

API = "/api/v1"
POLICY: dict[str, dict[str, Rule]] = {
    f"{API}/push": {"POST": (Permission.PUSH, Scope.RESOURCE)},
    f"{API}/pop/queue/{{queue}}/partition/{{partition}}": {"GET": (Permission.CONSUME, Scope.PATH)},
    f"{API}/pop/queue/{{queue}}": {"GET": (Permission.CONSUME, Scope.PATH)},
    f"{API}/pop": {"GET": (Permission.CONSUME, Scope.ALL)},
    f"{API}/ack": {"POST": (Permission.CONSUME, Scope.RESOURCE)},
    f"{API}/ack/batch": {"POST": (Permission.CONSUME, Scope.RESOURCE)},
    f"{API}/configure": {"POST": ADMIN_RESOURCE},
    f"{API}/lease/{{lease}}/extend": {"POST": (Permission.CONSUME, Scope.RESOURCE)},
    # Every role gets past the route; each operation then needs its own right (push ops
    # push, ack ops consume) on its queue: a stage that does both needs admin today.
    f"{API}/transaction": {"POST": (Permission.READ, Scope.RESOURCE)},
    f"{API}/consumer-groups": {"GET": READ_QUERY},
    f"{API}/consumer-groups/{{group}}": {
        "GET": READ_QUERY,
        "PUT": (Permission.CONSUME, Scope.RESOURCE),  # as the first pop would
        "DELETE": (Permission.ADMIN, Scope.QUERY),
    },
    f"{API}/consumer-groups/{{group}}/seek": {"POST": (Permission.CONSUME, Scope.RESOURCE)},
    "/health": {"GET": PUBLIC},
    "/health/live": {"GET": PUBLIC},
    "/health/ready": {"GET": PUBLIC},
    "/": {"GET": PUBLIC, "HEAD": PUBLIC},
    "/dashboard": {"GET": PUBLIC, "HEAD": PUBLIC},
    "/ws/dashboard": {"GET": READ_ALL},
    f"{API}/analytics": {"GET": READ_ALL},
    f"{API}/analytics/queue/{{queue}}": {"GET": (Permission.READ, Scope.PATH)},
    f"{API}/analytics/queues": {"GET": READ_ALL},
    f"{API}/analytics/queue-stats": {"GET": READ_QUERY},
    f"{API}/analytics/queue-depths": {"GET": READ_QUERY},
    f"{API}/analytics/throughput": {"GET": READ_QUERY},
    f"{API}/analytics/queue-lag": {"GET": READ_QUERY},
    f"{API}/analytics/rates": {"GET": READ_QUERY},
    f"{API}/leases": {"GET": READ_QUERY},
    f"{API}/system/nodes": {"GET": (Permission.READ, Scope.NONE)},
    f"{API}/alerts": {"GET": READ_ALL},
    f"{API}/alerts/{{name}}": {"PUT": ADMIN_RESOURCE, "DELETE": (Permission.ADMIN, Scope.ALL)},
    f"{API}/messages": {"GET": READ_QUERY},
    f"{API}/messages/{{txid}}": {
        "GET": (Permission.READ, Scope.RESOURCE),
        "DELETE": ADMIN_RESOURCE,
    },
    f"{API}/messages/{{txid}}/retry": {"POST": ADMIN_RESOURCE},
    f"{API}/messages/{{txid}}/dlq": {"POST": ADMIN_RESOURCE},
    f"{API}/messages/{{txid}}/related": {"GET": (Permission.READ, Scope.RESOURCE)},
    # (The same routes by partition id and transactionId, as the original Queen's clients
    # name a message: the first field is the partition's id there.)
    f"{API}/messages/{{txid}}/{{scoped}}": {
        "GET": (Permission.READ, Scope.RESOURCE),
        "DELETE": ADMIN_RESOURCE,
    },
    f"{API}/messages/{{txid}}/{{scoped}}/retry": {"POST": ADMIN_RESOURCE},
    f"{API}/messages/{{txid}}/{{scoped}}/dlq": {"POST": ADMIN_RESOURCE},
    f"{API}/messages/{{txid}}/{{scoped}}/related": {"GET": (Permission.READ, Scope.RESOURCE)},
    f"{API}/dlq": {"GET": (Permission.READ, Scope.RESOURCE)},
    f"{API}/queues/{{queue}}/clear": {"DELETE": (Permission.ADMIN, Scope.PATH)},
    f"{API}/resources/queues": {"GET": READ_ALL},
    f"{API}/resources/queues/{{queue}}": {
        "GET": (Permission.READ, Scope.PATH),
        "DELETE": (Permission.ADMIN, Scope.PATH),
    },
    f"{API}/resources/partitions": {"GET": READ_QUERY},
    f"{API}/resources/namespaces": {"GET": READ_ALL},
    f"{API}/resources/tasks": {"GET": READ_ALL},
    f"{API}/resources/overview": {"GET": READ_ALL},
    f"{API}/auth/me": {"GET": (Permission.READ, Scope.NONE)},
    "/metrics": {"GET": (Permission.READ, Scope.NONE)},
    "/metrics/prometheus": {"GET": PUBLIC},  # READ with QUEEN_METRICS_AUTH=on
    f"{API}/openapi.json": {"GET": (Permission.READ, Scope.NONE)},
}
DEFAULT_RULE: Rule = (Permission.ADMIN, Scope.ALL)  # a route missing above
STATIC_PREFIX = "/dashboard/static/"  # the dashboard's files: they hold no data
SOCKET_PATH = "/ws/dashboard"  # browsers cannot set headers on a WebSocket: ?token=
CLOSE_CODES = {401: 4401, 403: 4403, 429: 4429}  # WebSocket close codes of refusals


def rule_of(method: str, template: str | None) -> Rule:
    return POLICY.get(template or "", {}).get(method, DEFAULT_RULE)


def public_paths(metrics_auth: bool) -> frozenset[str]:
    """Return the literal paths that need no token."""
    paths = {path for path, rules in POLICY.items() if PUBLIC in rules.values()}
    if metrics_auth:
        paths.discard("/metrics/prometheus")
    return frozenset(paths)


def unauthorized(message: str) -> falcon.HTTPUnauthorized:
    return falcon.HTTPUnauthorized(description=message, challenges=["Bearer"])


def forbidden(message: str) -> falcon.HTTPForbidden:
    return falcon.HTTPForbidden(description=message)


def principal_of(req: falcon.Request) -> Principal | None:
    """Return the token this request authenticated with (None when auth is off)."""
    return getattr(req.context, "principal", None)


def check_queue(req: falcon.Request, queue: str) -> None:
    """Refuse (403) a queue outside the request's token."""
    principal = principal_of(req)
    if principal is not None and principal.scoped and not principal.covers(queue):
        raise forbidden(f"this token does not cover queue {queue!r}")


def check_all_queues(req: falcon.Request) -> None:
    """Refuse (403) what may touch any queue (a pop by namespace / task) to a scoped token."""
    principal = principal_of(req)
    if principal is not None and principal.scoped:
        raise forbidden("this token covers some queues only: name the queue to pop (next.queue)")


def check_queues(req: falcon.Request, queues: Iterable[str]) -> None:
    principal = principal_of(req)
    if principal is not None and principal.scoped:
        for queue in set(queues):
            check_queue(req, queue)


def check_messages(req: falcon.Request, store: Store, transaction_ids: list[str]) -> None:
    """Refuse (403) messages in queues outside the token (unknown ones are left to the route)."""
    principal = principal_of(req)
    if principal is not None and principal.scoped:
        places = store.locate_messages(transaction_ids)
        check_queues(req, (place.queue for place in places.values()))


def presented_token(req: falcon.Request) -> str | None:
    """Return the token the request carries: `Authorization: Bearer`, or ?token= on the socket."""
    header = req.get_header("Authorization")
    if header is not None:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise unauthorized("Authorization must be 'Bearer <token>'")
        return token.strip()
    if req.path == SOCKET_PATH:
        param = req.get_param("token")
        return param if isinstance(param, str) else None
    return None


class AuthMiddleware:
    """Authenticate before routing (401, 429); authorize the route once it is known (403)."""

    def __init__(self, store: Store, verifier: TokenVerifier, metrics_auth: bool) -> None:
        self.store = store
        self.verifier = verifier
        self.limiter = RateLimiter()
        self.public = public_paths(metrics_auth)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path in self.public or req.path.startswith(STATIC_PREFIX):
            return
        try:
            req.context.principal = self._authenticate(req)
        except falcon.HTTPError as exc:
            _close_socket(req, exc)
            raise

    def _authenticate(self, req: falcon.Request) -> Principal:
        token = presented_token(req)
        if not token:
            raise unauthorized("a token is required: Authorization: Bearer <token>")
        principal = self.verifier.verify(token) if well_formed(token) else None
        if principal is None:
            raise unauthorized("unknown or revoked token")
        if principal.rate is not None:
            wait_s = self.limiter.wait_s(principal.name, principal.rate)
            if wait_s > 0:
                raise falcon.HTTPTooManyRequests(
                    description=f"rate limit of token {principal.name!r} exceeded",
                    retry_after=int(retry_after(wait_s)),
                )
        return principal

    def process_resource(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, params: dict[str, Any]
    ) -> None:
        principal = principal_of(req)
        if principal is None:
            return  # a public path
        permission, scope = rule_of(req.method, req.uri_template)
        try:
            _authorize(req, principal, permission, scope, params)
        except falcon.HTTPError as exc:
            _close_socket(req, exc)
            raise


def _authorize(
    req: falcon.Request,
    principal: Principal,
    permission: Permission,
    scope: Scope,
    params: dict[str, Any],
) -> None:
    if not principal.may(permission):
        raise forbidden(f"role {principal.role} may not {req.method} {req.uri_template}")
    if not principal.scoped:
        return
    if scope is Scope.PATH:
        check_queue(req, str(params.get("queue")))
    elif scope is Scope.QUERY:
        queue = req.get_param("queue")
        if not isinstance(queue, str):
            raise forbidden("this token covers some queues only: name one (?queue=)")
        check_queue(req, queue)
    elif scope is Scope.ALL:
        raise forbidden("this token covers some queues only; this route covers them all")


def _close_socket(req: falcon.Request, exc: falcon.HTTPError) -> None:
    """Close a WebSocket (already upgraded by the worker) with the refusal's code and text."""
    ws = req.env.get("wsgi.websocket")
    if ws is None:
        return
    code = CLOSE_CODES.get(int(exc.status_code), 4400)
    reason = (exc.description or exc.title or "refused")[:120]
    # geventwebsocket sends close's message as UTF-8 text: the code's two bytes (both
    # below 0x80 for 4400-4429) pass through unchanged, then the reason.
    ws.close(message=struct.pack("!H", code).decode("ascii") + reason)


class JSONBodyMiddleware:
    """Refuse (415) a request body that is not application/json (no simple cross-site request)."""

    def process_resource(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, params: dict[str, Any]
    ) -> None:
        length = req.content_length
        has_body = bool(length) or (
            length is None and "chunked" in (req.get_header("Transfer-Encoding") or "")
        )
        if not has_body:
            return
        media = (req.content_type or "").split(";", 1)[0].strip().lower()
        if media != falcon.MEDIA_JSON:
            raise falcon.HTTPUnsupportedMediaType(
                description="request bodies must be application/json"
            )


class WhoAmIResource:
    """GET /api/v1/auth/me: the calling token's role, permissions and queues.

    The dashboard asks it to show only the actions the token may take. With auth off
    every caller may do everything.
    """

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        principal = principal_of(req)
        if principal is None:
            role, name, queues = "admin", None, [EVERY_QUEUE]
        else:
            role, name, queues = principal.role, principal.name, list(principal.queues)
        permissions = sorted(p.value for p in ROLES[role] if p is not Permission.PUBLIC)
        doc = {
            "auth": principal is not None,
            "name": name,
            "role": role,
            "permissions": permissions,
            "queues": queues,
        }
        send_json(resp, doc, 200)
