"""AdmissionReview v1 as typed structures, and the strict reading of a request body.

The shapes follow k8s.io/api/admission/v1 (JSON field names). Only what the service reads or
writes is typed; unknown fields are tolerated, as the API server adds fields over time.
"""

from __future__ import annotations

import base64
from typing import Any, Literal, NotRequired, TypedDict

import orjson

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]


class AdmissionRequest(TypedDict):
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    subResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]
    userInfo: NotRequired[UserInfo]
    options: NotRequired[dict[str, Any] | None]


class Status(TypedDict, total=False):
    code: int
    message: str


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]
    status: NotRequired[Status]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: str
    request: NotRequired[AdmissionRequest]
    response: NotRequired[AdmissionResponse]


class MalformedReview(ValueError):
    """The body is not an AdmissionReview v1 request this service can answer (HTTP 400)."""


def parse_review(body: bytes) -> AdmissionRequest:
    """The ``request`` of an AdmissionReview v1 body, or MalformedReview saying what is wrong."""
    try:
        # orjson: a node status review carries the whole Node twice (tens of KB) and arrives
        # every 10 s from every oversold node; parsing it is the largest cost of the review.
        review = orjson.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedReview(f"body is not JSON: {error}") from None
    if not isinstance(review, dict):
        raise MalformedReview("body is not a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != KIND:
        raise MalformedReview(
            f"expected apiVersion {API_VERSION} kind {KIND}, got "
            f"apiVersion {review.get('apiVersion')!r} kind {review.get('kind')!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("review has no request")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise MalformedReview("request has no uid")
    for name in ("kind", "resource"):
        if not isinstance(request.get(name), dict):
            raise MalformedReview(f"request has no {name}")
    if not isinstance(request.get("operation"), str):
        raise MalformedReview("request has no operation")
    for name in ("object", "oldObject"):
        if request.get(name) is not None and not isinstance(request[name], dict):
            raise MalformedReview(f"request.{name} is not an object")
    typed: AdmissionRequest = request  # type: ignore[assignment]  # shape checked above
    return typed


def encode_patch(patch: list[dict[str, Any]]) -> str:
    """A JSON patch as an AdmissionResponse carries it (base64 of the JSON); "" for no change."""
    return base64.b64encode(orjson.dumps(patch)).decode() if patch else ""


def allow(
    uid: str, patch: list[dict[str, Any]] | None = None, warnings: list[str] | None = None, *,
    encoded_patch: str = "",
) -> AdmissionReview:
    """An allowing AdmissionReview response, with a JSON patch when there is something to change
    (``patch``, or one already encoded by :func:`encode_patch`)."""
    response: AdmissionResponse = {"uid": uid, "allowed": True}
    encoded = encode_patch(patch) if patch else encoded_patch
    if encoded:
        response["patchType"] = "JSONPatch"
        response["patch"] = encoded
    if warnings:
        # The API server may truncate warnings over 256 characters and long lists of them.
        response["warnings"] = [w if len(w) <= 256 else w[:253] + "..." for w in warnings[:10]]
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def deny(uid: str, message: str, code: int = 403) -> AdmissionReview:
    """A refusing AdmissionReview response; kubectl shows ``message`` to the person who asked."""
    response: AdmissionResponse = {"uid": uid, "allowed": False, "status": {"code": code, "message": message}}
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}
