"""The HTTP API for saved searches (FastAPI).

Every route but /healthz needs an API key (`Authorization: Bearer cep_…` or `X-API-Key`); the
key decides the owner, and the owner sees and changes only their own searches (another owner's
id answers 404, exactly as a missing one). Request bodies are limited in size (413).

  GET    /v1/searches          the caller's searches
  POST   /v1/searches          create {query, id?, metadata?, targets?}        → 201
  GET    /v1/searches/{id}
  PUT    /v1/searches/{id}     change {query?, metadata?, targets?}
  DELETE /v1/searches/{id}                                                      → 204
  POST   /v1/test              {query, event} → does it match, and why
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from cep.errors import QueryError
from percolator.explain import explain
from percolator.model import InvalidSearch, Target
from percolator.registry import LimitExceeded, SearchExists, SearchNotFound, SearchRegistry
from percolator.store import ApiKeyStore

DEFAULT_MAX_BODY = 64 * 1024
ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


class TargetIn(BaseModel):
    kind: str
    name: str


class SearchIn(BaseModel):
    query: str = Field(max_length=16_384)
    id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    targets: list[TargetIn] = Field(default_factory=list)


class SearchPatch(BaseModel):
    query: str | None = Field(default=None, max_length=16_384)
    metadata: dict[str, Any] | None = None
    targets: list[TargetIn] | None = None


class TestIn(BaseModel):
    query: str = Field(max_length=16_384)
    event: dict[str, Any]


class BodyLimit:
    """Pure ASGI middleware: 413 when a body is (or turns out to be) larger than `limit`."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _too_large(send, self.limit)
                return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLarge:
            await _too_large(send, self.limit)


class _BodyTooLarge(Exception):
    pass


async def _too_large(send: Any, limit: int) -> None:
    body = f'{{"detail":"request body larger than {limit} bytes"}}'.encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _query_error(exc: QueryError) -> dict[str, Any]:
    out: dict[str, Any] = {"detail": exc.message, "hint": exc.hint, "rendered": exc.render()}
    if exc.span is not None:
        out.update(line=exc.span.line, col=exc.span.col)
    return out


def _targets(items: list[TargetIn] | None) -> list[Target] | None:
    if items is None:
        return None
    return [Target.from_dict(t.model_dump()) for t in items]


def _owner(request: Request, authorization: Annotated[str | None, Header()] = None,
           x_api_key: Annotated[str | None, Header()] = None) -> str:
    key = x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        key = authorization[7:].strip()
    keys: ApiKeyStore = request.app.state.keys
    who = keys.owner_of(key) if key else None
    if who is None:
        raise HTTPException(401, "missing or invalid API key",
                            headers={"WWW-Authenticate": "Bearer"})
    return who


Owner = Annotated[str, Depends(_owner)]


def create_app(registry: SearchRegistry, keys: ApiKeyStore, *,
               max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    app = FastAPI(title="cep saved searches", version="1")

    app.state.keys = keys

    @app.exception_handler(QueryError)
    async def on_query_error(request: Request, exc: QueryError) -> JSONResponse:
        return JSONResponse(_query_error(exc), status_code=400)

    @app.exception_handler(SearchNotFound)
    async def on_not_found(request: Request, exc: SearchNotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(SearchExists)
    async def on_exists(request: Request, exc: SearchExists) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(LimitExceeded)
    async def on_limit(request: Request, exc: LimitExceeded) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=403)

    @app.exception_handler(InvalidSearch)
    async def on_invalid(request: Request, exc: InvalidSearch) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/searches")
    def list_searches(who: Owner) -> list[dict[str, Any]]:
        return [s.to_dict() for s in registry.owned(who)]

    @app.post("/v1/searches", status_code=201)
    def create(body: SearchIn, who: Owner) -> dict[str, Any]:
        search = registry.add(who, body.query, search_id=body.id, metadata=body.metadata,
                              targets=_targets(body.targets) or ())
        return search.to_dict()

    @app.get("/v1/searches/{search_id}")
    def read(search_id: str, who: Owner) -> dict[str, Any]:
        return registry.get(who, search_id).to_dict()

    @app.put("/v1/searches/{search_id}")
    def change(search_id: str, body: SearchPatch, who: Owner) -> dict[str, Any]:
        search = registry.update(who, search_id, query=body.query, metadata=body.metadata,
                                 targets=_targets(body.targets))
        return search.to_dict()

    @app.delete("/v1/searches/{search_id}", status_code=204)
    def delete(search_id: str, who: Owner) -> Response:
        registry.remove(who, search_id)
        return Response(status_code=204)

    @app.post("/v1/test")
    def test(body: TestIn, who: Owner) -> dict[str, Any]:
        result = explain(body.query, body.event, registry.schema)
        return {**result.to_dict(), "explanation": result.render()}

    app.add_middleware(BodyLimit, limit=max_body)  # type: ignore[arg-type]
    return app
