"""Fake APNs and FCM servers for the wake-up gateway's tests: HTTP/2 over TLS on loopback, checking what arrives.

Each fake implements its provider's documented contract as a server sees it and *verifies* every
request: the provider token's signature against the configured public key (ES256 for APNs, the RS256
assertion of the OAuth2 JWT-bearer grant for Google), the required headers, the JSON body, and that
the body carries no content (APNs: `aps` with content-available, or the configured alert, nothing
else; FCM: data only, no `notification`). A request that breaks the contract is answered with the
provider's own error and recorded in `errors` (tests assert it stays empty). Answers can be scripted
(`script`) to exercise the error paths.

Rules implemented from Apple's "Sending notification requests to APNs", "Establishing a token-based
connection to APNs" (tokens older than an hour: 403 ExpiredProviderToken; a new token within 20
minutes of the last: 429 TooManyProviderTokenUpdates) and "Handling notification responses from
APNs"; from Google's "FCM HTTP v1 API" (projects.messages.send, ErrorCode) and "Using OAuth 2.0 for
Server to Server Applications".

TLS: a throwaway CA and a certificate for 127.0.0.1 made here with `cryptography`; hypercorn
serves the fake with ALPN h2 (the fakes refuse anything but HTTP/2, as APNs does).
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import trio
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.x509.oid import NameOID
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from inri.common.b64url import b64d, b64e
from inri.common.http import serve_lifespan

# -- TLS ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tls:
    ca: Path  # PEM of the throwaway CA (what clients trust)
    cert: Path  # server certificate for 127.0.0.1 / localhost, signed by the CA
    key: Path


def make_tls(directory: Path) -> Tls:
    """A throwaway CA and a server certificate for 127.0.0.1, ::1 and localhost (valid for a day)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "inri test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1")),
                x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    tls = Tls(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    tls.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return tls


@asynccontextmanager
async def serve_app(app: Any, tls: Tls | None = None) -> AsyncIterator[str]:
    """Serve an ASGI app on 127.0.0.1 (port 0) with hypercorn, over TLS with ALPN h2 when tls is given;
    yields its base URL."""
    hc = HyperConfig()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.errorlog = None
    if tls is not None:
        hc.certfile, hc.keyfile = str(tls.cert), str(tls.key)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(app, hc, shutdown_trigger=stop.wait,
                                                              task_status=task_status))
        try:
            yield binds[0]
        finally:
            stop.set()
            nursery.cancel_scope.deadline = trio.current_time() + 5


class Late:
    """An ASGI app set after the server started (a fake's URL goes into the config its checks read)."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        await self.app(scope, receive, send)


async def _read(receive: Callable[[], Any], limit: int = 1 << 20) -> bytes:
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if len(body) > limit or not msg.get("more_body"):
            return body


async def _answer(send: Callable[[dict[str, Any]], Any], status: int, body: Any = None,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = b"" if body is None else json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json")] if body is not None else []
    await send({"type": "http.response.start", "status": status, "headers": hdrs + (headers or [])})
    await send({"type": "http.response.body", "body": data})


def _jwt(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes]:
    """(header, claims, signing input, signature) of a compact JWS; ValueError when it is not one."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a compact JWS")
    header, claims = (json.loads(b64d(p, "jwt part")) for p in parts[:2])
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise ValueError("JWS parts are not objects")
    return header, claims, f"{parts[0]}.{parts[1]}".encode(), b64d(parts[2], "signature")


# -- keys -------------------------------------------------------------------------------------------------


def write_p8(path: Path) -> ec.EllipticCurvePrivateKey:
    """An APNs auth key file (.p8: PKCS#8 PEM, P-256), as Apple hands it out."""
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return key


