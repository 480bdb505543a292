"""The OpenAPI description of the gateway's event routes: the request body (a CloudEvent in
any mode, or plain JSON) and every answer, with the error body."""

from __future__ import annotations

from typing import Any

__all__ = ["REQUEST_BODY", "RESPONSES"]

_CE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["specversion", "id", "source", "type"],
    "properties": {
        "specversion": {"type": "string", "enum": ["1.0"]},
        "id": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "type": {"type": "string", "minLength": 1},
        "subject": {"type": "string"},
        "time": {"type": "string", "format": "date-time"},
        "datacontenttype": {"type": "string"},
        "data": {},
    },
}
REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A CloudEvent (binary mode: ce-* headers and the data as body; structured "
        "mode; or a batch), or a plain JSON body that is wrapped into a CloudEvent.",
        "content": {
            "application/json": {"schema": {}},
            "application/cloudevents+json": {"schema": _CE_SCHEMA},
            "application/cloudevents-batch+json": {
                "schema": {"type": "array", "items": _CE_SCHEMA}
            },
        },
    },
}
_ERROR = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"error": {"type": "string"}, "status": {"type": "integer"}},
            }
        }
    }
}
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Sync: the output events (binary mode for one, batch mode for several)."},
    202: {
        "description": "Async: accepted durably.",
        "content": {"application/json": {"schema": {"type": "object"}}},
    },
    204: {"description": "Sync: the events were filtered out."},
    400: {"description": "Malformed CloudEvent (the attribute is named).", **_ERROR},
    401: {"description": "No or bad credentials.", **_ERROR},
    403: {"description": "Credentials of another pipeline.", **_ERROR},
    404: {"description": "Unknown pipeline or path.", **_ERROR},
    408: {"description": "The body did not arrive within BODY_TIMEOUT_S.", **_ERROR},
    413: {
        "description": "Body over the source's max_body_bytes, or a record over the broker's.",
        **_ERROR,
    },
    422: {"description": "Data fails the source's data_schema, or a step failed (sync).", **_ERROR},
    431: {"description": "Request headers over MAX_HEADER_BYTES in all.", **_ERROR},
    503: {"description": "The broker or the pipeline is unavailable; retry.", **_ERROR},
    504: {"description": "Sync: no answer within the source's timeout_ms.", **_ERROR},
}
