"""The OpenAPI 3.1 document of the relay API, served at GET /openapi.json (prose: docs/api.md).

Every request body carries `x-max-body-bytes`, the limit the router enforces for it (413 beyond);
tests/test_node_api.py checks that this document and the router list the same routes and limits.
"""

from __future__ import annotations

from typing import Any

B64 = {"type": "string", "contentEncoding": "base64url", "description": "base64url, padding optional"}
HEX_ID = {"type": "string", "pattern": "^[0-9a-f]{32}$"}


def _problem_ref(*codes: str) -> dict[str, Any]:
    return {
        "description": "problem+json; code one of: " + ", ".join(codes),
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


DEVICE_PARAM = {"name": "device_id", "in": "path", "required": True, "schema": HEX_ID,
                "description": "the device's route id (hex)"}
# 401 also when the device is not homed here: the API never says which relay is a device's home.
AUTH_ERRORS = {"401": _problem_ref("bad_credentials"), "429": _problem_ref("rate_limited")}
BODY_ERRORS = {"400": _problem_ref("malformed_json"), "413": _problem_ref("too_large"),
               "422": _problem_ref("invalid_field")}


def openapi_document(version: str, body_limits: dict[str, int]) -> dict[str, Any]:
    """The whole document; body_limits: 'METHOD /path' -> the router's body limit for that route."""

    def _body(key: str, schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
        return {"required": required, "content": {"application/json": {"schema": schema}},
                "x-max-body-bytes": body_limits[key]}

    endpoint = {"type": "object", "properties": {
        "endpoint_id": HEX_ID, "url": {"type": "string"}, "restricted": {"type": "boolean"},
        "vapid_key": {"type": ["string", "null"]}}}
    hook = {"type": "object", "properties": {"url": {"type": ["string", "null"]},
                                             "created": {"type": ["number", "null"]}}}
    message = {"type": "object", "properties": {"id": HEX_ID, "ciphertext": B64, "received_at": {"type": "number"}}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "INRI relay API",
            "version": version,
            "description": "Register devices, push sealed payloads at any relay, receive them live or by pull. "
            "See docs/api.md.",
        },
        "components": {
            "securitySchemes": {"device": {"type": "http", "scheme": "bearer",
                                           "description": "the device_secret returned at registration"}},
            "schemas": {
                "Problem": {
                    "type": "object",
                    "required": ["type", "title", "status", "code"],
                    "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                                   "status": {"type": "integer"}, "detail": {"type": "string"},
                                   "code": {"type": "string"}, "instance": {"type": "string"}},
                },
            },
        },
        "paths": {
            "/v1/devices": {"post": {
                "summary": "Register a device at this (home) relay",
                "requestBody": _body("POST /v1/devices", {"type": "object", "required": ["registration"],
                                                         "properties": {"registration": B64, "tokens": {
                                                             "type": "integer", "minimum": 1, "maximum": 500},
                                                             "receipt_secret": B64}}),
                "responses": {
                    "201": _json({"type": "object", "properties": {
                        "device_id": HEX_ID, "device_secret": B64, "tokens": {"type": "array", "items": B64},
                        "relay": {"type": "string"}, "expires_at": {"type": "integer"}}}, "registered"),
                    "400": _problem_ref("malformed_json", "bad_registration", "unsupported_version",
                                        "bad_receipt_key"),
                    "409": _problem_ref("already_registered"), "413": _problem_ref("too_large"),
                    "422": _problem_ref("invalid_field"), "429": _problem_ref("rate_limited")}}},
            "/v1/devices/{device_id}/registration": {"post": {
                "summary": "Refresh the registration (a newer epoch under the same route key)",
                "security": [{"device": []}], "parameters": [DEVICE_PARAM],
                "requestBody": _body("POST /v1/devices/{device_id}/registration", {
                    "type": "object", "required": ["registration"],
                    "properties": {"registration": B64, "receipt_secret": B64}}),
                "responses": {"200": _json({"type": "object", "properties": {
                    "device_id": HEX_ID, "epoch": {"type": "integer"}, "expires_at": {"type": "integer"}}}),
                              **BODY_ERRORS, "400": _problem_ref("malformed_json", "bad_registration",
                                                                  "unsupported_version", "bad_receipt_key",
                                                                  "not_newer"),
                              **AUTH_ERRORS}}},
            "/v1/devices/{device_id}/tokens": {"post": {
                "summary": "More one-use tokens", "security": [{"device": []}], "parameters": [DEVICE_PARAM],
                "requestBody": _body("POST /v1/devices/{device_id}/tokens", {"type": "object", "properties": {
                    "count": {"type": "integer", "minimum": 1, "maximum": 500},
                    "tokens": {"type": "array", "items": B64, "minItems": 1, "maxItems": 500}}}, False),
                "responses": {"200": _json({"type": "object", "properties": {
                    "tokens": {"type": "array", "items": B64}}}), **BODY_ERRORS, **AUTH_ERRORS}}},
            "/wp/v1/{reg}/{endpoint}": {"post": {
                "summary": "Web Push (RFC 8030/8291/8292) to a minted endpoint, at any relay",
                "parameters": [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                               for n in ("reg", "endpoint")] + [
                    {"name": h, "in": "header", "required": h == "TTL", "schema": {"type": "string"},
                     **({"description": "seconds; above [webpush] ttl_max_s (28 d by default) clamped, the granted "
                                        "value echoed in the TTL response header"} if h == "TTL" else {})}
                    for h in ("TTL", "Urgency", "Topic", "Content-Encoding", "Authorization", "Encryption",
                              "Crypto-Key")],
                "requestBody": {"required": False, "content": {"application/octet-stream": {
                    "schema": {"type": "string", "format": "binary"}}},
                    "x-max-body-bytes": body_limits["POST /wp/v1/{reg}/{endpoint}"]},
                "responses": {
                    "201": {"description": "accepted; Location and TTL (granted) headers, empty body"},
                    "400": _problem_ref("bad_ttl", "bad_urgency", "bad_topic", "bad_encoding"),
                    "401": _problem_ref("bad_vapid"), "403": _problem_ref("forbidden_key"),
                    "404": _problem_ref("not_found"), "410": _problem_ref("gone"), "413": _problem_ref("too_large"),
                    "429": _problem_ref("rate_limited", "overloaded", "mailbox_full")}}},
            "/_matrix/push/v1/notify": {
                "get": {"summary": "Matrix push gateway discovery (UnifiedPush)",
                        "responses": {"200": _json({"type": "object", "properties": {"unifiedpush": {
                            "type": "object", "properties": {"gateway": {"const": "matrix"}}}}})}},
                "post": {
                    "summary": "Matrix push gateway: each INRI pushkey gets the notification (without devices), "
                    "sealed to its device at this relay",
                    "requestBody": _body("POST /_matrix/push/v1/notify", {"type": "object", "required": [
                        "notification"], "properties": {"notification": {"type": "object"}}}),
                    "responses": {"200": _json({"type": "object", "properties": {"rejected": {
                        "type": "array", "items": {"type": "string"}}}}), **BODY_ERRORS}}},
            "/v1/devices/{device_id}/endpoints": {
                "post": {
                    "summary": "Mint a Web Push endpoint (restricted to one VAPID key when given)",
                    "security": [{"device": []}], "parameters": [DEVICE_PARAM],
                    "requestBody": _body("POST /v1/devices/{device_id}/endpoints", {
                        "type": "object", "properties": {"vapid_key": B64, "seal_key": B64}}, False),
                    "responses": {"201": _json(endpoint, "minted"),
                                  "409": _problem_ref("too_many_endpoints", "receipt_key_required"),
                                  **BODY_ERRORS, **AUTH_ERRORS}},
                "get": {
                    "summary": "The device's live Web Push endpoints", "security": [{"device": []}],
                    "parameters": [DEVICE_PARAM],
                    "responses": {"200": _json({"type": "object", "properties": {
                        "endpoints": {"type": "array", "items": endpoint}}}),
                        "409": _problem_ref("receipt_key_required"), **AUTH_ERRORS}}},
            "/v1/devices/{device_id}/endpoints/{endpoint_id}": {"delete": {
                "summary": "Revoke a Web Push endpoint (senders then get 410)", "security": [{"device": []}],
                "parameters": [DEVICE_PARAM, {"name": "endpoint_id", "in": "path", "required": True,
                                              "schema": HEX_ID}],
                "responses": {"204": {"description": "revoked (also when it already was)"},
                              "422": _problem_ref("invalid_field"), **AUTH_ERRORS}}},
            "/v1/devices/{device_id}/wake": {
                "put": {
                    "summary": "Register or replace the device's wake hook: its app's gateway URL and the device "
                    "token sealed to the gateway (docs/gateway.md)", "security": [{"device": []}],
                    "parameters": [DEVICE_PARAM],
                    "requestBody": _body("PUT /v1/devices/{device_id}/wake", {
                        "type": "object", "required": ["url", "token"],
                        "properties": {"url": {"type": "string", "format": "uri"}, "token": B64}}),
                    "responses": {"200": _json(hook), **BODY_ERRORS,
                                  "422": _problem_ref("invalid_field", "forbidden_hook"), **AUTH_ERRORS}},
                "get": {"summary": "The device's wake hook (url and created null when it has none)",
                        "security": [{"device": []}], "parameters": [DEVICE_PARAM],
                        "responses": {"200": _json(hook), **AUTH_ERRORS}},
                "delete": {"summary": "Remove the device's wake hook", "security": [{"device": []}],
                           "parameters": [DEVICE_PARAM],
                           "responses": {"204": {"description": "removed (also when there was none)"},
                                         **AUTH_ERRORS}}},
            "/v1/devices/{device_id}": {"delete": {
                "summary": "Unregister: delete everything about the device", "security": [{"device": []}],
                "parameters": [DEVICE_PARAM], "responses": {"204": {"description": "deleted"}, **AUTH_ERRORS}}},
            "/v1/devices/{device_id}/messages": {"get": {
                "summary": "Pull unacknowledged messages, oldest first", "security": [{"device": []}],
                "parameters": [DEVICE_PARAM, {"name": "limit", "in": "query",
                                              "schema": {"type": "integer", "minimum": 1, "maximum": 1000,
                                                         "default": 100}}],
                "responses": {"200": _json({"type": "object", "properties": {
                    "messages": {"type": "array", "items": message}}}), "422": _problem_ref("invalid_field"),
                              **AUTH_ERRORS}}},
            "/v1/devices/{device_id}/ack": {"post": {
                "summary": "Acknowledge messages: they are deleted and never sent again",
                "security": [{"device": []}], "parameters": [DEVICE_PARAM],
                "requestBody": _body("POST /v1/devices/{device_id}/ack", {"type": "object", "required": ["ids"],
                                      "properties": {"ids": {"type": "array", "items": HEX_ID, "maxItems": 500}}}),
                "responses": {"200": _json({"type": "object", "properties": {"deleted": {"type": "integer"}}}),
                              **BODY_ERRORS, **AUTH_ERRORS}}},
            "/v1/devices/{device_id}/stream": {"get": {
                "summary": "WebSocket: live delivery (see docs/api.md for the frame protocol)",
                "security": [{"device": []}], "parameters": [DEVICE_PARAM],
                "responses": {"101": {"description": "switching to WebSocket"},
                              "426": _problem_ref("upgrade_required")}}},
            "/v1/stream": {"get": {
                "summary": "WebSocket: one live stream for many devices (subscribe frames carry their secrets; "
                           "see docs/api.md, Multiplexed stream)",
                "responses": {"101": {"description": "switching to WebSocket"},
                              "426": _problem_ref("upgrade_required")}}},
            "/v1/mozpush": {"get": {
                "summary": "WebSocket: the Mozilla Push protocol for Firefox (dom.push.serverURL) and Sunup, "
                           "subprotocol push-notification (docs/browsers.md)",
                "responses": {"101": {"description": "switching to WebSocket"},
                              "426": _problem_ref("upgrade_required")}}},
            "/v1/push": {"post": {
                "summary": "Push a sealed payload with a push credential, at any relay",
                "requestBody": _body("POST /v1/push", {
                    "type": "object", "required": ["registration", "token", "ciphertext"],
                    "properties": {"registration": B64, "token": B64, "ciphertext": B64}}),
                "responses": {
                    "202": _json({"type": "object", "properties": {"push_id": HEX_ID, "status": {"type": "string"}}},
                                 "accepted and durably in custody"),
                    "400": _problem_ref("malformed_json", "bad_registration", "unsupported_version"),
                    "413": _problem_ref("too_large"),
                    "422": _problem_ref("invalid_field"), "429": _problem_ref("rate_limited", "overloaded")}}},
            "/v1/push/batch": {"post": {
                "summary": "Up to 100 pushes in one request, each checked and accepted as POST /v1/push would be",
                "requestBody": _body("POST /v1/push/batch", {
                    "type": "object", "required": ["pushes"],
                    "properties": {"pushes": {"type": "array", "minItems": 1, "maxItems": 100, "items": {
                        "type": "object", "required": ["registration", "token", "ciphertext"],
                        "properties": {"registration": B64, "token": B64, "ciphertext": B64}}}}}),
                "responses": {
                    "200": _json({"type": "object", "properties": {
                        "accepted": {"type": "integer"},
                        "results": {"type": "array", "items": {"oneOf": [
                            {"type": "object", "properties": {"status": {"const": 202}, "push_id": HEX_ID,
                                                              "push_status": {"const": "pending"}}},
                            {"$ref": "#/components/schemas/Problem"}]}}}},
                        "one result per push, in order: 202 (accepted and durably in custody) or the "
                        "problem POST /v1/push would have answered (with retry_after for a 429)"),
                    "400": _problem_ref("malformed_json"), "413": _problem_ref("too_large"),
                    "422": _problem_ref("invalid_field"), "429": _problem_ref("rate_limited")}}},
            "/v1/push/{push_id}": {"get": {
                "summary": "Status of a push accepted by this relay",
                "parameters": [{"name": "push_id", "in": "path", "required": True, "schema": HEX_ID}],
                "responses": {"200": _json({"type": "object", "properties": {
                    "push_id": HEX_ID,
                    "status": {"enum": ["pending", "delivered", "spent", "unknown_token",
                                        "mailbox_full", "expired", "unreachable",
                                        "unknown_endpoint", "gone", "rate_limited", "unknown_registration"]},
                    "hops": {"type": ["integer", "null"]}, "accepted_at": {"type": "number"},
                    "settled_at": {"type": ["number", "null"]}}}), "404": _problem_ref("not_found")}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": _json({"type": "object"})}}},
            "/v1/status": {"get": {"summary": "Neighbours, routes, queues",
                                   "responses": {"200": _json({"type": "object"})}}},
            "/metrics": {"get": {"summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "text/plain; version=0.0.4"}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": _json({"type": "object"})}}},
        },
    }