def write_service_account(path: Path, token_uri: str, project: str = "inri-test") -> dict[str, str]:
    """A Google service account key file (the fields Google puts in one), its RSA key fresh."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    account = {
        "type": "service_account", "project_id": project, "private_key_id": os.urandom(20).hex(),
        "private_key": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()).decode(),
        "client_email": f"wake@{project}.iam.gserviceaccount.com", "client_id": "1234567890",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": token_uri,
    }
    path.write_text(json.dumps(account))
    return account


# -- APNs ---------------------------------------------------------------------------------------------------

APNS_MIN_REFRESH_S = 20 * 60
APNS_TOKEN_MAX_AGE_S = 3600


@dataclass
class ApnsRequest:
    """One request as the fake APNs received it (after its checks)."""

    device_token: str
    headers: dict[str, str]
    body: dict[str, Any]
    jwt: str
    iat: int
    http_version: str
    at: float  # trio.current_time() at arrival


@dataclass
class FakeApns:
    """APNs as a server sees it (module docstring). script: (status, reason, extra headers) answered in turn."""

    public_key: ec.EllipticCurvePublicKey
    key_id: str
    team_id: str
    topic: str
    clock: Callable[[], float] = time.time
    script: list[tuple[int, str, dict[str, str]]] = field(default_factory=list)
    received: list[ApnsRequest] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)
    _last_token: tuple[str, float] | None = None  # the provider token last accepted, and when it was first seen

    def _refuse(self, why: str) -> None:
        self.errors.append(why)

    def _check_token(self, auth: str) -> tuple[int, str, int]:
        """(status, reason, iat) for the authorization header (status 0: good)."""
        if not auth.startswith("bearer "):
            return 403, "MissingProviderToken", 0
        token = auth[len("bearer "):]
        try:
            header, claims, signing_input, sig = _jwt(token)
            if header != {"alg": "ES256", "kid": self.key_id} or set(claims) != {"iss", "iat"}:
                raise ValueError(f"header {header} / claims {sorted(claims)}")
            if claims["iss"] != self.team_id or type(claims["iat"]) is not int or len(sig) != 64:
                raise ValueError("iss, iat or signature length")
            der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
            self.public_key.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
        except (ValueError, InvalidSignature, KeyError) as exc:
            self._refuse(f"provider token: {exc!r}")
            return 403, "InvalidProviderToken", 0
        now = self.clock()
        if now - claims["iat"] > APNS_TOKEN_MAX_AGE_S:
            return 403, "ExpiredProviderToken", claims["iat"]
        if self._last_token is None or self._last_token[0] != token:
            if self._last_token is not None and now - self._last_token[1] < APNS_MIN_REFRESH_S:
                self._refuse("provider token replaced within 20 minutes")
                return 429, "TooManyProviderTokenUpdates", claims["iat"]
            self._last_token = (token, now)
        return 0, "", claims["iat"]

    def _check_request(self, scope: dict[str, Any], headers: dict[str, str], raw: bytes) -> tuple[int, str, Any]:
        if scope["http_version"] != "2":
            self._refuse(f"HTTP/{scope['http_version']}: APNs speaks HTTP/2 only")
            return 400, "BadPath", None
        if scope["method"] != "POST":
            return 405, "MethodNotAllowed", None
        m = re.fullmatch(r"/3/device/([0-9a-fA-F]+)", scope["path"])
        if m is None:
            self._refuse(f"path {scope['path']!r}")
            return 404, "BadPath", None
        if headers.get("apns-topic") != self.topic:
            self._refuse(f"apns-topic {headers.get('apns-topic')!r}")
            return 400, "BadTopic" if "apns-topic" in headers else "MissingTopic", None
        push_type = headers.get("apns-push-type")
        if push_type not in ("background", "alert"):
            self._refuse(f"apns-push-type {push_type!r}")
            return 400, "InvalidPushType", None
        if headers.get("apns-priority") not in ("5", "10") or (push_type == "background"
                                                                and headers["apns-priority"] != "5"):
            self._refuse(f"apns-priority {headers.get('apns-priority')!r} for {push_type}")
            return 400, "BadPriority", None
        if not headers.get("apns-expiration", "").isdigit():
            self._refuse("apns-expiration")
            return 400, "BadExpirationDate", None
        if "apns-collapse-id" in headers and len(headers["apns-collapse-id"].encode()) > 64:
            return 400, "BadCollapseId", None
        if not raw:
            return 400, "PayloadEmpty", None
        if len(raw) > 4096:
            return 413, "PayloadTooLarge", None
        try:
            body = json.loads(raw)
        except ValueError:
            self._refuse("payload is not JSON")
            return 400, "BadRequest", None
        # No content: `aps` and nothing else; background = content-available alone; alert = a fixed alert.
        aps = body.get("aps") if isinstance(body, dict) else None
        if set(body) != {"aps"} or not isinstance(aps, dict):
            self._refuse(f"payload keys {sorted(body) if isinstance(body, dict) else body!r}: content beside aps")
            return 400, "BadRequest", None
        if push_type == "background" and aps != {"content-available": 1}:
            self._refuse(f"background aps {aps}")
            return 400, "BadRequest", None
        if push_type == "alert" and (not isinstance(aps.get("alert"), dict)
                                     or not set(aps) <= {"alert", "mutable-content", "sound", "content-available"}):
            self._refuse(f"alert aps {aps}")
            return 400, "BadRequest", None
        return 0, m[1], body

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        raw = await _read(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        status, reason, iat = self._check_token(headers.get("authorization", ""))
        if status:
            await _answer(send, status, {"reason": reason})
            return
        status, detail, body = self._check_request(scope, headers, raw)
        if status:
            await _answer(send, status, {"reason": detail})
            return
        self.received.append(ApnsRequest(detail, headers, body, headers["authorization"][7:], iat,
                                         scope["http_version"], trio.current_time()))
        self.arrived.set()
        self.arrived = trio.Event()
        if self.script:
            status, reason, extra = self.script.pop(0)
            if reason == "ExpiredProviderToken":
                self._last_token = None  # Apple asked for a new token: making one now is no excess
            if status != 200:
                await _answer(send, status, {"reason": reason}, [(k.encode(), v.encode()) for k, v in extra.items()])
                return
        await _answer(send, 200, None, [(b"apns-id", b"00000000-0000-0000-0000-000000000000")])

    async def wait_for(self, n: int) -> None:
        """Until n wake-ups have arrived."""
        while len(self.received) < n:
            await self.arrived.wait()


# -- FCM and Google's token endpoint ------------------------------------------------------------------------

FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"


@dataclass
class FcmRequest:
    """One messages:send request as the fake FCM received it."""

    message: dict[str, Any]
    access_token: str
    http_version: str
    at: float


@dataclass
class FakeFcm:
    """Google's OAuth token endpoint (POST /token) and FCM v1 (POST /v1/projects/<p>/messages:send).

    script: (status, errorCode, status text, extra headers, bad-request field or "") answered in turn."""

    account: dict[str, str]
    clock: Callable[[], float] = time.time
    expires_in: int = 3599
    script: list[tuple[int, str, str, dict[str, str], str]] = field(default_factory=list)
    issued: dict[str, float] = field(default_factory=dict)  # access token -> expiry (clock)
    grants: list[dict[str, Any]] = field(default_factory=list)  # verified assertion claims, in order
    received: list[FcmRequest] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        key = serialization.load_pem_private_key(self.account["private_key"].encode(), password=None)
        assert isinstance(key, rsa.RSAPrivateKey)
        self.public_key = key.public_key()

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        raw = await _read(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if scope["path"] == "/token":
            await self._token(scope, headers, raw, send)
        else:
            await self._send(scope, headers, raw, send)

    async def _token(self, scope: dict[str, Any], headers: dict[str, str], raw: bytes, send: Any) -> None:
        form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
        if scope["method"] != "POST" or not headers.get("content-type", "").startswith(
                "application/x-www-form-urlencoded"):
            self.errors.append("token request is not a form POST")
            await _answer(send, 400, {"error": "invalid_request"})
            return
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            self.errors.append(f"grant_type {form.get('grant_type')!r}")
            await _answer(send, 400, {"error": "unsupported_grant_type"})
            return
        try:
            header, claims, signing_input, sig = _jwt(form.get("assertion", ""))
            if header != {"alg": "RS256", "typ": "JWT", "kid": self.account["private_key_id"]}:
                raise ValueError(f"header {header}")
            self.public_key.verify(sig, signing_input, padding.PKCS1v15(), hashes.SHA256())
            now = self.clock()
            if (claims.get("iss") != self.account["client_email"] or claims.get("scope") != FCM_SCOPE
                    or claims.get("aud") != self.account["token_uri"] or type(claims.get("iat")) is not int
                    or type(claims.get("exp")) is not int or not 0 < claims["exp"] - claims["iat"] <= 3600
                    or claims["exp"] < now or claims["iat"] > now + 60):
                raise ValueError(f"claims {claims}")
        except (ValueError, InvalidSignature, KeyError) as exc:
            self.errors.append(f"assertion: {exc!r}")
            await _answer(send, 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
            return
        self.grants.append(claims)
        token = "ya29." + b64e(os.urandom(24))
        self.issued[token] = self.clock() + self.expires_in
        await _answer(send, 200, {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"})

    async def _error(self, send: Any, status: int, code: str, text: str, extra: dict[str, str] | None = None,
                     bad_field: str = "") -> None:
        details: list[dict[str, Any]] = [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                          "errorCode": code}] if code else []
        if bad_field:
            details = [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                        "fieldViolations": [{"field": bad_field, "description": "Invalid value"}]}]
        await _answer(send, status, {"error": {"code": status, "message": text, "status": text or code,
                                               "details": details}},
                      [(k.encode(), v.encode()) for k, v in (extra or {}).items()])

    async def _send(self, scope: dict[str, Any], headers: dict[str, str], raw: bytes, send: Any) -> None:
        if scope["http_version"] != "2":
            self.errors.append(f"HTTP/{scope['http_version']}")
        if scope["method"] != "POST" or scope["path"] != f"/v1/projects/{self.account['project_id']}/messages:send":
            self.errors.append(f"{scope['method']} {scope['path']}")
            await self._error(send, 404, "", "NOT_FOUND")
            return
        auth = headers.get("authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        if token not in self.issued or self.issued[token] <= self.clock():
            await self._error(send, 401, "", "UNAUTHENTICATED")
            return
        try:
            message = json.loads(raw)["message"]
            assert set(json.loads(raw)) == {"message"}
        except (ValueError, KeyError, TypeError, AssertionError):
            self.errors.append("body is not {message: ...}")
            await self._error(send, 400, "", "INVALID_ARGUMENT")
            return
        android = message.get("android", {})
        problems = []
        if "notification" in message or "notification" in android:
            problems.append("a notification (visible content) in a wake-up")
        if not isinstance(message.get("token"), str):
            problems.append("no token")
        data = message.get("data", {})
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            problems.append("data values must be strings")
        if android.get("priority") != "HIGH":
            problems.append(f"android.priority {android.get('priority')!r}")
        if not re.fullmatch(r"\d+s", str(android.get("ttl", "0s"))):
            problems.append("android.ttl")
        if set(message) - {"token", "data", "android", "apns"}:
            problems.append(f"fields {sorted(set(message))}")
        if problems:
            self.errors.extend(problems)
            await self._error(send, 400, "INVALID_ARGUMENT", "INVALID_ARGUMENT")
            return
        self.received.append(FcmRequest(message, token, scope["http_version"], trio.current_time()))
        self.arrived.set()
        self.arrived = trio.Event()
        if self.script:
            status, code, text, extra, bad_field = self.script.pop(0)
            if status != 200:
                await self._error(send, status, code, text, extra, bad_field)
                return
        await _answer(send, 200, {"name": f"projects/{self.account['project_id']}/messages/0:1"})

    async def wait_for(self, n: int) -> None:
        """Until n messages:send requests have passed the checks."""
        while len(self.received) < n:
            await self.arrived.wait()


# -- a gateway configuration over the fakes -----------------------------------------------------------------

APNS_KEY_ID = "ABC123DEFG"
APNS_TEAM_ID = "TEAM123456"
APNS_TOPIC = "org.example.inri-app"


@dataclass
class GatewaySetup:
    """A gateway configuration file and what the fakes need to check its requests."""

    config: Path
    public_key: bytes  # the sealing key's public half (what the app seals device tokens to)
    apns_key: ec.EllipticCurvePrivateKey
    account: dict[str, str]


def write_gateway(directory: Path, tls: Tls, *, apns_url: str | None = None, fcm_url: str | None = None,
                  gateway: str = "", apns: str = "", fcm: str = "") -> GatewaySetup:
    """A gateway config in directory: a fresh sealing key, an APNs .p8 key and a service account whose
    token_uri is fcm_url + "/token"; providers pointed at the fakes, trusting the throwaway CA.
    gateway / apns / fcm: extra TOML lines for that section."""
    from inri.gateway.keys import generate_key

    directory.mkdir(parents=True, exist_ok=True)
    key = generate_key(directory / "gateway.key")
    apns_key = write_p8(directory / "AuthKey.p8")
    account = write_service_account(directory / "service-account.json", (fcm_url or "https://127.0.0.1:1") + "/token")
    text = f'[gateway]\nlisten = "127.0.0.1:0"\nkey_file = "gateway.key"\nlog_format = "json"\n{gateway}\n'
    if apns_url is not None:
        text += (f'[apns]\nkey_file = "AuthKey.p8"\nkey_id = "{APNS_KEY_ID}"\nteam_id = "{APNS_TEAM_ID}"\n'
                 f'topic = "{APNS_TOPIC}"\nbase_url = "{apns_url}"\nca_file = "{tls.ca}"\n{apns}\n')
    if fcm_url is not None:
        text += (f'[fcm]\nservice_account = "service-account.json"\nbase_url = "{fcm_url}"\n'
                 f'ca_file = "{tls.ca}"\n{fcm}\n')
    (directory / "gateway.toml").write_text(text)
    return GatewaySetup(directory / "gateway.toml", bytes(key.public_key), apns_key, account)


@asynccontextmanager
async def running_gateway(config: Path) -> AsyncIterator[str]:
    """`inri gateway` on config, served in this process (run_gateway); yields its URL."""
    from inri.gateway.config import load_gateway_config
    from inri.gateway.server import run_gateway

    async with trio.open_nursery() as nursery:
        shutdown = trio.Event()
        url = await nursery.start(functools.partial(run_gateway, load_gateway_config(config), shutdown=shutdown))
        try:
            yield url
        finally:
            shutdown.set()


def fake_apns(setup: GatewaySetup, **kw: Any) -> FakeApns:
    """A fake APNs that checks requests against this setup's key, key id, team and topic."""
    return FakeApns(setup.apns_key.public_key(), APNS_KEY_ID, APNS_TEAM_ID, APNS_TOPIC, **kw)


