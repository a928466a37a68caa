"""A request body read only once the caller proved who it is.

FastAPI validates a body parameter (and parses its JSON) before it calls the route's
dependencies, its authentication among them: a caller without credentials was told, in a 422,
which fields the body lacks, or that it is not JSON, before it was told it may not call at all.
A route that takes its body through `json_body(Model, guard)` has it read after `guard` passed.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def json_body(model: type[M], guard: Callable[..., Any], optional: bool = False) -> Callable[..., Awaitable[M | None]]:
    """A dependency giving the request's JSON body as `model` (None for an empty one when
    `optional`), validated only after `guard`, the route's authentication, passed: a refusal
    of the body is the same 422 as FastAPI's own."""

    async def parse(request: Request, _: Any = Depends(guard)) -> M | None:
        raw = await request.body()
        if optional and not raw.strip():
            return None
        try:  # (Python's JSON, as FastAPI's own: it keeps a lone surrogate, a byte a shell passed)
            value = json.loads(raw)
        except ValueError as exc:
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body",), "msg": f"JSON decode error: {exc}",
                                           "input": {}}]) from None
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None

    return parse


def documented(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """The route's `openapi_extra` that still shows `model` as its body in the API's schema
    (`GET /docs`), as a body parameter would have."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})  # (nested models inlined: a `#/$defs/...` would not resolve in the API's schema)

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/") and ref[8:] in defs:
                return inline(defs[ref[8:]])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return {"requestBody": {"required": required, "content": {"application/json": {"schema": inline(schema)}}}}