@dataclass
class ApnsGateway:
    """An `inri gateway` in this process in front of a fake APNs (apns_gateway)."""

    url: str  # the gateway's base URL (hooks point at url + "/v1/wake")
    setup: GatewaySetup
    apns: FakeApns
    tls: Tls


@asynccontextmanager
async def apns_gateway(directory: Path, *, gateway: str = "") -> AsyncIterator[ApnsGateway]:
    """A fake APNs (HTTP/2 over TLS, a throwaway CA) and an `inri gateway` configured to wake through it.
    gateway: extra TOML lines for the gateway's [gateway] section."""
    tls = make_tls(directory / "tls")
    late = Late()
    async with serve_app(late, tls) as apns_url:
        setup = write_gateway(directory / "gw", tls, apns_url=apns_url, gateway=gateway)
        late.app = fake = fake_apns(setup)
        async with running_gateway(setup.config) as url:
            yield ApnsGateway(url, setup, fake, tls)


def apns_device_token() -> str:
    """A fresh APNs device token (32 bytes, hex, as iOS hands them out)."""
    return os.urandom(32).hex()


def fcm_device_token() -> str:
    """A fresh FCM registration token (instance id, ':', base64url: about 160 characters)."""
    return b64e(os.urandom(8)) + ":APA91b" + b64e(os.urandom(105))
